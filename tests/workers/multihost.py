"""Everything that must hold across hosts, in one launch under `fastring-run --sim-hosts H`:
the topology, every collective (allreduce and allgather by the hierarchy and its per-host
shared segment where there is one, fused and alone, in place and not; the same
through MPI within the host where no segment is mapped), compression, mismatch errors, then
the stall inspector (last: it leaves the engine broken). Each rank prints its pid, under which
a host's first rank names its segment (the test checks /dev/shm keeps none).
usage: multihost.py H   (with FASTRING_STALL_CHECK_TIME=1, FASTRING_STALL_SHUTDOWN_TIME=3)"""
import os
import sys
import time

import numpy as np

import _common as c
import fastring
from fastring import Compression
from fastring._core.dtypes import spec_of
from fastring._core.runtime import runtime
from fastring.algorithms import choose, hierarchical

HOSTS = int(sys.argv[1])
N, R = c.SIZE, c.RANK
L = N // HOSTS
fastring.init()
rt = runtime()
print(f"rank {R} pid {os.getpid()}", flush=True)

# --- topology: ranks are placed host by host
got = (fastring.local_rank(), fastring.local_size(), fastring.cross_rank(), fastring.cross_size())
c.CHECKS.check(got == (R % L, L, R // L, HOSTS), f"topology (local rank, local size, cross rank, cross size) "
                                                 f"{got}, expected {(R % L, L, R // L, HOSTS)}")
c.CHECKS.check((rt.hierarchy is not None) == (L > 1 and HOSTS > 1), f"hierarchy {rt.hierarchy} with {L} per host")
c.CHECKS.check(not rt.transport.single_copy, "broadcasts copy memory across simulated hosts")
c.CHECKS.check((rt.host_shm is not None) == (rt.hierarchy is not None), f"host segment {rt.host_shm}")
LARGE = 300_001  # past SMALL_MESSAGE_BYTES in every dtype below: the hierarchy's size
expected_algorithm = "hierarchical" if rt.hierarchy is not None else "ring"
for wire in (None, "fp16"):
    name = choose("allreduce", 4 * LARGE, spec_of("float32"), wire=wire, rt=rt, setting="auto").name
    if wire is None or rt.hierarchy is not None:
        c.CHECKS.check(name == expected_algorithm, f"large allreduce (wire {wire}) runs {name}, not {expected_algorithm}")

# --- allreduce: every op, integer and float dtypes, small (in the cycle) and large, in place too
for dt in (np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float64), c.BF16, np.dtype(np.uint8)):
    for op in (fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product):
        for length in (7, LARGE):
            inputs = [c.rank_input(dt, length, r, 31) for r in range(N)]
            expected, bound = c.reference(inputs, op, N)
            tag = f"allreduce {dt} {op.name} n={length}"
            c.check_close(tag, fastring.allreduce(inputs[R], op=op, name=tag), expected, bound)
            inplace = inputs[R].copy()
            fastring.allreduce(inplace, op=op, name=tag + " in place", out=inplace)
            c.check_close(tag + " in place", inplace, expected, bound)
            c.check_identical(tag, inplace)

# past HIERARCHY_SLICE_BYTES: the host segment's work on the next and previous slices runs
# beside the current slice's cross-host ring (uneven last slice; from an input and in place)
for dt, length, op in ((np.dtype(np.int32), 5_000_003, fastring.Sum), (np.dtype(np.int64), 2_500_007, fastring.Min)):
    inputs = [c.rank_input(dt, length, r, 33) for r in range(N)]
    expected, _ = c.reference(inputs, op, N)
    tag = f"sliced allreduce {dt} {op.name}"
    c.check_close(tag, fastring.allreduce(inputs[R], op=op, name=tag), expected, 0)
    fastring.allreduce(inputs[R], op=op, name=tag + " in place", out=inputs[R])
    c.check_close(tag + " in place", inputs[R], expected, 0)

# fused: many tensors in flight at once share the fusion buffer (and its hierarchical run)
inputs = [[c.rank_input(np.dtype(np.float32), 40_000 + k, r, 40 + k) for k in range(8)] for r in range(N)]
handles = [fastring.allreduce_async(inputs[R][k], op=fastring.Sum, name=f"fused {k}") for k in range(8)]
for k, h in enumerate(handles):
    expected, bound = c.reference([inputs[r][k] for r in range(N)], fastring.Sum, N)
    c.check_close(f"fused {k}", fastring.synchronize(h), expected, bound)

# --- compression: the documented bound (tests/workers/compression.py), identical bits everywhere
U = {"fp16": 2.0 ** -11, "bf16": 2.0 ** -8}
for comp in (Compression.fp16, Compression.bf16):
    for op, pre, post in ((fastring.Average, 1.0, 1.0), (fastring.Sum, 0.5, 4.0)):
        inputs = [(np.random.default_rng([7, r]).standard_normal(LARGE) * 100).astype(np.float32) for r in range(N)]
        tag = f"{comp} {op.name} pre={pre} post={post}"
        got = fastring.allreduce(inputs[R], op=op, compression=comp, prescale_factor=pre, postscale_factor=post)
        stack = np.stack([x.astype(np.float64) * pre for x in inputs])
        exact = (stack.sum(0) / (N if op == fastring.Average else 1)) * post
        scale = pre / N if op == fastring.Average else pre
        limit = (N * U[comp.wire] * np.sum(np.abs(stack), axis=0) * scale / pre + N * 2.0 ** -25) * post
        c.check_close(tag, got, exact, limit)
        c.check_identical(tag, got)

