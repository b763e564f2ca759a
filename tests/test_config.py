"""FASTRING_* environment parsing: defaults from the contract and errors naming the variable."""
import pytest

from fastring._core import config as _config


def test_defaults_match_the_contract():
    c = _config.from_environment({})
    assert (c.fusion_threshold, c.cycle_time_ms, c.algorithm, c.timeline) == (134217728, 1.0, "auto", None)
    assert (c.stall_check_time, c.stall_shutdown_time, c.log_level, c.shm) == (60.0, 0.0, "warning", True)
    assert _config.from_environment({"FASTRING_SHM": "0"}).shm is False


def test_values_are_read():
    c = _config.from_environment({"FASTRING_FUSION_THRESHOLD": "1024", "FASTRING_CYCLE_TIME": "2.5",
                                  "FASTRING_ALGORITHM": "Ring", "FASTRING_TIMELINE": "/tmp/t.json",
                                  "FASTRING_STALL_CHECK_TIME": "3", "FASTRING_STALL_SHUTDOWN_TIME": "9",
                                  "FASTRING_LOG_LEVEL": "debug"})
    assert (c.fusion_threshold, c.cycle_time_ms, c.algorithm, c.timeline) == (1024, 2.5, "ring", "/tmp/t.json")
    assert (c.stall_check_time, c.stall_shutdown_time, c.log_level) == (3.0, 9.0, "debug")


@pytest.mark.parametrize("key, value", [("FASTRING_FUSION_THRESHOLD", "lots"), ("FASTRING_FUSION_THRESHOLD", "-1"),
                                        ("FASTRING_LOG_LEVEL", "loud"),
                                        ("FASTRING_CYCLE_TIME", "fast"), ("FASTRING_SHM", "yes")])
def test_bad_values_name_the_variable(key, value):
    with pytest.raises(ValueError, match=key):
        _config.from_environment({key: value})


def test_unknown_algorithm_names_the_variable_and_the_choices():
    from fastring.algorithms import check_setting

    c = _config.from_environment({"FASTRING_ALGORITHM": "Tree"})
    with pytest.raises(ValueError, match=r"FASTRING_ALGORITHM='tree' is not one of auto, shm, mpi, recursive_doubling, ring"):
        check_setting(c.algorithm)
