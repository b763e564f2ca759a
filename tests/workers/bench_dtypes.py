"""fastring-bench --check --vs-mpi over every dtype and collective, in one launch: each
bench.main() must return 0. (bfloat16 without --vs-mpi: MPI cannot reduce it.)"""
import sys

import _common as c
from fastring.tools import bench

failed = []
for dtype in bench.DTYPES:
    argv = ["--op", "all", "--dtype", dtype, "--min-bytes", "1K", "--max-bytes", "2K", "--iters", "2",
            "--warmup", "0", "--check", "--no-progress"] + (["--vs-mpi"] if dtype != "bfloat16" else [])
    if bench.main(argv) != 0:
        failed.append(dtype)
if failed:
    c.fail(f"fastring-bench found wrong results for {failed}")
c.done("bench_dtypes")
sys.exit(0)
