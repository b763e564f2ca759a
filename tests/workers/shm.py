"""The one-host shared-memory path (fastring/_transport/shm.pyx, fastring/algorithms/shm.py).
usage: shm.py check | kill | raise | quick

check: the segment is mapped and already unlinked; every dtype x op through it, one step and
    large (by single copy: chunks claimed by whichever rank is free, uneven last chunk),
    Average and the postscale, out= into another array with the input left alone, fusion of
    async requests, grouped allreduce, compression, the negotiation cycle through it; the
    other collectives' loops by single copy; streamed broadcasts and single-copy broadcasts
    through the segment (a failed copy sent again); allgather and alltoall
    streamed through the rings, back to back with broadcasts; large reducescatters through
    the segment and by the ring (its result lying as its input); copies by streaming stores,
    and allgather and alltoall writing their outputs with them, streamed, by single copy and
    in rounds; a single copy that fails (a rank publishes an
    address that is not mapped) raises on every rank and turns single copy off, after which
    the same large calls go in rounds through the segment's buffers; then FASTRING_SHM=0 falls
    back (and says why at debug level) and a second init maps a fresh segment. The single-copy
    allreduce bit for bit in rank order on data that rounds, and one whose copies the kernel
    refuses (a seccomp filter): an error on every rank.
kill: rank V (the last) SIGKILLs itself while the ranks loop over 16 MiB allreduces.
raise: rank V raises instead of calling the allreduce the others call.
quick: one allreduce through the segment, checked.
Every rank prints `rank R pid P` first, so the test can look for the launch's segment name
(/dev/shm/fastring-<rank 0's pid>-...)."""
import ctypes
import errno
import io
import logging
import os
import platform
import signal
import sys
import threading

import numpy as np

import _common as c
import fastring
from fastring._core.config import (COPY_PHASE_BYTES, SHM_CYCLE_STREAMING_BYTES, SHM_ONE_STEP_BYTES, SHM_PIECES_ROUND_BYTES,
                                   SHM_PIPELINE_TILE_BYTES, SHM_SINGLE_COPY_CHUNK_BYTES, SHM_STREAM_EXCHANGE_MAX_BYTES,
                                   SHM_STREAM_LARGE_PIECE_BYTES, SHM_STREAM_PIECE_BYTES, SHM_STREAM_RESTART_BYTES,
                                   SHM_STREAMING_STORE_BYTES, SHM_STORE_WAYS, SHM_TILE_BYTES, SHM_TIMED_CHOICE_MIN_BYTES)
from fastring._core.runtime import runtime
from fastring._transport import CYCLE_HEADER_WORDS, SPECULATION_FAILED, array_address
from fastring._transport.shm import copy_streaming
from fastring import kernels
from fastring.algorithms import collectives
from fastring.algorithms.shm import SharedMemory
from fastring.api import collectives as api_collectives
from fastring.engine.engine import Engine
from fastring._core.ops import KERNEL_OP

case = sys.argv[1]
log = io.StringIO()
logging.getLogger("fastring").addHandler(logging.StreamHandler(log))
os.environ["FASTRING_LOG_LEVEL"] = "debug"
fastring.init()
N, R = c.SIZE, c.RANK
V = N - 1
pid0 = c.COMM.bcast(os.getpid(), root=0)
print(f"rank {R} pid {os.getpid()}", flush=True)
OPS = [fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product]


