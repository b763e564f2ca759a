#!/usr/bin/env bash
# scripts/gpu_check.sh on a borrowed GPU machine that cannot reach a package registry but has
# the CUDA Python stack (numba-cuda, PyTorch, CuPy) in its python3: a virtual environment over
# that python3 (its packages visible) gets the MPI stack and build tools from wheels carried
# along, fastring is built in place, and the check (or another command) runs with that
# environment's python and mpiexec first on the PATH.
#
# usage: scripts/gpu_lease.sh WHEEL_DIR [COMMAND ...]    (default: bash scripts/gpu_check.sh)
#   e.g.  scripts/gpu_lease.sh .whl bash scripts/gpu_check.sh --quick
#         scripts/gpu_lease.sh .whl python scripts/gpu_check.py kernels --mib 256
#   WHEEL_DIR holds, for the machine's Python, the wheels of mpich, mpi4py, setuptools>=77 and
#   Cython>=3 (pip download --only-binary=:all: --python-version ... -d WHEEL_DIR ...).
set -euo pipefail
cd "$(dirname "$0")/.."
wheels="$1"; shift
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
# python3 may itself be a virtual environment, whose packages --system-site-packages would not
# reach (it means the base interpreter's): name its package folders after the new ones instead.
python3 -c 'import site; print("\n".join(site.getsitepackages()))' \
    > "$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/outer.pth"
"$venv/bin/python" -m pip install -q --no-index --no-deps --no-compile "$wheels"/*.whl
# In place, not `pip install -e`: the extensions compile in parallel, and the one package
# that setuptools maps from another folder (fastring.kernels <- kernels/) gets a link.
"$venv/bin/python" setup.py -q build_ext --inplace -j "$(nproc)"
[[ -e fastring/kernels ]] || ln -s ../kernels fastring/kernels
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
found = []
for name in ("numpy", "numba", "numba-cuda", "mpi4py", "mpich", "torch", "cupy-cuda13x"):
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print("python packages:", ", ".join(found))
EOF
export PATH="$venv/bin:$PATH" PYTHON="$venv/bin/python"
[[ $# -gt 0 ]] || set -- bash scripts/gpu_check.sh
"$@"