# --- the other collectives
HIER = rt.host_shm is not None  # then allgathers past 64 KiB take the hierarchy


def check_allgather_and_broadcast(tag: str, hierarchical_expected: bool) -> None:
    """allgather of uneven int64 rows (rank 1 gives none), small and past the hierarchy's
    threshold, and broadcasts of odd byte counts (up to 10 MB) from the first and the last
    rank: exact."""
    for scale in (1, 3000):
        rows = [0 if r == 1 else scale * (r + 1) for r in range(N)]
        nbytes = sum(rows) * 3 * 8
        c.CHECKS.check(hierarchical.allgather_pays(rt, nbytes) == (hierarchical_expected and scale > 1),
                       f"{tag}: allgather of {nbytes} bytes takes the hierarchy: {hierarchical.allgather_pays(rt, nbytes)}")
        mine = (np.arange(rows[R] * 3, dtype=np.int64).reshape(-1, 3) + 1000 * R)
        got = fastring.allgather(mine, name=f"{tag} allgather {scale}")
        c.check_close(f"{tag} allgather {scale}", got,
                      np.concatenate([np.arange(rows[r] * 3, dtype=np.int64).reshape(-1, 3) + 1000 * r
                                      for r in range(N)]), 0)
    for root in sorted({0, N - 1}):
        for dt, length in ((np.dtype(np.int16), 100_003), (np.dtype(np.float32), 200_003), (np.dtype(np.int32), 2_500_003)):
            data = c.rank_input(dt, length, root, 50)
            got = fastring.broadcast(data if R == root else np.zeros_like(data), root_rank=root,
                                     name=f"{tag} broadcast {root} {dt}")
            c.check_close(f"{tag} broadcast {dt} from {root}", got, data, 0)


check_allgather_and_broadcast("with segment", HIER)
got = fastring.alltoall(np.arange(N * 2, dtype=np.int32) + 100 * R, name="alltoall")
c.check_close("alltoall", got, np.concatenate([np.arange(2 * R, 2 * R + 2, dtype=np.int32) + 100 * r
                                                for r in range(N)]), 0)
inputs = [c.rank_input(np.dtype(np.int64), (2 * N + 1, 2), r, 60) for r in range(N)]
got = fastring.reducescatter(inputs[R], op=fastring.Sum, name="reducescatter")
full = np.add.reduce(np.stack(inputs))
lo = sum(len(a) for a in np.array_split(full, N)[:R])
c.check_close("reducescatter", got, full[lo:lo + len(np.array_split(full, N)[R])], 0)
fastring.barrier()

# --- restarting keeps the layout; any forced algorithm turns the hierarchy off; without
# the host's segment (FASTRING_SHM=0: as if it could not be mapped) the hierarchical
# allreduce moves its host phases through MPI, and the allgather stays flat
# ("first host": only the first host's ranks have FASTRING_SHM=0, as if only that host could not
# map a segment: every host must then go without, or the hosts' cross rings would not pair)
for setting, shm in (("ring", "1"), ("auto", "0"), ("auto", "first host"), ("auto", "1")):
    os.environ["FASTRING_SHM"] = "0" if shm == "0" or (shm == "first host" and R < L) else "1"
    c.reinit(setting)
    rt = runtime()
    want = "ring" if setting == "ring" else expected_algorithm
    name = choose("allreduce", 4 * LARGE, spec_of("float32"), rt=rt, setting=setting).name
    c.CHECKS.check(name == want, f"after init under {setting}: {name}, expected {want}")
    c.CHECKS.check((rt.host_shm is not None) == (HIER and shm == "1"), f"FASTRING_SHM={shm}: segment {rt.host_shm}")
    inputs = [c.rank_input(np.dtype(np.float32), LARGE, r, 70) for r in range(N)]
    expected, bound = c.reference(inputs, fastring.Average, N)
    c.check_close(f"allreduce after init under {setting}", fastring.allreduce(inputs[R]), expected, bound)
    inputs = [c.rank_input(np.dtype(np.int32), LARGE, r, 71) for r in range(N)]
    exact = fastring.allreduce(inputs[R], op=fastring.Sum, name=f"int sum {setting} {shm}")
    c.check_close(f"int32 sum under {setting}, FASTRING_SHM={shm}", exact, np.add.reduce(np.stack(inputs)), 0)
    if setting == "auto" and shm != "1":
        check_allgather_and_broadcast(f"without segment ({shm})", False)

# --- a mismatch across hosts: every rank raises the error that names the field and ranks
try:
    fastring.allreduce(np.ones(4 if R == 0 else 5, np.float32), name="mismatched")
    c.CHECKS.fail("no error for mismatched shapes")
except fastring.FastringError as e:
    c.CHECKS.check("shape differs" in str(e) and "rank 0: (4,)" in str(e), f"mismatch error: {e}")
c.done(f"multihost on {HOSTS} hosts")

# --- the stall inspector: the last rank never submits; the others fail naming it in time
start = time.monotonic()
if R != N - 1:
    try:
        fastring.allreduce(np.ones(LARGE, np.float32), name="lonely")
        c.fail("no FastringError for a stalled allreduce")
    except fastring.FastringError as e:
        waited = time.monotonic() - start
        if "rank " not in str(e) or not 2.5 <= waited < 30:
            c.fail(f"stall error after {waited:.1f} s: {e}")
        print(f"rank {R} stalled after {waited:.1f}s: {e}", flush=True)
else:
    time.sleep(6)
c.COMM.Barrier()  # leave together, skipping MPI_Finalize: the abandoned cycle is outstanding
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
