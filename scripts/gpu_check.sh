#!/usr/bin/env bash
# The GPU check of issue 6, for a machine with one NVIDIA GPU and no network:
#   1. each CUDA kernel's bandwidth against a copy kernel's, same launch shape, same run;
#   2. a 1- and a 2-rank allreduce of device arrays (both ranks on the one GPU) against the
#      host path;
#   3. the CUDA tests for real (no simulator): kernels, device allreduce, torch.cuda/CuPy.
# Without a GPU it says so, runs the CPU-side parts (the same measuring code on a few KiB in
# Numba's simulator, which checks the plumbing and the results) and exits 0.
#
# usage: scripts/gpu_check.sh [--quick]     (PYTHON=... selects the interpreter)
#   --quick: 64 MiB operands and messages instead of 256 MiB
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
MPIEXEC="$("$PY" -c 'import os, sys; print(os.path.join(os.path.dirname(sys.executable), "mpiexec"))')"
MIB=256
[[ "${1:-}" == "--quick" ]] && MIB=64
status=0

step() { printf '\n== %s\n' "$*"; }
run() {  # run a part; remember a failure, keep going
    "$@" || { echo "!! failed (exit $?): $*"; status=1; }
}

step "GPU"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
fi
if env -u NUMBA_ENABLE_CUDASIM "$PY" scripts/gpu_check.py detect; then
    step "kernel bandwidth vs copy kernel bandwidth"
    run env -u NUMBA_ENABLE_CUDASIM "$PY" scripts/gpu_check.py kernels --mib "$MIB"
    # One rank: fastring's own cost per call. Two ranks on one GPU also wait for the GPU's
    # time slices between the two processes' contexts.
    for n in 1 2; do
        step "$n-rank allreduce of device arrays on the one GPU"
        run env -u NUMBA_ENABLE_CUDASIM "$MPIEXEC" -n $n "$PY" scripts/gpu_check.py allreduce --max-mib "$MIB"
    done
    # Last, so that a lease that runs out during the slowest part keeps the figures; a test
    # stops at 150 s (every kernel is compiled anew in each rank: no cache across processes).
    step "CUDA tests on the GPU (no simulator)"
    run env -u NUMBA_ENABLE_CUDASIM "$PY" -m pytest -q -m "cuda or gpu" --timeout 150 \
        --durations 8 tests/test_kernels_cuda.py tests/test_device.py
    step "done: $([[ $status == 0 ]] && echo 'all parts passed' || echo 'SOME PARTS FAILED')"
    exit $status
fi

echo "NO NVIDIA GPU FOUND: the CUDA tests, the kernel bandwidths and the device allreduce"
echo "cannot be measured here. Running the CPU-side parts in Numba's simulator instead"
echo "(timings below are meaningless; only the results and the plumbing are checked)."
step "kernel bandwidth code, simulator"
run env NUMBA_ENABLE_CUDASIM=1 "$PY" scripts/gpu_check.py kernels --tiny
step "2-rank device allreduce code, simulator"
run env NUMBA_ENABLE_CUDASIM=1 "$MPIEXEC" -n 2 "$PY" scripts/gpu_check.py allreduce --tiny
step "done: no GPU; CPU-side parts $([[ $status == 0 ]] && echo 'passed' || echo 'FAILED')"
exit $status
