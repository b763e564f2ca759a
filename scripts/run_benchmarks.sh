#!/bin/bash
# Every measurement BENCHMARKS.md quotes, one after another (run it with nothing else on the
# machine), into the folder given (default ./bench): the fastring-bench tables as .txt and
# .json, and each script's table as .txt. Then:
#   python scripts/benchmarks_md.py bench/inplace.json bench/sweep.json bench/collectives.json \
#       -o generated.md --png benchmarks.png
# usage: bash scripts/run_benchmarks.sh [folder]
set -eu
out=${1:-bench}
mkdir -p "$out"
date -u > "$out/start.txt"
git rev-parse --short HEAD >> "$out/start.txt" 2>/dev/null || true
( time fastring-run -np 2 fastring-bench --min-bytes 4K --max-bytes 256M --check --vs-mpi \
    --json "$out/sweep.json" ) > "$out/sweep.txt" 2> "$out/sweep.err"
fastring-run -np 2 fastring-bench --op allreduce --in-place --min-bytes 4K --max-bytes 256M \
    --factor 4 --check --vs-mpi --json "$out/inplace.json" > "$out/inplace.txt" 2>&1
fastring-run -np 2 fastring-bench --op allgather,broadcast,alltoall,reducescatter --min-bytes 64K \
    --max-bytes 16M --factor 16 --check --vs-mpi --json "$out/collectives.json" > "$out/collectives.txt" 2>&1
fastring-run -np 2 python scripts/bench_broadcast_floor.py > "$out/bfloor.txt" 2>&1
fastring-run -np 2 python scripts/bench_engine.py > "$out/engine.txt" 2>&1
fastring-run -np 2 python scripts/bench_compression.py > "$out/compression.txt" 2>&1
fastring-run -np 2 python scripts/bench_ddp.py > "$out/ddp.txt" 2>&1
fastring-run -np 2 python scripts/bench_ddp.py --model embedding --reuse-memory --batch-size 4 --steps 10 \
    --rounds 3 --warmup 3 --floors > "$out/ddp_embedding.txt" 2>&1
for i in 1 2 3 4 5; do  # issue 18's figures: the minimum over five launches
    fastring-run -np 2 python scripts/bench_shm.py --json "$out/shm$i.json" > "$out/shm$i.txt" 2>&1
done
python scripts/bench_shm.py --summarize "$out"/shm?.json > "$out/shm.md"
fastring-run -np 2 python scripts/bench_ways.py > "$out/ways.txt" 2>&1
date -u > "$out/end.txt"
