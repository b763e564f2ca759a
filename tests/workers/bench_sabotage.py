"""fastring-bench with an allreduce that corrupts one element on rank 1 in every call: --check
must count each corruption and main() must return 1. usage: bench_sabotage.py BENCH-ARGS..."""
import sys

import fastring
from fastring.tools import bench

real_allreduce = fastring.allreduce


def corrupted_allreduce(*args, **kwargs):
    out = real_allreduce(*args, **kwargs)
    if fastring.rank() == 1:
        out.reshape(-1)[0] += 1
    return out


fastring.allreduce = corrupted_allreduce
sys.exit(bench.main(sys.argv[1:]))
