"""The one-host allreduce: through the host's shared segment (fastring._transport.shm), no MPI
message, when every rank runs on this host and `init` could map the segment."""
from __future__ import annotations

import time

from .. import kernels
from .._core.config import SHM_ALLREDUCE_RETRY_CALLS, SHM_ONE_STEP_BYTES, SHM_TIMED_CHOICE_MIN_BYTES
from .._core.ops import KERNEL_OP
from .._core.work import Finish
from .._transport import array_address
from .base import Message, Reduction
from .choice import retry_every, timed_stores


class SharedMemory:
    """Every rank copies its input into its buffer of the segment and reduces its part of the
    result by reading the others' buffers directly, then copies the other parts from where
    they were reduced (one barrier up to SHM_ONE_STEP_BYTES, where every rank reduces the
    whole message in rank order instead; above a buffer of the segment the same pipelined tile
    by tile; from SHM_ALLREDUCE_SINGLE_COPY_BYTES, where the ranks may copy between their
    memories, each chunk is read from every rank, reduced and written into every rank by
    whichever rank claims it, or pipelined where that measured faster for that buffer:
    `PathTimes`). Any dtype and op the kernels reduce; each
    element is reduced by one rank (or by all alike), so the results are bitwise identical
    everywhere."""

    name = "shm"
    selectable = True

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.rt is not None and m.rt.shm is not None and m.device == "cpu" and m.wire is None

    available = accepts

    @staticmethod
    def run_pieces(rt, r: Reduction, addresses, lengths) -> bool:
        """`run` of an input that lies in pieces (a group's tensors where they are: `lengths`
        bytes at `addresses`, int64 arrays, which `r.flat` receives one after another) read
        where they lie, without gathering them into one buffer first. Returns False, having
        done nothing, where the segment would not read them so (`run` must take a gathered
        copy then)."""
        reduce_fn, itemsize, one_step, finishing, _ = _call_args(rt.shm, r)
        with r.phase("shm-allreduce"):
            if not _stores(rt, r.flat.nbytes, lambda streaming: rt.shm.allreduce_pieces(
                    addresses, lengths, array_address(r.flat), reduce_fn, itemsize, one_step, *finishing,
                    streaming=streaming), most=rt.shm.pieces_single_copy_bytes - 1):
                return False
            if not finishing:
                r.finalize(r.flat)
        return True

    @staticmethod
    def run(rt, r: Reduction) -> None:
        flat = r.flat
        src = flat if r.src is None else r.src
        shm = rt.shm
        reduce_fn, itemsize, one_step, finishing, reduce_after_fn = _call_args(shm, r)
        with r.phase("shm-allreduce"):
            if flat.nbytes < shm.allreduce_single_copy_bytes:  # no path to choose: only the stores
                _stores(rt, flat.nbytes, lambda streaming: shm.allreduce(
                    array_address(src), array_address(flat), flat.nbytes, reduce_fn, itemsize, one_step, False,
                    *finishing, streaming=streaming), most=shm.tile_bytes)
            else:
                key = (array_address(flat), flat.nbytes)
                start = time.perf_counter()
                ran = shm.allreduce(array_address(src), key[0], flat.nbytes, reduce_fn, itemsize, one_step,
                                    _PATHS.prefer_buffers(key), *finishing, reduce_after_fn=reduce_after_fn)
                if ran == "single copy" or ran.endswith("by choice"):
                    _PATHS.record(key, ran == "single copy", time.perf_counter() - start)
            if not finishing:
                r.finalize(flat)


def _stores(rt, nbytes: int, call, most: int):
    """`call(streaming)`: whether what the ranks write for each other goes by streaming stores
    is timed on the calls from SHM_TIMED_CHOICE_MIN_BYTES up to `most` bytes (`timed_stores`:
    one step and rounds up to a buffer, a group's rounds below SHM_PIECES_SINGLE_COPY_BYTES,
    where allreduce_pieces declines to single copy, so that no declined call is timed);
    smaller ones, and the pipeline above a buffer, use plain stores. Returns call's result."""
    if not SHM_TIMED_CHOICE_MIN_BYTES <= nbytes <= most:
        return call(False)
    return timed_stores(rt, "allreduce", nbytes, call)


# (buffer bytes, dtype name, op, message bytes, Finish's divisor and factor or None) -> its
# `_call_args`: a training step repeats the same allreduces, and deriving them cost 2.8 us a
# call against 0.3 for the lookup (BENCHMARKS.md, "Round 2, session 25")
_CALL_ARGS: dict[tuple, tuple] = {}
CALL_ARGS_KEPT = 1024  # distinct reductions remembered (then derived each call)


