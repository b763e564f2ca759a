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
                                        ("FASTRING_CYCLE_TIME", "fast"), ("FASTRING_CYCLE_TIME", "nan"),
                                        ("FASTRING_STALL_CHECK_TIME", "inf"), ("FASTRING_SHM", "yes")])
def test_bad_values_name_the_variable(key, value):
    with pytest.raises(ValueError, match=key):
        _config.from_environment({key: value})


def test_unknown_algorithm_names_the_variable_and_the_choices():
    from fastring.algorithms import check_setting

    c = _config.from_environment({"FASTRING_ALGORITHM": "Tree"})
    with pytest.raises(ValueError, match=r"FASTRING_ALGORITHM='tree' is not one of auto, shm, mpi, recursive_doubling, ring"):
        check_setting(c.algorithm)


def test_settings_that_differ_between_ranks_fail_init_on_every_rank(mpirun):
    """FASTRING_ALGORITHM, FASTRING_SHM and FASTRING_FUSION_THRESHOLD that differ (or are
    invalid on one rank) used to pair messages of different algorithms and hang, or leave
    ranks waiting in init; now init fails on every rank at once, naming the variable and the
    ranks, and an init with agreeing settings works afterwards."""
    proc = mpirun(3, "config_agreement")
    assert "OK config agreement on 3 ranks" in proc.stdout, proc.stdout