def refuse_cross_memory_copies() -> None:
    """From now on this thread's process_vm_readv/writev fail with EPERM (a seccomp filter, as a
    container's policy might install; it cannot be removed)."""
    numbers = {"x86_64": (0xC000003E, 310, 311), "aarch64": (0xC00000B7, 270, 271)}[platform.machine()]
    arch, readv, writev = numbers
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM
    # (code, jump if true, jump if false, k): load the arch, then the syscall number
    program = [(0x20, 0, 0, 4), (0x15, 0, 3, arch), (0x20, 0, 0, 0), (0x15, 2, 0, readv),
               (0x15, 1, 0, writev), (0x06, 0, 0, allow), (0x06, 0, 0, refuse)]
    filters = (ctypes.c_uint64 * len(program))(*(code | jt << 16 | jf << 24 | k << 32 for code, jt, jf, k in program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    libc = ctypes.CDLL(None, use_errno=True)
    prog = Program(len(program), ctypes.addressof(filters))
    if libc.prctl(38, 1, 0, 0, 0) or libc.prctl(22, 2, ctypes.byref(prog), 0, 0):  # NO_NEW_PRIVS, SECCOMP
        raise OSError(ctypes.get_errno(), "seccomp filter")


def leftovers() -> list[str]:
    return [f for f in os.listdir("/dev/shm") if f.startswith(f"fastring-{pid0}-")]


if case == "kill":
    big = np.ones((16 << 20) // 4, np.float32)
    fastring.allreduce(big, name="big", out=big)
    if R == V:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for i in range(1000):
        fastring.allreduce(big, name="big", out=big)
    sys.exit(0)
if case == "raise":
    fastring.allreduce(np.ones(2), name="warmup")
    if R == V:
        raise ValueError(f"rank {R} failed on purpose")
    try:
        fastring.allreduce(np.ones(SHM_TILE_BYTES // 8), name="never")
    except fastring.FastringError as e:
        print(f"rank {R}: FastringError: {e}", flush=True)
    sys.exit(0)

if case == "quick":
    got = fastring.allreduce(np.full(SHM_TILE_BYTES // 4, R + 1.0), op=fastring.Sum)
    c.check_close("quick", got, np.full(SHM_TILE_BYTES // 4, N * (N + 1) / 2), 0)
    c.CHECKS.check(runtime().shm is not None and not leftovers(), "no fresh segment")
    c.done("shm quick")
    sys.exit(0)

rt = runtime()
c.CHECKS.check(rt.shm is not None, f"the shared-memory path is off: {log.getvalue()}")
c.CHECKS.check(not leftovers(), f"the segment is still linked in /dev/shm: {leftovers()}")
c.CHECKS.check(rt.engine._neg._cycle_exchange == rt.shm.cycle_exchange, "the cycle does not run through the segment")
c.CHECKS.check(rt.engine._neg._lone_cycle == rt.shm.lone_cycle, "the lone cycle does not run through the segment")
c.CHECKS.check(rt.transport.single_copy, "single copy is off on one host")


def lone_cycles(cycles, tag):
    """`lone_cycle` (the lean path's one call) on `cycles` (the segment or the MPI transport):
    the exact sum lands in `dst` only when every rank proposed the same request and nothing
    else waits anywhere; otherwise `dst` is untouched, and where the ranks agreed on the
    request, the sum is in the block's payload; bad arrays are refused before anything moves,
    so the ranks stay in step."""
    words, capacity, count = 1, 4096, 1000
    block = np.zeros(CYCLE_HEADER_WORDS + 2 * words + capacity // 8, np.uint64)
    tmp = np.zeros_like(block)
    fn = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], np.dtype(np.int32))
    src = np.arange(count, dtype=np.int32) * (R + 1) - 3
    expected = np.arange(count, dtype=np.int32) * (N * (N + 1) // 2) - 3 * N

    def run(h, dst, data=src, pending=0):
        block[:] = 0
        block[CYCLE_HEADER_WORDS + words] = pending  # this rank's pending bit 0
        return cycles.lone_cycle(array_address(block), words, capacity, array_address(tmp), fn, 4, 0.0, None,
                                 h, data, dst)

    dst = np.full(count, -7, np.int32)
    outcome, clean = run(123, dst)
    c.CHECKS.check(clean and outcome == (0, 123, False, False), f"lone {tag}: {outcome} {clean}")
    c.check_close(f"lone {tag}", dst, expected, 0)
    c.check_close(f"lone {tag} input", src, np.arange(count, dtype=np.int32) * (R + 1) - 3, 0)
    for what, h, pending in (("another request on the last rank", 123 + (R == V), 0),
                             ("a request pending on rank 0 only", 5, int(R == 0))):
        dst[:] = -7
        outcome, clean = run(h, dst, pending=pending)
        c.CHECKS.check(not clean, f"lone {tag}, {what}: clean {outcome}")
        c.CHECKS.check(bool(outcome[1] == SPECULATION_FAILED) == (pending == 0 and h != 5) and bool(outcome[2]) == (h == 5),
                       f"lone {tag}, {what}: outcome {outcome}")
        c.check_close(f"lone {tag}, {what}: dst untouched", dst, np.full(count, -7, np.int32), 0)
        if h == 5:  # agreed but not clean: the sum waits in the block's payload, for the cycle's request
            c.check_close(f"lone {tag}, {what}: the block's payload",
                          block[CYCLE_HEADER_WORDS + 2 * words:].view(np.int32)[:count], expected, 0)
    outcome, clean = run(9, None)  # the result stays in the block's payload
    c.CHECKS.check(clean, f"lone {tag} without dst: {outcome}")
    c.check_close(f"lone {tag} without dst", block[CYCLE_HEADER_WORDS + 2 * words:].view(np.int32)[:count], expected, 0)
    readonly = np.zeros(count, np.int32)
    readonly.flags.writeable = False
    for what, data, into, words_ in (("a strided payload", np.zeros(2 * count, np.int32)[::2], dst, ("C-contiguous",)),
                                     ("a payload too large", np.zeros(capacity // 4 + 1, np.int32), None, ("fit", "4096")),
                                     ("a short result", src, dst[1:], ("3996", "4000 bytes")),
                                     ("a read-only result", src, readonly, ("writeable",))):
        c.expect_error(f"lone {tag}, {what}", lambda: run(1, into, data=data), ValueError, *words_)
    dst[:] = -7
    c.CHECKS.check(run(77, dst)[1], f"lone {tag}: the ranks fell out of step after the refused calls")
    c.check_close(f"lone {tag} after the refused calls", dst, expected, 0)
    # the general path's cycle (`cycle_exchange`): the header's hash and payload size, then the
    # payload (other values than any cycle's before, which the slots may still hold), lie in
    # the block, and the sum comes back there
    block[:] = 0
    block[1], block[2] = 55, src.nbytes
    payload = block[CYCLE_HEADER_WORDS + 2 * words:].view(np.int32)
    payload[:count] = src + 7
    outcome = cycles.cycle_exchange(array_address(block), words, capacity, array_address(tmp), fn, 4, 0.0, None)
    c.CHECKS.check(tuple(outcome) == (0, 55, False, False), f"cycle {tag}: {outcome}")
    c.check_close(f"cycle {tag}: the block's payload", payload[:count], expected + 7 * N, 0)


# The payloads go into the slots with streaming stores from cycle_streaming_bytes: every one so,
# then none; and the general path's cycles, whose payloads lie in the block, streamed too.
c.CHECKS.check(rt.shm.cycle_streaming_bytes == SHM_CYCLE_STREAMING_BYTES, "cycle_streaming_bytes")
for streamed_from in (1, 1 << 40):
    rt.shm.cycle_streaming_bytes = streamed_from
    lone_cycles(rt.shm, f"segment, payloads streamed from {streamed_from} bytes")
rt.shm.cycle_streaming_bytes = 1
riding = [fastring.allreduce_async(np.arange(1000, dtype=np.int32) * (R + 1), op=fastring.Sum, name=f"riding {k}")
          for k in range(3)]
for k, h in enumerate(riding):
    c.check_close(f"a queued allreduce riding the cycle, streamed, {k}", h.wait(),
                  np.arange(1000, dtype=np.int32) * (N * (N + 1) // 2), 0)
rt.shm.cycle_streaming_bytes = SHM_CYCLE_STREAMING_BYTES


def dtypes_and_ops(dtypes, lengths, tag):
    for dt in dtypes:
        for op in OPS:
            if dt == np.bool_ and op == fastring.Average:
                continue
            for length in lengths(dt):
                name = f"{tag} {dt} {op.name} n={length}"
                inputs = [c.rank_input(dt, length, r, length + int(op)) for r in range(N)]
                expected, bound = c.reference(inputs, op, N)
                x = inputs[R].copy()
                got = fastring.allreduce(x, op=op, name=name)
                c.check_close(name + " input", x, inputs[R], 0)
                c.check_close(name, got, expected, bound)
                c.check_identical(name, got)
                fastring.allreduce(x, op=op, name=name, out=x)  # in place
                c.check_close(name + " in place", x, expected, bound)
                c.check_identical(name + " in place", x)


def finished_where_reduced(lengths, tag):
    """Average's division and the postscale, run on each piece by the rank that reduced it,
    give the bits of a separate pass over the summed result (divide_into, then scale_into;
    a 16-bit float Average divides its input first)."""
    for dt in (np.dtype(np.float32), np.dtype(np.float16), c.BF16, np.dtype(np.float64), np.dtype(np.int32)):
        for length in lengths(dt):
            x = c.rank_input(dt, length, R, 70 + length % 97)
            for op, factor in ((fastring.Average, 1.0), (fastring.Average, 0.3), (fastring.Sum, 2.5)):
                if op == fastring.Average and dt.kind == "i":
                    continue  # an integer Average finishes when it unpacks, not here
                name = f"{tag} finish {dt} {op.name} x{factor} n={length}"
                got = fastring.allreduce(x, op=op, postscale_factor=factor, name=name)
                summed = x.copy()
                predivides = op == fastring.Average and dt.itemsize == 2  # against overflow
                if predivides:
                    kernels.divide_into(summed, N)
                expected = fastring.allreduce(summed, op=fastring.Sum, name=name + " sum")
                if op == fastring.Average and not predivides:
                    kernels.divide_into(expected, N)
                kernels.scale_into(expected, factor)
                c.CHECKS.check(got.tobytes() == expected.tobytes(), f"{name}: not the bits of a separate pass")


def collectives_loops(tag, large):
    """The other collectives' loops called directly, `large` bytes and more per rank:
    allgather of uneven blocks, a broadcast, alltoall of uneven pieces (and one rank sending
    nothing to another), reduce-scatter of uneven parts of data that rounds."""
    counts = np.array([large + 100 + 8 * r for r in range(N)], np.int64)
    displs = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    mine = np.full(counts[R], R + 1, np.uint8)
    gathered = np.zeros(int(counts.sum()), np.uint8)
    shm.gatherv(array_address(mine), array_address(gathered), counts, displs)
    c.check_close(f"gatherv {tag}", gathered, np.repeat(np.arange(1, N + 1, dtype=np.uint8), counts), 0)
    # a broadcast: one nonzero count, the root's input is its output
    root = N - 1
    data = np.arange(large + 77, dtype=np.uint32) * 7 + 3 if R == root else np.zeros(large + 77, np.uint32)
    only = np.zeros(N, np.int64)
    only[root] = data.nbytes
    shm.gatherv(array_address(data), array_address(data), only, np.zeros(N, np.int64))
    c.check_close(f"gatherv as broadcast {tag}", data, np.arange(large + 77, dtype=np.uint32) * 7 + 3, 0)
    matrix = np.array([[large // N + 64 * r + j for j in range(N)] for r in range(N)], np.int64)
    matrix[0, N - 1] = 0
    send = np.concatenate([np.full(matrix[R, j], 10 * R + j, np.uint8) for j in range(N)])
    sdispls = np.concatenate([[0], np.cumsum(matrix[R])[:-1]]).astype(np.int64)
    rdispls = np.concatenate([[0], np.cumsum(matrix[:, R])[:-1]]).astype(np.int64)
    received = np.zeros(int(matrix[:, R].sum()), np.uint8)
    shm.alltoallv(array_address(send), matrix, sdispls, array_address(received), rdispls)
    c.check_close(f"alltoallv {tag}", received,
                  np.concatenate([np.full(matrix[r, R], 10 * r + R, np.uint8) for r in range(N)]), 0)
    parts = np.array([large // 4 + r for r in range(N)], np.int64)  # float32 items per rank
    offsets = np.concatenate([[0], np.cumsum(parts)]).astype(np.int64) * 4
    inputs = [c.rank_input(np.dtype(np.float32), int(parts.sum()), r, 40) for r in range(N)]
    values = inputs[R].copy()
    part = np.zeros(int(parts[R]), np.float32)
    shm.reduce_scatter(array_address(values), offsets, array_address(part), sum_f32, 4)
    expected, bound = c.reference(inputs, fastring.Sum, N)
    lo, hi = offsets[R] // 4, offsets[R + 1] // 4
    c.check_close(f"reduce_scatter {tag}", part, expected[lo:hi], bound[lo:hi] if np.ndim(bound) else bound)
    c.check_close(f"reduce_scatter {tag} input", values, inputs[R], 0)


def streamed_broadcasts(tag):
    """SharedSegment.stream_broadcast: every root in turn, back to back with no barrier
    between them (so a root may refill ring space a slower reader has only just freed):
    empty, one byte, then an allgather of nothing through the rings, then a call that starts at
    the ring's start (SHM_STREAM_RESTART_BYTES: its root must wait for the reads of the byte,
    not of the positions the stream skipped, which no rank reads, nor of the empty call's), a
    piece and one byte either side, odd sizes, more than the ring (it wraps within one call),
    several calls of most of a ring in a row; then bad arguments."""
    piece = SHM_STREAM_PIECE_BYTES
    ring = shm.tile_bytes
    sizes = [0, 1, None, SHM_STREAM_RESTART_BYTES + 3, piece - 1, piece, piece + 1, 3 * piece + 13, 2 * ring + 5 * piece + 3] + [ring - 7] * 3
    results = []
    for k, nbytes in enumerate(sizes):
        if nbytes is None:
            nothing = np.empty(0, np.uint8)
            counts, _ = shm.allgather_rows(array_address(nothing), 0, 8, lambda counts: nothing)
            c.check_close(f"empty streamed allgather {tag}", counts, np.zeros(N, np.int64), 0)
            continue
        root = k % N
        expect = ((np.arange(nbytes, dtype=np.int64) * 31 + 7 * k + root) % 251).astype(np.uint8)
        buf = expect.copy() if R == root else np.full(nbytes, 255, np.uint8)
        shm.stream_broadcast(array_address(buf), nbytes, root)
        results.append((f"stream_broadcast {nbytes} B from {root} {tag}", buf, expect))
    for tag, got, expect in results:  # checked after all ran: a late overwrite would show
        c.check_close(tag, got, expect, 0)
    buf = np.zeros(8, np.uint8)
    c.expect_error("stream_broadcast bad root", lambda: shm.stream_broadcast(array_address(buf), 8, N),
                   ValueError, "root")
    c.expect_error("stream_broadcast negative size", lambda: shm.stream_broadcast(array_address(buf), -1, 0),
                   ValueError, "negative")


def single_copy_broadcasts():
    """SharedSegment.single_copy_broadcast: every root, from no byte to 2 MB, each size twice
    (the second call with the root's part learned from the first), each followed at once by a
    single-copy allreduce, whose table words follow the broadcast's; bad arguments; a copy that fails (the root's buffer
    unmapped) is the same errno on every rank; and through SingleCopyBroadcast, a copy that
    fails on one rank (the root's process id made wrong there) sends the bytes again through
    the segment, says why, and turns single copy off."""
    from fastring._transport.testing import set_pid
    from fastring.algorithms.collectives import SingleCopyBroadcast
    a = np.full(2 * SHM_SINGLE_COPY_CHUNK_BYTES // 8 + 1, float(R))
    for nbytes in (0, 1, 63, 4097, 300_001, 2_000_003):
        for root in range(N):
            expect = ((np.arange(nbytes, dtype=np.int64) * 7 + root) % 251).astype(np.uint8)
            for call in range(2):
                buf = expect.copy() if R == root else np.full(nbytes, 255, np.uint8)
                failed = shm.single_copy_broadcast(array_address(buf), nbytes, root)
                c.CHECKS.check(failed == 0, f"single-copy broadcast of {nbytes} B from {root} failed: {failed}")
                c.check_close(f"single-copy broadcast {nbytes} B from {root}, call {call}", buf, expect, 0)
                out = np.empty_like(a)
                c.CHECKS.check(shm.allreduce(array_address(a), array_address(out), a.nbytes, sum_f64, 8, False)
                               == "single copy", "the allreduce after the broadcast did not go by single copy")
                c.check_close(f"single-copy allreduce after a broadcast of {nbytes} B", out,
                              np.full_like(a, N * (N - 1) / 2), 0)
    buf = np.zeros(8, np.uint8)
    c.expect_error("single-copy broadcast bad root",
                   lambda: shm.single_copy_broadcast(array_address(buf), 8, N), ValueError, "root")
    c.expect_error("single-copy broadcast negative size",
                   lambda: shm.single_copy_broadcast(array_address(buf), -1, 0), ValueError, "negative")
    buf = np.zeros(100_000, np.uint8)
    failed = shm.single_copy_broadcast(4096 if R == 0 else array_address(buf), buf.nbytes, 0)
    c.CHECKS.check(failed == errno.EFAULT and rt.transport.single_copy,
                   f"a failed single-copy broadcast: errno {failed}, single copy on {rt.transport.single_copy}")
    failures = []
    catcher = logging.Handler()
    catcher.emit = failures.append
    logging.getLogger("fastring").addHandler(catcher)
    if R == V:
        set_pid(rt.transport, 0, c.pid_of_no_process())
    expect = (np.arange(300_001) % 253).astype(np.uint8)
    buf = expect.copy() if R == 0 else np.zeros_like(expect)
    SingleCopyBroadcast.run(rt, buf, 0)
    logging.getLogger("fastring").removeHandler(catcher)
    c.check_close("a single-copy broadcast sent again after a failed copy", buf, expect, 0)
    said = [f.getMessage() for f in failures]
    c.CHECKS.check(not rt.transport.single_copy and any("No such process" in m and "segment" in m for m in said),
                   f"a failed single-copy broadcast: single copy on {rt.transport.single_copy}, logged {said}")
    c.CHECKS.check(rt.transport.enable_single_copy(), "single copy could not be enabled again")


def streaming_copies():
    """copy_streaming, the copy the segment's large outputs take: every alignment of the
    destination and source within a line and lengths around the 64-byte step, byte-exact and
    nothing written past the end; then a bad length."""
    src = (np.arange(5000, dtype=np.int64) * 37 % 253).astype(np.uint8)
    for d_off in (0, 1, 15, 63):
        for s_off in (0, 7, 64):
            for length in (0, 1, 63, 64, 65, 200, 4000):
                dst = np.full(4300, 255, np.uint8)
                copy_streaming(array_address(dst) + d_off, array_address(src) + s_off, length)
                expect = np.full(4300, 255, np.uint8)
                expect[d_off:d_off + length] = src[s_off:s_off + length]
                c.check_close(f"copy_streaming {d_off} {s_off} {length}", dst, expect, 0)
    c.expect_error("copy_streaming negative", lambda: copy_streaming(0, 0, -1),
                   ValueError, "negative")


def counted_allgathers(tag):
    """allgather through the API, the row counts travelling in the data round's barrier
    (SharedSegment.allgather_rows): every dtype; uneven rows with one rank sending none;
    every rank sending none; a non-contiguous input; rows past one buffer per rank in rounds
    (the threshold raised); and, the threshold lowered, one rank whose rows it staged in its
    buffer alone below the threshold while the call as a whole goes by single copy; then
    `large_reducescatters`."""
    for k, dt in enumerate(c.DTYPES):
        rows = [c.rank_input(dt, (3 * r + 1, 5), r, 70 + k) for r in range(N)]
        c.check_close(f"allgather counted {dt} {tag}", fastring.allgather(rows[R], name=f"agc {dt}"),
                      np.concatenate(rows), 0)
    rows = [c.rank_input(np.dtype(np.int64), (0 if r == 1 else 1000 + 7 * r, 3), r, 80) for r in range(N)]
    c.check_close(f"allgather counted zero rows {tag}", fastring.allgather(rows[R], name="agc zero"),
                  np.concatenate(rows), 0)
    got = fastring.allgather(np.zeros((0, 2), np.int32), name="agc none")
    c.CHECKS.check(got.shape == (0, 2), f"allgather of no rows anywhere gave shape {got.shape}")
    wide = [c.rank_input(np.dtype(np.int32), (200, 6), r, 81) for r in range(N)]
    c.check_close(f"allgather counted strided {tag}", fastring.allgather(wide[R][:, ::2], name="agc strided"),
                  np.concatenate([w[:, ::2] for w in wide]), 0)
    saved = shm.single_copy_bytes
    shm.single_copy_bytes = 1 << 40
    big = [c.rank_input(np.dtype(np.int64), ((SHM_TILE_BYTES // 8 + 1000 * r + 3) // 2, 2), r, 82) for r in range(N)]
    c.check_close(f"allgather counted rounds {tag}", fastring.allgather(big[R], name="agc rounds"),
                  np.concatenate(big), 0)
    shm.single_copy_bytes = 1 << 20
    mixed = [c.rank_input(np.dtype(np.int64), (1000 if r == 0 else 40_000 + 100 * r, 4), r, 83) for r in range(N)]
    c.check_close(f"allgather counted mixed {tag}", fastring.allgather(mixed[R], name="agc mixed"),
                  np.concatenate(mixed), 0)
    shm.single_copy_bytes = saved
    large_reducescatters(tag)


def large_reducescatters(tag):
    """reducescatter through the segment's buffers past SHM_COLLECTIVE_MAX_BYTES (up to
    SHM_REDUCESCATTER_MAX_BYTES): exact integers, rows that do not divide among the ranks,
    more than one round per rank (a part wider than a round: the default rounds, rounds of a
    whole buffer's share, and rounds that end mid-row); then past it, by the ring."""
    rows = SHM_TILE_BYTES // 16 + N + 1
    xs = [c.rank_input(np.dtype(np.int32), (rows, 4), r, 84) for r in range(N)]
    whole = sum(x.astype(np.int64) for x in xs).astype(np.int32)
    bounds = np.cumsum([0] + [rows // N + (1 if r < rows % N else 0) for r in range(N)])
    saved = shm.reduce_scatter_round_bytes
    for round_bytes in (saved, SHM_TILE_BYTES, 65540):
        shm.reduce_scatter_round_bytes = round_bytes
        c.check_close(f"reducescatter through the segment {tag}, rounds of {round_bytes} bytes",
                      fastring.reducescatter(xs[R], op=fastring.Sum, name="rs segment"),
                      whole[bounds[R]:bounds[R + 1]], 0)
    shm.reduce_scatter_round_bytes = saved
    # On two ranks the ring receives the peer's part straight into the result, which then lies
    # as this rank's part of the input does (config.COPY_PHASE_BYTES): here 16 + 8R bytes past
    # a boundary, where the pool's default would put it on one. An input on a boundary (the
    # frameworks') keeps its result on one, wherever its part lies.
    row = xs[R][0].nbytes
    held = np.empty(xs[R].nbytes + 2 * COPY_PHASE_BYTES, np.uint8)
    for lies in (16 + 8 * R - int(bounds[R]) * row, 0):
        skip = (lies - held.ctypes.data) % COPY_PHASE_BYTES
        x = held[skip:skip + xs[R].nbytes].view(np.int32).reshape(xs[R].shape)
        x[:] = xs[R]
        saved = collectives.SHM_REDUCESCATTER_MAX_BYTES
        collectives.SHM_REDUCESCATTER_MAX_BYTES = 0
        try:
            got = fastring.reducescatter(x, op=fastring.Sum, name="rs ring")
        finally:
            collectives.SHM_REDUCESCATTER_MAX_BYTES = saved
        c.check_close(f"reducescatter by the ring {tag}", got, whole[bounds[R]:bounds[R + 1]], 0)
        part = x[bounds[R]:].ctypes.data % COPY_PHASE_BYTES
        want = part if N == 2 and x.ctypes.data % COPY_PHASE_BYTES else 0
        c.CHECKS.check(got.ctypes.data % COPY_PHASE_BYTES == want,
                       f"the ring's reducescatter {tag} result lies {got.ctypes.data % COPY_PHASE_BYTES} bytes past "
                       f"a boundary, its part of the input {part}, the input {x.ctypes.data % COPY_PHASE_BYTES}")


def counted_alltoall(rows_to, dtype, seed, name, strided=False):
    """fastring.alltoall with splits, rank r sending rows_to(r, j) rows of width 3 to rank j,
    checked against every rank's input rebuilt here."""
    inputs = [c.rank_input(dtype, (sum(rows_to(r, j) for j in range(N)), 6 if strided else 3), r, seed)
              for r in range(N)]
    if strided:
        inputs = [x[:, ::2] for x in inputs]
    got, received = fastring.alltoall(inputs[R], splits=[rows_to(R, j) for j in range(N)], name=name)
    starts = [np.cumsum([0] + [rows_to(r, j) for j in range(N)]) for r in range(N)]
    c.check_close(name, got, np.concatenate([inputs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)]), 0)
    c.check_close(name + " splits", received, np.array([rows_to(r, R) for r in range(N)]), 0)


def counted_alltoalls(tag):
    """alltoall through the API, the row counts travelling in the data round's barrier
    (SharedSegment.alltoall_rows): every dtype with uneven splits; one pair sending nothing;
    nothing sent at all; a non-contiguous input; pieces past one buffer in rounds (the
    threshold raised); and, the threshold lowered, one rank that staged its small pieces while
    the call goes by single copy."""
    for k, dt in enumerate(c.DTYPES):
        counted_alltoall(lambda r, j: 2 * r + j + 1, dt, 90 + k, f"alltoall counted {dt} {tag}")
    counted_alltoall(lambda r, j: 0 if (r, j) == (0, N - 1) else 50 + r, np.dtype(np.int64), 100,
                     f"alltoall counted zero pair {tag}")
    counted_alltoall(lambda r, j: 0, np.dtype(np.int32), 101, f"alltoall counted nothing {tag}")
    counted_alltoall(lambda r, j: 30 + 5 * j + r, np.dtype(np.int32), 102, f"alltoall counted strided {tag}", True)
    saved = shm.single_copy_bytes
    shm.single_copy_bytes = 1 << 40
    counted_alltoall(lambda r, j: SHM_TILE_BYTES // N // 24 + 1000 * j + 7 * r, np.dtype(np.int64), 103,
                     f"alltoall counted rounds {tag}")
    shm.single_copy_bytes = 1 << 20
    counted_alltoall(lambda r, j: 100 if r == 0 else 60_000 + 10 * j, np.dtype(np.int64), 104,
                     f"alltoall counted mixed {tag}")
    shm.single_copy_bytes = saved


def streamed_exchanges(tag):
    """allgather and alltoall streamed through the rings (SharedSegment._stream_exchange),
    back to back with streamed broadcasts and no barrier between any of them, so that a rank
    may refill ring space a slower peer has only just freed: blocks from nothing to more than
    twice the ring (the stream wraps within one call), a piece and one byte either side,
    uneven and empty blocks; every result checked after all ran. Then, single copy off and
    the stream's threshold between one rank's bytes and the call's, a call that goes in
    rounds although only some ranks staged their first round."""
    piece = min(SHM_STREAM_LARGE_PIECE_BYTES, shm.tile_bytes // 2)
    ring = shm.tile_bytes
    results = []
    for k, nbytes in enumerate([0, 8, piece - 8, piece + 8, 2 * ring + 3 * piece + 40]):
        rows = [0 if (r == 1 and k % 2) else nbytes // 8 + 3 * r for r in range(N)]
        mine = c.rank_input(np.dtype(np.int64), (rows[R],), R, 110 + k)
        got = fastring.allgather(mine, name=f"ag stream {k}")
        results.append((f"allgather streamed {nbytes} B {tag}", got,
                        np.concatenate([c.rank_input(np.dtype(np.int64), (rows[r],), r, 110 + k) for r in range(N)])))
        to = [[0 if (r + j + k) % 3 == 0 and k else (nbytes // N + 5 * j + r) // 4 for j in range(N)] for r in range(N)]
        inputs = [c.rank_input(np.dtype(np.int32), (sum(to[r]),), r, 120 + k) for r in range(N)]
        got, received = fastring.alltoall(inputs[R], splits=to[R], name=f"a2a stream {k}")
        starts = [np.cumsum([0] + to[r]) for r in range(N)]
        results.append((f"alltoall streamed {nbytes} B {tag}", got,
                        np.concatenate([inputs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)])))
        root = k % N
        expect = ((np.arange(nbytes + k, dtype=np.int64) * 29 + k) % 251).astype(np.uint8)
        buf = expect.copy() if R == root else np.zeros(nbytes + k, np.uint8)
        fastring.broadcast(buf, root, name=f"bc stream {k}", out=buf)
        results.append((f"broadcast between streams {nbytes} B {tag}", buf, expect))
    for what, got, expect in results:
        c.check_close(what, got, expect, 0)
    saved = shm.single_copy_bytes, shm.stream_exchange_bytes
    shm.single_copy_bytes = 1 << 40
    shm.stream_exchange_bytes = 1 << 20
    rows = [(1 << 20) // 8 - 100 if r == 0 else SHM_TILE_BYTES // 8 + 1000 * r for r in range(N)]
    parts = [c.rank_input(np.dtype(np.int64), (rows[r],), r, 130) for r in range(N)]
    c.check_close(f"allgather partly staged {tag}", fastring.allgather(parts[R], name="ag partly staged"),
                  np.concatenate(parts), 0)
    counted_alltoall(lambda r, j: 1000 if r == 0 else SHM_TILE_BYTES // 24 + 100 * j, np.dtype(np.int64), 131,
                     f"alltoall partly staged {tag}")
    shm.single_copy_bytes, shm.stream_exchange_bytes = saved


def through_requests(check, tag):
    """`check(tag)` with allgather and alltoall made as Requests (their async forms): the row
    counts travel in the data round's barrier, not in a lean call's negotiation cycle."""
    sync = fastring.allgather, fastring.alltoall
    fastring.allgather = lambda t, **kw: fastring.allgather_async(t, **kw).wait()
    fastring.alltoall = lambda t, splits=None, **kw: fastring.alltoall_async(t, splits, **kw).wait()
    try:
        check(tag)
    finally:
        fastring.allgather, fastring.alltoall = sync


def lean_exchanges(tag):
    """The lean path of allgather and alltoall (Engine.lone_run: the row counts summed in
    the negotiation cycle, the segment's call then without a barrier) is the one the
    synchronous calls take, and stays right beside the general path: one rank making the
    call as a Request (no counts in its cycle) while the others go lean, then the same name
    lean again; and the segment refusing known counts of the wrong shape."""
    known = []
    real = api_collectives.allgather_concat, api_collectives.alltoall_rows, api_collectives.allgather_reduced
    api_collectives.allgather_concat = lambda rt_, a, counts=None: known.append(counts is not None) or real[0](
        rt_, a, counts)
    api_collectives.alltoall_rows = lambda rt_, a, rows, matrix=None: known.append(matrix is not None) or real[1](
        rt_, a, rows, matrix)
    # a lean allgather's cycle carried the counts (and, where they fit, the rows)
    api_collectives.allgather_reduced = lambda rt_, a, reduced: known.append(True) or real[2](rt_, a, reduced)
    try:
        for k, nbytes in enumerate([8, 3 * SHM_STREAM_LARGE_PIECE_BYTES + 40]):
            rows = [nbytes // 8 + 3 * r for r in range(N)]
            parts = [c.rank_input(np.dtype(np.int64), (rows[r],), r, 140 + k) for r in range(N)]
            to = lambda r, j: (nbytes // N + 7 * j + r) // 4  # noqa: E731
            inputs = [c.rank_input(np.dtype(np.int32), (sum(to(r, j) for j in range(N)),), r, 150 + k)
                      for r in range(N)]
            starts = [np.cumsum([0] + [to(r, j) for j in range(N)]) for r in range(N)]
            for how in ("lean", "mixed", "lean again"):
                request = how == "mixed" and R == 0
                got = (fastring.allgather_async(parts[R], name=f"ag lean {k}").wait() if request
                       else fastring.allgather(parts[R], name=f"ag lean {k}"))
                c.check_close(f"allgather {how} {nbytes} B {tag}", got, np.concatenate(parts), 0)
                splits = [to(R, j) for j in range(N)]
                got, received = (fastring.alltoall_async(inputs[R], splits, name=f"a2a lean {k}").wait() if request
                                 else fastring.alltoall(inputs[R], splits=splits, name=f"a2a lean {k}"))
                c.check_close(f"alltoall {how} {nbytes} B {tag}", got,
                              np.concatenate([inputs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)]), 0)
                c.check_close(f"alltoall {how} {nbytes} B {tag} splits", received,
                              np.array([to(r, R) for r in range(N)]), 0)
    finally:
        api_collectives.allgather_concat, api_collectives.alltoall_rows, api_collectives.allgather_reduced = real
    # lean, then (mixed: the cycles disagree) not, per size and collective; lean again later
    c.CHECKS.check(known[:2] == [True, True] and known[2:4] == [False, False] and sum(known) >= 4,
                   f"the calls with known counts: {known} ({tag})")
    one = np.ones(4, np.int64)
    c.expect_error(f"known counts of the wrong shape {tag}",
                   lambda: shm.alltoall_rows(array_address(one), np.ones(N, np.int64), 8, np.empty,
                                             np.ones((N, N + 1), np.int64)), ValueError, "known")
    c.expect_error(f"known counts of the wrong length {tag}",
                   lambda: shm.allgather_rows(array_address(one), 4, 8, np.empty, np.ones(N + 1, np.int64)),
                   ValueError, "known")


def results_area(tag):
    """Lean allgathers and alltoalls whose results come from the segment's results area, each
    rank writing its bytes straight into every rank's result: exact, with uneven rows, at the
    smallest size that goes so and across several of the rank's tiles; results in the area;
    a result the caller holds neither handed out again nor written by the next call; a rank
    that sends nothing and receives nothing from one rank (its result empty in the
    alltoall); one rank whose area has no room left (its result on the heap) sends every
    rank the streamed way, alike, with exact results."""
    arena = rt.results.arena
    c.CHECKS.check(arena is not None and rt.shm.results is arena, f"no results area {tag}: {rt.results}")
    if arena is None:
        return
    per_rank = [SHM_TIMED_CHOICE_MIN_BYTES // 8 // N + 1, 3 * (1 << 20) // 8 // N + 5]  # int64 items

    def calls(k, what, idle=-1):
        parts = [c.rank_input(np.dtype(np.int64), ((r != idle) * (per_rank[k % 2] + 7 * r),), r, 700 + k)
                 for r in range(N)]
        got = fastring.allgather(parts[R], name=f"area ag {k % 2}")
        to = lambda r, j: (idle not in (r, j)) * (per_rank[k % 2] // N + 5 * j + 3 * r)  # noqa: E731
        inputs = [c.rank_input(np.dtype(np.int64), (sum(to(r, j) for j in range(N)),), r, 800 + k) for r in range(N)]
        starts = [np.cumsum([0] + [to(r, j) for j in range(N)]) for r in range(N)]
        moved, received = fastring.alltoall(inputs[R], splits=[to(R, j) for j in range(N)], name=f"area a2a {k % 2}")
        return [(f"allgather {what} {k} {tag}", got, np.concatenate(parts)),
                (f"alltoall {what} {k} {tag}", moved,
                 np.concatenate([inputs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)]))]

    held = [calls(k, "direct") for k in range(4)]  # every result held: each call a new block
    held.append(calls(5, "direct, the last rank idle", idle=V))
    for results in held:
        for what, got, expect in results:
            c.check_close(what, got, expect, 0)  # after every later call wrote its results
            c.CHECKS.check(arena.holds(got), f"{what}: the result lies outside the area")
    addresses = [got.ctypes.data for results in held for _, got, _ in results if got.size]
    c.CHECKS.check(len(set(addresses)) == len(addresses), f"held results share memory {tag}")
    del held
    saved = rt.results
    try:
        full = fastring._core.pool.Arena(arena._buffer, R * rt.shm.results_bytes, 0)
        rt.results = fastring._core.pool.Pool(arena=full) if R == V else saved
        results = calls(6, "one rank's area full") + calls(7, "one rank's area full")
    finally:
        rt.results = saved
    for what, got, expect in results:
        c.check_close(what, got, expect, 0)
        c.CHECKS.check(arena.holds(got) != (R == V), f"{what}: where the result lies")


def timed_choices(tag):
    """The one-host broadcast, allgather and alltoall whose way (streamed or by single copy),
    and the reducescatter whose stores into the segment (cached or streaming), are the faster
    measured for their size (algorithms.choice.TimedChoice), with a period of 4
    calls so that both ways run several times each: every call's result exact, checked after
    all ran, from every root in turn and with uneven rows; both ways timed for each; and every
    rank's record of the times the same (or the ranks would part ways). Results from the heap:
    where they lie in the segment's results area, allgather and alltoall write them directly
    instead (`results_area`)."""
    saved, rt.results = rt.results, fastring._core.pool.POOL
    try:
        _timed_choices(tag)
    finally:
        rt.results = saved


def _timed_choices(tag):
    from fastring.algorithms import choice
    period = 4
    ways = {"broadcast": ("stream", "single copy"), "allgather": ("stream", "single copy"),
            "alltoall": ("stream", "single copy"), "reducescatter": SHM_STORE_WAYS}
    for collective, its_ways in ways.items():
        rt.choices[collective] = choice.TimedChoice(its_ways, period)
        # no fresh tries (test_timed_choice has them): this counts each way's timings, and on
        # a loaded machine two timings in a row can come 3x over the best
        rt.choices[collective].relearn = float("inf")
    nbytes = SHM_TIMED_CHOICE_MIN_BYTES + 4 * 999
    results = []
    for k in range(3 * period + 1):
        root = k % N
        expect = c.rank_input(np.dtype(np.int32), (nbytes // 4,), root, 200 + k)
        buf = expect.copy() if R == root else np.zeros_like(expect)
        fastring.broadcast(buf, root, name="timed bc", out=buf)
        results.append((f"broadcast {k} from {root}", buf, expect))
        parts = [c.rank_input(np.dtype(np.int64), (nbytes // 8 + 5 * r, 2), r, 300 + k) for r in range(N)]
        results.append((f"allgather {k}", fastring.allgather(parts[R], name="timed ag"), np.concatenate(parts)))
        to = lambda r, j: nbytes // 4 // N + 11 * j + 3 * r  # noqa: E731
        inputs = [c.rank_input(np.dtype(np.int32), (sum(to(r, j) for j in range(N)),), r, 400 + k) for r in range(N)]
        starts = [np.cumsum([0] + [to(r, j) for j in range(N)]) for r in range(N)]
        got, _ = fastring.alltoall(inputs[R], splits=[to(R, j) for j in range(N)], name="timed a2a")
        results.append((f"alltoall {k}", got,
                        np.concatenate([inputs[r][starts[r][R]:starts[r][R + 1]] for r in range(N)])))
        # rows of 3 int32, not a multiple of N: the first ranks' parts one row longer
        rows = [c.rank_input(np.dtype(np.int32), (nbytes // 12 + 1, 3), r, 500 + k) % 100_000 for r in range(N)]
        results.append((f"reducescatter {k}", fastring.reducescatter(rows[R], op=fastring.Sum, name="timed rs"),
                        np.array_split(sum(rows), N)[R]))
    for what, got, expect in results:
        c.check_close(f"{what} by timed choice {tag}", got, expect, 0)
    for collective in ways:
        learnt = rt.choices[collective]._sizes
        c.CHECKS.check(len(learnt) == 1 and all(len(t) >= 2 for t in next(iter(learnt.values()))[2]),
                       f"{collective}: both ways timed {tag}: {learnt}")
        c.check_identical(f"{collective} choice's times {tag}",
                          np.array([t for entry in learnt.values() for times in entry[2] for t in times]))
        del rt.choices[collective]


def unstreamed(check, tag):
    """`check(tag)` with the stream off: the single-copy and round paths of the same calls."""
    shm.stream_exchange_bytes = 0
    check(tag)
    shm.stream_exchange_bytes = SHM_STREAM_EXCHANGE_MAX_BYTES


shm = rt.shm
sum_f64 = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], np.dtype(np.float64))
sum_f32 = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], np.dtype(np.float32))
sum_i32 = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], np.dtype(np.int32))


def pieces_allreduce(dtype, lengths, tag, one_step=False, streaming=False):
    """`allreduce_pieces`: an input that lies in pieces (a group's tensors where they are),
    read as their concatenation with no gathering copy, into a separate block and in place
    (the pieces are the block's own slices). On data that rounds (float32), bit for bit the
    reduction in rank order on every rank; integers exactly. `streaming`: what the ranks
    read of each other written with streaming stores."""
    fn = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], dtype)
    total = sum(lengths)
    if dtype.kind == "f":
        inputs = [np.random.default_rng([900 + total, r]).standard_normal(total).astype(dtype) for r in range(N)]
    else:
        inputs = [c.rank_input(dtype, total, r, 900 + total % 97) for r in range(N)]
    expected = inputs[0].copy()
    for x in inputs[1:]:
        expected += x  # in the inputs' dtype, in rank order: one rounding per step, as the reducers do
    if dtype.kind == "f":
        exact = np.add.reduce([x.astype(np.longdouble) for x in inputs])
        c.CHECKS.check(np.any(expected != exact), f"{tag}: the data does not round")
    bounds = np.cumsum([0] + list(lengths))
    pieces = [inputs[R][bounds[i]:bounds[i + 1]].copy() for i in range(len(lengths))]  # each apart
    addresses = np.array([array_address(p) for p in pieces], np.int64)
    sizes = np.array([p.nbytes for p in pieces], np.int64)
    out = np.full(total, -1, dtype)
    c.CHECKS.check(shm.allreduce_pieces(addresses, sizes, array_address(out), fn, dtype.itemsize, one_step,
                                        streaming=streaming), f"{tag}: declined")
    c.check_close(tag, out, expected, 0)
    c.check_identical(tag, out)
    for i, p in enumerate(pieces):
        c.check_close(f"{tag}: input {i} left alone", p, inputs[R][bounds[i]:bounds[i + 1]], 0)
    block = inputs[R].copy()
    views = np.array([array_address(block[bounds[i]:]) for i in range(len(lengths))], np.int64)
    c.CHECKS.check(shm.allreduce_pieces(views, sizes, array_address(block), fn, dtype.itemsize, one_step,
                                        streaming=streaming), f"{tag} in place: declined")
    c.check_close(f"{tag} in place", block, expected, 0)


# Pieces of every length (empty ones, one item), that cross the ranks' parts and the rounds
# (SHM_PIECES_ROUND_BYTES), and a group of one piece; one step up to its size.
ROUND_ITEMS = SHM_PIECES_ROUND_BYTES // 4
for dt in (np.dtype(np.int32), np.dtype(np.float32)):
    pieces_allreduce(dt, [0, 1, 7, ROUND_ITEMS - 5, 0, 12_345, ROUND_ITEMS + N, 3, ROUND_ITEMS // 3], f"pieces {dt}")
    pieces_allreduce(dt, [5, 0, 1000, SHM_ONE_STEP_BYTES // 4 - 1005], f"pieces one step {dt}", one_step=True)
    pieces_allreduce(dt, [N + 1], f"pieces, one piece {dt}")
pieces_allreduce(np.dtype(np.float64), [3, ROUND_ITEMS // 2 + 1, 0, 777], "pieces float64")


class OneWay:
    """A TimedChoice stand-in that always runs `way`, and counts the calls it ran."""

    def __init__(self, way):
        self.way, self.calls = way, 0

    def run(self, rt_, nbytes, run_way):
        self.calls += 1
        return run_way(self.way)


# The allreduce through the segment's buffers with what the ranks read of each other written
# by streaming stores (SHM_STORE_WAYS): pieces in rounds and in one step, and through the
# API every dtype and op, in place and not, and Average and the postscale finished where
# reduced, in one step and in rounds.
for dt in (np.dtype(np.int32), np.dtype(np.float32)):
    pieces_allreduce(dt, [0, 1, 7, ROUND_ITEMS - 5, 0, 12_345, ROUND_ITEMS + N, 3, ROUND_ITEMS // 3],
                     f"pieces {dt}, streaming", streaming=True)
    pieces_allreduce(dt, [5, 0, 1000, SHM_ONE_STEP_BYTES // 4 - 1005], f"pieces one step {dt}, streaming",
                     one_step=True, streaming=True)
rt.choices["allreduce"] = streaming_way = OneWay("streaming")
dtypes_and_ops([np.dtype(np.int32), np.dtype(np.float32), np.dtype(np.float16)],
               lambda dt: (SHM_TIMED_CHOICE_MIN_BYTES // dt.itemsize + 3, SHM_ONE_STEP_BYTES // dt.itemsize + N + 1),
               "streaming stores")
finished_where_reduced(lambda dt: (SHM_ONE_STEP_BYTES // dt.itemsize + N + 1,), "streaming stores")
del rt.choices["allreduce"]
c.CHECKS.check(streaming_way.calls >= 60, f"allreduces with streaming stores: {streaming_way.calls}")
# Bad pieces are refused before anything moves, so the ranks stay in step; where the allreduce
# would copy between the ranks' memories instead, the call declines and writes nothing.
one = np.ones(10, np.int32)
at, length = np.array([array_address(one)], np.int64), np.array([one.nbytes], np.int64)
for what, call, words in (
        ("addresses and lengths differ", lambda: shm.allreduce_pieces(at, np.array([40, 0], np.int64),
                                                                      array_address(one), sum_i32, 4, False), ("1 addresses", "2 lengths")),
        ("a piece of part of an item", lambda: shm.allreduce_pieces(at, np.array([38], np.int64),
                                                                    array_address(one), sum_i32, 4, False), ("38 bytes", "4-byte")),
        ("one step beyond a buffer", lambda: shm.allreduce_pieces(at, np.array([SHM_TILE_BYTES + 4], np.int64),
                                                                  array_address(one), sum_i32, 4, True), ("one-step", "fit"))):
    c.expect_error(f"pieces: {what}", call, ValueError, *words)
out = np.zeros(10, np.int32)
c.CHECKS.check(shm.allreduce_pieces(at, length, array_address(out), sum_i32, 4, False) and np.all(out == N),
               f"pieces: the ranks fell out of step after the refused calls: {out}")
saved = shm.allreduce_single_copy_bytes
shm.allreduce_single_copy_bytes = one.nbytes  # the group's own threshold decides, not this one
out[:] = -1
c.CHECKS.check(shm.allreduce_pieces(at, length, array_address(out), sum_i32, 4, False) and np.all(out == N),
               f"pieces: declined below SHM_PIECES_SINGLE_COPY_BYTES: {out}")
shm.allreduce_single_copy_bytes = saved
saved = shm.pieces_single_copy_bytes
shm.pieces_single_copy_bytes = one.nbytes
out[:] = -1
c.CHECKS.check(shm.allreduce_pieces(at, length, array_address(out), sum_i32, 4, False) is False and np.all(out == -1),
               "pieces: not declined where single copy would run")
shm.pieces_single_copy_bytes = saved
# Every dtype and op, one step (above the cycle's 64 KiB) and by single copy (the threshold
# lowered to 1 MiB: more than one chunk, the last one uneven, claimed by whichever rank is free).
shm.allreduce_single_copy_bytes = shm.single_copy_bytes = 1 << 20
dtypes_and_ops(c.DTYPES, lambda dt: (SHM_ONE_STEP_BYTES // dt.itemsize - 1,
                                     2 * SHM_SINGLE_COPY_CHUNK_BYTES // dt.itemsize + N + 1), "single copy")
finished_where_reduced(lambda dt: (SHM_ONE_STEP_BYTES // dt.itemsize - 1,
                                    2 * SHM_SINGLE_COPY_CHUNK_BYTES // dt.itemsize + N + 1), "single copy")
collectives_loops("single copy", 1 << 20)
streamed_broadcasts("cached")
single_copy_broadcasts()
streaming_copies()
streamed_exchanges("cached")
lean_exchanges("cached")
results_area("cached")
# A result from the results area outlives the segment: its memory stays mapped while it is
# held (checked after the shutdown below).
kept_parts = [c.rank_input(np.dtype(np.int32), (SHM_TIMED_CHOICE_MIN_BYTES // 4 + r,), r, 900) for r in range(N)]
kept = fastring.allgather(kept_parts[R], name="kept")
c.CHECKS.check(runtime().results.arena.holds(kept), "the kept result lies outside the results area")
timed_choices("cached")
through_requests(streamed_exchanges, "cached, requests")
counted_allgathers("streamed")
counted_alltoalls("streamed")
through_requests(counted_allgathers, "streamed, requests")
through_requests(counted_alltoalls, "streamed, requests")
unstreamed(counted_allgathers, "single copy")
unstreamed(counted_alltoalls, "single copy")
# the same with every output written by streaming stores (from SHM_STREAMING_STORE_BYTES)
shm.streaming_bytes = 0
streamed_broadcasts("streaming stores")
streamed_exchanges("streaming stores")
lean_exchanges("streaming stores")
results_area("streaming stores")
unstreamed(counted_allgathers, "single copy, streaming stores")
unstreamed(counted_alltoalls, "single copy, streaming stores")
# and through the API: allgather of uneven row counts, alltoall with splits
rows = [c.rank_input(np.dtype(np.int64), (40_000 + 1000 * r, 4), r, 50) for r in range(N)]
got = fastring.allgather(rows[R], name="ag single copy")
c.check_close("allgather single copy", got, np.concatenate(rows), 0)
splits = [100_000 + 100 * j + 10 * R for j in range(N)]
data = c.rank_input(np.dtype(np.int32), (sum(splits), 3), R, 60)
got, received = fastring.alltoall(data, splits=splits, name="a2a single copy")
every = [c.rank_input(np.dtype(np.int32), (sum(100_000 + 100 * j + 10 * r for j in range(N)), 3), r, 60) for r in range(N)]
starts = [np.cumsum([0] + [100_000 + 100 * j + 10 * r for j in range(N)]) for r in range(N)]
c.check_close("alltoall single copy", got, np.concatenate([every[r][starts[r][R]:starts[r][R + 1]] for r in range(N)]), 0)
c.check_close("alltoall single copy splits", received, np.array([100_000 + 100 * R + 10 * r for r in range(N)]), 0)

# The single-copy allreduce itself (shm.pyx, _single_copy_allreduce): whoever claims a chunk
# reduces it in rank order and writes it into every rank. On data that rounds (full float32 and
# float64 mantissas), the result must be the rank-order reduction in the inputs' dtype bit for
# bit on every rank, whichever rank reduced which chunk: several chunks and an uneven last one,
# in place and out= (the input left alone), and in rounds where rank 0 prefers them. At np=3
# another order would give other bits.
def rank_order(inputs, op):
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc = op(acc, x)  # in the inputs' dtype: one rounding per step, as the reducers do
    return acc


def single_copy_allreduce(dtype, count, tag, prefer_buffers=False, path="single copy"):
    """out=, then in place twice: with the reduce-after cfunc (a rank other than 0 reduces
    into its input itself) and without (it reduces in its scratch and copies), each in rank
    order on data that rounds (and, on 3 ranks, whose order matters)."""
    fn = kernels.reduce_cfunc(KERNEL_OP[fastring.Sum], dtype)
    after = kernels.reduce_after_cfunc(KERNEL_OP[fastring.Sum], dtype)
    inputs = [np.random.default_rng([500 + count, r]).standard_normal(count).astype(dtype) for r in range(N)]
    expected = rank_order(inputs, np.add)
    exact = np.add.reduce([i.astype(np.longdouble) for i in inputs])
    c.CHECKS.check(np.any(expected != exact), f"{tag}: the data does not round")
    if N > 2:
        c.CHECKS.check(np.any(expected != inputs[0] + (inputs[1] + inputs[2])), f"{tag}: order does not matter")
    x = inputs[R].copy()
    out = np.full_like(x, np.nan)
    ran = shm.allreduce(array_address(x), array_address(out), x.nbytes, fn, dtype.itemsize, False, prefer_buffers)
    c.CHECKS.check(ran == path, f"{tag}: ran {ran!r}, not {path!r}")
    c.check_close(f"{tag} out=", out, expected, 0)
    c.check_close(f"{tag} input", x, inputs[R], 0)
    for after_fn in (after, 0):
        x = inputs[R].copy()
        ran = shm.allreduce(array_address(x), array_address(x), x.nbytes, fn, dtype.itemsize, False, prefer_buffers,
                            reduce_after_fn=after_fn)
        c.CHECKS.check(ran == path, f"{tag} in place: ran {ran!r}, not {path!r}")
        c.check_close(f"{tag} in place, reduce after {bool(after_fn)}", x, expected, 0)
        c.check_identical(tag, x)


F32_COUNT = 3 * SHM_SINGLE_COPY_CHUNK_BYTES // 4 + 12_345
single_copy_allreduce(np.dtype(np.float32), F32_COUNT, "single-copy allreduce float32")
single_copy_allreduce(np.dtype(np.float64), 2 * SHM_SINGLE_COPY_CHUNK_BYTES // 8 + 777, "single-copy allreduce float64")


def single_copy_in_place_keeps_the_order():
    """In place by single copy with the reduce-after cfunc, over 16 chunks so that every rank
    claims some: Min, a select whose result shows the operands' order where they are zeros of
    both signs or NaNs (each rank's own payload), then a Sum with Average's division finished
    where each chunk is reduced; the bits of the reduction in rank order."""
    dtype = np.dtype(np.float32)
    count = 16 * SHM_SINGLE_COPY_CHUNK_BYTES // dtype.itemsize + 1000
    inputs = [np.random.default_rng([600, r]).standard_normal(count).astype(dtype) for r in range(N)]
    for r, x in enumerate(inputs):
        x[0::7] = 0.0 if r % 2 == 0 else -0.0
        x.view(np.uint32)[3::7] = 0x7FC00000 + r + 1  # a NaN of this rank's own payload

    def op_min(a, b):  # kernels.ops.op_min, elementwise: a select, which keeps a NaN's payload
        return np.where((a < b) | np.isnan(a), a, b)
    expected = rank_order(inputs, op_min)
    for r in range(1, N):  # a rank's own input reduced first, as a swapped reduce_after would
        c.CHECKS.check(expected.tobytes() != rank_order([inputs[r], *inputs[:r], *inputs[r + 1:]], op_min).tobytes(),
                       f"Min in place: the data does not show rank {r}'s input reduced first")
    sums = [np.random.default_rng([601, r]).standard_normal(count).astype(dtype) for r in range(N)]
    average = rank_order(sums, np.add)
    kernels.divide_into(average, N)
    for op, data, finish, want in ((fastring.Min, inputs, (), expected),
                                   (fastring.Sum, sums, (kernels.finish_cfunc(dtype), N, 1.0), average)):
        x = data[R].copy()
        ran = shm.allreduce(array_address(x), array_address(x), x.nbytes, kernels.reduce_cfunc(KERNEL_OP[op], dtype),
                            dtype.itemsize, False, False, *finish,
                            reduce_after_fn=kernels.reduce_after_cfunc(KERNEL_OP[op], dtype))
        c.CHECKS.check(ran == "single copy", f"{op.name} in place: ran {ran!r}")
        c.CHECKS.check(x.tobytes() == want.tobytes(), f"{op.name} in place, reduced into the input: not the bits "
                       "of the reduction in rank order")
        c.check_identical(f"{op.name} in place, reduced into the input", x)


single_copy_in_place_keeps_the_order()
# Rank 0's preference for the rounds sends every rank there; another rank's alone does not.
single_copy_allreduce(np.dtype(np.float32), F32_COUNT, "rounds by rank 0's choice", R == 0, "rounds by choice")
single_copy_allreduce(np.dtype(np.float32), F32_COUNT, "rounds by another rank's choice", R != 0)
# Above a buffer the segment's buffers take the pipeline (shm.pyx, _pipeline): tiles that wrap
# around the slots many times, parts of uneven length, in rank order (np=3, where more ranks than
# cores would take the rounds: forced), in place right after out=; then tiles of a size that is
# no multiple of a cache line or of the element.
c.CHECKS.check(shm.pipelined == (N <= len(os.sched_getaffinity(0))), "pipelined although oversubscribed, or not")
pipelined = shm.pipelined
shm.pipelined = True
single_copy_allreduce(np.dtype(np.float32), SHM_TILE_BYTES // 4 + F32_COUNT, "pipeline by rank 0's choice", R == 0,
                      "pipeline by choice")
shm.pipeline_tile = 40_004
single_copy_allreduce(np.dtype(np.float64), SHM_TILE_BYTES // 8 + 4097, "pipeline, odd tiles", R == 0,
                      "pipeline by choice")
shm.pipeline_tile = SHM_PIPELINE_TILE_BYTES
shm.pipelined = pipelined
# Through the API, one buffer over and over: single copy, then the rounds, then the faster
# (PathTimes), every result exact.
paths_of = fastring.algorithms.shm._PATHS
big = [c.rank_input(np.dtype(np.int32), F32_COUNT, r, 700) for r in range(N)]
mine = np.empty_like(big[R])
for call in range(4):
    np.copyto(mine, big[R])
    fastring.allreduce(mine, op=fastring.Sum, name="one buffer", out=mine)
    c.check_close(f"one buffer, call {call}", mine, np.add.reduce(np.stack(big), dtype=np.int32), 0)
measured = paths_of.times.get((array_address(mine), mine.nbytes))
c.CHECKS.check(measured is not None and None not in measured[:2], f"both paths not measured: {measured}")

# A single copy that fails: the last rank publishes an address nothing is mapped at (page 1),
# and sends nothing to itself, so only the copies of its bytes fail, whichever rank makes them.
matrix = np.full((N, N), shm.single_copy_bytes, np.int64)
matrix[N - 1, N - 1] = 0
displs = np.arange(N, dtype=np.int64) * shm.single_copy_bytes
send = np.ones(N * shm.single_copy_bytes, np.uint8)
received = np.zeros(N * shm.single_copy_bytes, np.uint8)
src_address = 4096 if R == N - 1 else array_address(send)
c.expect_error("a failed single copy", lambda: shm.alltoallv(src_address, matrix, displs, array_address(received),
                                                             displs), fastring.FastringError, "Bad address", "off")
c.CHECKS.check(not rt.transport.single_copy, "single copy is still on after a copy failed")
results_area("without single copy")

# Without single copy the same calls go through the segment's buffers: a buffer's worth and
# N + 1 elements more (the allreduce pipelined, or in rounds where oversubscribed: np=3 on two
# cores); the transport itself in rounds, with parts of one element and empty parts (count < N).
above = "pipeline" if shm.pipelined else "rounds"
dtypes_and_ops([np.dtype(np.int32), np.dtype(np.float16), np.dtype(np.float64)],
               lambda dt: (SHM_TILE_BYTES // dt.itemsize + N + 1,), above)
finished_where_reduced(lambda dt: (SHM_TILE_BYTES // dt.itemsize + N + 1,), above)
collectives_loops("rounds", shm.tile_bytes)
unstreamed(counted_allgathers, "rounds, streaming stores")
unstreamed(counted_alltoalls, "rounds, streaming stores")
shm.streaming_bytes = SHM_STREAMING_STORE_BYTES
for count in (1, N - 1, N, 2 * N + 1):
    a = np.arange(count, dtype=np.float64) + R
    out = np.full(count, -1.0)
    shm.allreduce(array_address(a), array_address(out), a.nbytes, sum_f64, 8, False)
    c.check_close(f"transport rounds n={count}", out, N * np.arange(count) + N * (N - 1) / 2, 0)

for bad in ((12, 8, True), (SHM_TILE_BYTES + 8, 8, True)):
    try:
        shm.allreduce(array_address(a), array_address(out), bad[0], sum_f64, bad[1], bad[2])
        c.CHECKS.fail(f"shm.allreduce accepted {bad}")
    except ValueError as e:
        c.CHECKS.check("must" in str(e), f"unclear error {e}")

# Average's division and the postscale run once per element, in every round.
length = 3 * SHM_TILE_BYTES // 8 + 7
xs = [c.rank_input(np.dtype(np.float32), length, r, 11) for r in range(N)]
exp, bound = c.reference(xs, fastring.Sum, N)
got = fastring.allreduce(xs[R].copy(), op=fastring.Average, postscale_factor=3.0, name="avg post")
c.check_close("average postscaled", got, exp / N * 3.0, 3.0 * (bound / N + 2 * c.EPS[np.dtype(np.float32)] * np.abs(exp / N)))
c.check_identical("average postscaled", got)

# out= another array; the input is left as it was.
src = xs[R].copy()
dst = np.zeros_like(src)
r = fastring.allreduce(src, op=fastring.Sum, out=dst, name="out other")
c.CHECKS.check(r is dst, "out= returned another object")
c.check_close("out other", dst, exp, bound)
c.check_close("out other input", src, xs[R], 0)

# Fusion: 40 async requests of 30 KB fuse into batches that run through the segment, each
# batch reduced from where its tensors lie (SharedMemory.run_pieces, counted), and a grouped
# allreduce takes the engine's lean path (Engine.lone_grouped, counted).
read_in_pieces, lean = [], []
real_run_pieces, real_lone_grouped = SharedMemory.run_pieces, Engine.lone_grouped
SharedMemory.run_pieces = staticmethod(lambda rt_, r, *p: read_in_pieces.append(r.flat.nbytes) or real_run_pieces(rt_, r, *p))


def counted_lone_grouped(self, *args):
    results = real_lone_grouped(self, *args)
    if results is not None:
        lean.append(args[3])  # the name
    return results


Engine.lone_grouped = counted_lone_grouped
parts = [[c.rank_input(np.dtype(np.int32), 7500, r, 100 + i) for r in range(N)] for i in range(40)]
handles = [fastring.allreduce_async(p[R].copy(), op=fastring.Sum, name=f"fused.{i}") for i, p in enumerate(parts)]
for i, h in enumerate(handles):
    c.check_close(f"fused {i}", fastring.synchronize(h), np.add.reduce(np.stack(parts[i])), 0)
grouped = [[c.rank_input(np.dtype(np.float32), 10_000, r, 200 + i) for r in range(N)] for i in range(100)]
results = fastring.grouped_allreduce([g[R].copy() for g in grouped], op=fastring.Average, name="grouped")
for i, g in enumerate(grouped):
    e, b = c.reference(g, fastring.Average, N)
    c.check_close(f"grouped {i}", results[i], e, b)
# (a request that rides its negotiation cycle, as the first of the fused ones may, is not read in pieces)
c.CHECKS.check(read_in_pieces[-1] == 100 * 40_000 and read_in_pieces[:-1] and all(n % 30_000 == 0 for n in read_in_pieces[:-1]),
               f"the batches were not read in pieces: {read_in_pieces}")
c.CHECKS.check(lean == ["grouped"], f"the grouped call did not take the lean path: {lean}")
# Integers, exactly: a grouped Sum of more than a buffer (several rounds), of a one-step size,
# of every shape (empty tensors, 0-d, 3-d); the asynchronous form (the general path, read in
# pieces too); then a fused batch of 130 cached requests (three words of cache bits), run twice.
shapes = [(), (0,), (3, 0, 2), (17, 3, 5), (1,), (SHM_ONE_STEP_BYTES // 4 + 11,)]
for count, tag in ((SHM_TILE_BYTES // 4 // 50 + 7, "rounds"), (SHM_ONE_STEP_BYTES // 4 // 50 - 3, "one step"),
                   (None, "shapes")):
    read_in_pieces.clear()
    gi = [[c.rank_input(np.dtype(np.int32), count if count else shapes[i % len(shapes)], r, 400 + i) for r in range(N)]
          for i in range(50 if count else len(shapes))]
    for how, call in (("", fastring.grouped_allreduce), (" async", lambda *a, **k: fastring.grouped_allreduce_async(*a, **k).wait())):
        outs = call([g[R].copy() for g in gi], op=fastring.Sum, name=f"grouped int {tag}{how}")
        for i, g in enumerate(gi):
            c.CHECKS.check(outs[i].shape == g[R].shape and outs[i].dtype == np.int32, f"grouped int {tag}{how} {i}: shape")
            c.check_close(f"grouped int {tag}{how} {i}", outs[i], np.add.reduce(np.stack(g)), 0)
    total = sum(g[R].nbytes for g in gi)
    c.CHECKS.check(read_in_pieces == [total, total], f"grouped int {tag}: read in pieces {read_in_pieces}")
c.CHECKS.check(lean[-3:] == ["grouped int rounds", "grouped int one step", "grouped int shapes"], f"lean: {lean}")
# The general path where the lean one must not go: a strided tensor, mixed dtypes (an error
# on every rank), a group that rides its cycle; results are new arrays that do not share the
# inputs' memory.
lean.clear()
read_in_pieces.clear()
strided = [c.rank_input(np.dtype(np.int64), (300, 200), r, 600) for r in range(N)]
outs = fastring.grouped_allreduce([strided[R][:, ::2], np.ones(100_000, np.int64)], op=fastring.Sum, name="grouped strided")
c.check_close("grouped strided", outs[0], np.add.reduce(np.stack(strided))[:, ::2], 0)
c.check_close("grouped strided, second", outs[1], np.full(100_000, N), 0)
c.expect_error("grouped mixed dtypes", lambda: fastring.grouped_allreduce([np.ones(40_000, np.float32), np.ones(2)]),
               TypeError, "one dtype")
outs = fastring.grouped_allreduce([np.ones(3, np.int32), np.ones(4, np.int32)], op=fastring.Sum, name="grouped small")
c.check_close("grouped small", np.concatenate(outs), np.full(7, N), 0)
c.CHECKS.check(lean == [] and read_in_pieces == [], f"the lean path took a call it must not: {lean} {read_in_pieces}")
# The ranks disagree: the last rank's group has another shape. Every rank raises a mismatch
# naming the shape (the lean call hands over to the general path, which explains it), and the
# next grouped call works.
mine = [np.ones(30_000, np.float32), np.ones(30_000 + (R == V), np.float32)]
c.expect_error("grouped mismatch", lambda: fastring.grouped_allreduce(mine, op=fastring.Sum, name="grouped mismatch"),
               fastring.FastringError, "mismatch", "shape")
outs = fastring.grouped_allreduce(mine[:1] * 3, op=fastring.Sum, name="grouped after mismatch")
c.check_close("grouped after mismatch", np.concatenate(outs), np.full(90_000, N), 0)
SharedMemory.run_pieces, Engine.lone_grouped = staticmethod(real_run_pieces), real_lone_grouped
small = [[c.rank_input(np.dtype(np.int64), 33, r, 500 + i) for r in range(N)] for i in range(130)]
for round_ in range(2):
    handles = [fastring.allreduce_async(p[R].copy(), op=fastring.Sum, name=f"small.{i}") for i, p in enumerate(small)]
    for i, h in enumerate(handles):
        c.check_close(f"small {round_} {i}", fastring.synchronize(h), np.add.reduce(np.stack(small[i])), 0)

# Compression: the 16-bit wire format's rounding, on the same data as the plain call.
cx = [c.rank_input(np.dtype(np.float32), 100_000, r, 300) for r in range(N)]
e, b = c.reference(cx, fastring.Sum, N)
got = fastring.allreduce(cx[R].copy(), op=fastring.Sum, compression=fastring.Compression.fp16, name="fp16")
c.check_close("fp16 compression", got, e, b + N * c.EPS[np.dtype(np.float16)] * np.abs(e) * 2)
c.check_identical("fp16 compression", got)

# The cycle through the segment: ranks that propose different requests still agree.
a_in, b_in = np.ones(10), np.full(10, 2.0)
if R % 2:
    hb = fastring.allreduce_async(b_in, name="b")
    ha = fastring.allreduce_async(a_in, name="a")
else:
    ha = fastring.allreduce_async(a_in, name="a")
    hb = fastring.allreduce_async(b_in, name="b")
c.check_close("crossed a", fastring.synchronize(ha), a_in, 0)  # Average of equal inputs
c.check_close("crossed b", fastring.synchronize(hb), b_in, 0)

# A results area /dev/shm has no room for: the segment comes without one.
from fastring._transport import Transport  # noqa: E402
from fastring._transport.shm import SharedSegment  # noqa: E402
spare = Transport(c.COMM.Dup())
seg, why = SharedSegment.attach(spare, 1 << 16, 81920, 1 << 50)
c.CHECKS.check(seg is not None and why is None and seg.results is None and seg.results_bytes == 0,
               f"a segment with a results area too large for /dev/shm: {seg}, {why}")
if seg is not None:
    seg.close()
spare.free()

# FASTRING_SHM=0: the MPI paths, and the debug log says why; then a fresh segment again.
os.environ["FASTRING_SHM"] = "0"
fastring.shutdown()
c.check_close("a result from the area after shutdown", kept, np.concatenate(kept_parts), 0)
kept[:] = 7
c.CHECKS.check(bool((kept == 7).all()), "a result from the area is not writable after shutdown")
del kept
fastring.init()
c.CHECKS.check(runtime().shm is None, "FASTRING_SHM=0 left the path on")
c.CHECKS.check("shared-memory path off: FASTRING_SHM=0" in log.getvalue(), f"no reason logged: {log.getvalue()}")
got = fastring.allreduce(xs[R].copy(), op=fastring.Sum, name="off")
c.check_close("FASTRING_SHM=0", got, exp, bound)
lone_cycles(runtime().transport, "MPI")
os.environ["FASTRING_SHM"] = "1"
fastring.shutdown()
fastring.init()
c.CHECKS.check(runtime().shm is not None and not leftovers(), "a second init did not map a fresh segment")
got = fastring.allreduce(xs[R].copy(), op=fastring.Sum, name="again")
c.check_close("after re-init", got, exp, bound)

# A single-copy allreduce whose copies the kernel refuses (a seccomp filter: EPERM, as a
# container's policy might): every rank still meets both barriers, raises FastringError naming
# the errno, and has single copy off after. Every rank refuses, so that each fails whichever
# chunks it claims (one failing rank is the alltoallv case above). Last in this worker: the
# filter stays for the process's lifetime.
shm = runtime().shm
shm.allreduce_single_copy_bytes = 1 << 20
c.CHECKS.check(runtime().transport.single_copy, "single copy is off after init")
refuse_cross_memory_copies()
big = c.rank_input(np.dtype(np.float32), SHM_TILE_BYTES // 2 + 3, R, 600)
c.expect_error("a refused single-copy allreduce", lambda: shm.allreduce(
    array_address(big), array_address(big), big.nbytes, sum_f32, 4, False), fastring.FastringError,
    os.strerror(errno.EPERM), "off")
c.CHECKS.check(not runtime().transport.single_copy, "single copy is still on after a refused copy")
c.done("shm check")
