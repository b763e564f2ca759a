"""fastring.jax: the multi-rank suite (tests/workers/jax_collectives.py) at 1, 2 and 3 ranks, the
training example under fastring-run, the FFI handler's C declarations against the installed
jaxlib's header, and the doctests. JAX comes with the `test` extra, so nothing here skips."""
import re
import shlex
import subprocess
import sysconfig

import pytest

from conftest import EXAMPLES, check_doctests, run_script
import fastring.jax as fj
from fastring.jax import _route, _xla_ffi, collectives, training

@pytest.mark.parametrize("n", [1, 2, 3])
def test_collectives_eager_jit_gradients_and_errors(mpirun, n):
    proc = mpirun(n, "jax_collectives")
    assert f"OK jax collectives on {n} ranks" in proc.stdout


def test_example_trains_with_a_jitted_step_and_ends_with_identical_replicas():
    proc = run_script(EXAMPLES / "jax_train.py", "--epochs", 4, "--steps", 15)
    losses = [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", proc.stdout)]
    assert len(losses) == 4, proc.stdout
    assert losses[-1] < 0.8 * losses[0], proc.stdout  # it learns
    assert "replicas identical on all 2 ranks: True" in proc.stdout


def test_ffi_declarations_match_the_installed_jaxlib_header(tmp_path):
    """Every offset, struct size and enum value the handler was compiled with (from
    fastring/jax/xla_ffi.h) equals what the same C expression gives against jaxlib's own
    xla/ffi/api/c_api.h; the API version it reports has jaxlib's major and a minor no newer."""
    import jax.ffi

    layout = _xla_ffi.layout()
    version = {key: layout.pop(key) for key in ("FASTRING_FFI_API_MAJOR", "FASTRING_FFI_API_MINOR")}
    assert len(layout) > 50
    probe = tmp_path / "probe.c"
    probe.write_text("\n".join([
        "#include <stdio.h>", "#include <stddef.h>", '#include "xla/ffi/api/c_api.h"',
        "#define FASTRING_FFI_SIZE_TO XLA_FFI_STRUCT_SIZE",  # the same definition under its own name
        "int main(void) {",
        '  printf("%d %d\\n", XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);',
        *[f'  printf("%lld\\n", (long long)({expr}));' for expr in layout],
        "  return 0;", "}"]))
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    built = subprocess.run([*cc, "-I", jax.ffi.include_dir(), str(probe), "-o", str(tmp_path / "probe")],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr  # a name xla_ffi.h declares that jaxlib's header lacks
    lines = subprocess.run([str(tmp_path / "probe")], check=True, capture_output=True, text=True).stdout.split("\n")
    major, minor = map(int, lines[0].split())
    assert version["FASTRING_FFI_API_MAJOR"] == major and version["FASTRING_FFI_API_MINOR"] <= minor
    jaxlib = dict(zip(layout, map(int, lines[1:])))
    assert jaxlib == layout


def test_doctests():
    fj.init()
    check_doctests((fj, collectives, training, _route, _xla_ffi), more_than=20)