def _call_args(shm, r: Reduction) -> tuple:
    """(reduce cfunc, itemsize, one step?, finishing, reduce-after cfunc) of `r` for the
    segment's allreduce calls. `finishing`: a Finish runs piece by piece where each piece is
    reduced, while in cache (its cfunc and arguments); () where `r.finalize` runs on the whole
    result after. The reduce-after cfunc (dst = src op dst) lets a single copy in place reduce
    a rank's input into itself; 0 below the single-copy size, which never needs it (and so
    never compiles it)."""
    spec, finish = r.spec, r.finalize
    finishes = isinstance(finish, Finish)
    key = (shm.tile_bytes, spec.name, r.op, r.flat.nbytes, (finish.divisor, finish.factor) if finishes else None)
    args = _CALL_ARGS.get(key)
    if args is None:
        args = (kernels.reduce_cfunc(KERNEL_OP[r.op], spec.dtype), spec.dtype.itemsize,
                r.flat.nbytes <= min(SHM_ONE_STEP_BYTES, shm.tile_bytes),
                (kernels.finish_cfunc(spec.dtype), finish.divisor, finish.factor) if finishes else (),
                kernels.reduce_after_cfunc(KERNEL_OP[r.op], spec.dtype)
                if r.flat.nbytes >= shm.allreduce_single_copy_bytes else 0)
        if len(_CALL_ARGS) < CALL_ARGS_KEPT:
            _CALL_ARGS[key] = args
    return args


class PathTimes:
    """Which path a single-copy-sized allreduce of one buffer takes: single copy or through the
    segment's buffers (the pipeline; the rounds with more ranks than cores), by the fastest of
    each one's last `kept` times for that buffer (its address and size). The pipeline was the
    faster at 16 and 64 MiB, most of all on memory without huge pages (a copy between
    processes pins every page it touches), but its tiles wait on each other, and with more
    busy processes than cores it ran up to 10x slower, where single copy's claimed chunks went
    on (BENCHMARKS.md, "Issue 18 (round 2, session 5)"). The calls of a buffer alternate, single
    copy first, until each path has been timed twice, then the faster runs, the other once in
    every `retry` calls, or once in so many times `retry` calls that its tries cost at most
    RETRY_COST_SHARE of the calls' time (`choice.retry_every`): a first call pays for what it
    touches first (the segment's pages, a peer preempted), and one slow first time must not
    send a buffer to the slower path for `retry` calls; and in the machine's slow state the
    pipeline took 4x single copy's time at 5-16 MiB, so retrying it every `retry` calls cost
    7% of the calls' time (BENCHMARKS.md, "Round 2, session 13"). Only rank 0's preference
    counts (the segment publishes it), so the ranks always agree.

    Example:
        >>> p = PathTimes(retry=4); key = (0x1000, 16 << 20)
        >>> p.prefer_buffers(key)
        False
        >>> p.record(key, True, 2e-3); p.prefer_buffers(key)
        True
        >>> p.record(key, False, 5e-3); p.prefer_buffers(key)   # a slow first pipelined call
        False
        >>> p.record(key, True, 2e-3); p.prefer_buffers(key)    # the pipeline's second chance
        True
        >>> p.record(key, False, 1.5e-3)   # the pipeline faster: single copy once in
        >>> [p.prefer_buffers(key) for _ in range(136)].count(False)   # 4 * retry_every(...) = 68
        2
        >>> p.record(key, False, 0.5e-3)   # 4x faster: single copy once in 4 * 150 calls
        >>> [p.prefer_buffers(key) for _ in range(1200)].count(False)
        2
    """

    most = 256  # buffers remembered; past that the table starts over
    kept = 3    # times kept per path: the fastest of them counts, so one slow call does not flip
    # what a try of the slower path costs, in its calls over the faster's: the call, and the
    # next one's, which finds its buffers out of cache
    retry_calls = 2

    def __init__(self, retry: int = SHM_ALLREDUCE_RETRY_CALLS):
        self.retry = retry
        self.times: dict[tuple[int, int], list] = {}  # key -> [single copy times, pipeline times, calls]

    def prefer_buffers(self, key: tuple[int, int]) -> bool:
        t = self.times.get(key)
        if t is None:
            return False
        if len(t[0]) < 2 or len(t[1]) < 2:
            return len(t[1]) < len(t[0])  # alternating, single copy first
        t[2] += 1
        single, buffers = min(t[0]), min(t[1])
        every = retry_every(max(single, buffers), min(single, buffers), self.retry_calls, self.retry)
        return (buffers < single) != (t[2] % (self.retry * every) == 0)

    def record(self, key: tuple[int, int], single_copy: bool, seconds: float) -> None:
        t = self.times.get(key)
        if t is None:
            if len(self.times) >= self.most:
                self.times.clear()
            t = self.times[key] = [[], [], 0]
        times = t[0 if single_copy else 1]
        times.append(seconds)
        del times[:-self.kept]


_PATHS = PathTimes()
