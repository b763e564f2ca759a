"""Choosing between ways of moving a message by their measured times, alike on every rank.

Which of two correct ways is faster can depend on the machine, not only on the message: on one
host, a broadcast copied between processes (Cross Memory Attach) took up to 2x the time of
one streamed through the shared segment's rings on one CPU, and 0.35-0.6x on another
(BENCHMARKS.md, "Round 2, session 8"). So where it matters the ways are timed on the
user's own calls and the faster one kept.
"""
from __future__ import annotations

import math
import time

import numpy as np

from .. import kernels
from .._core.config import PATH_TIMING_PERIOD_CALLS, RETRY_COST_SHARE, SHM_STORE_WAYS
from .._core.ops import KERNEL_OP, ReduceOp
from .._transport import array_address


class TimedChoice:
    """Which of `ways` runs a call of `nbytes` (messages are told apart by their power of two).

    Each way first runs `tries` times in turn, timed; from then on the way with the lowest of
    its last `kept` times runs, and each way is timed once more in the last calls of every
    `period` calls: a way that became the faster wins at its next timing, one that became
    the slower loses once its last `kept` times are all slow, and only a few calls pay for
    timing. A way slower than the chosen one is warmed and timed in one period of every
    `retry_every` periods, so that its tries cost about `share` of the calls' time at most
    however slow it is (on one machine a way ran 5x slower than the other in some launches,
    and its timings alone cost a twelfth of the calls' time); the slower it was, the later a
    way that has become the faster is found. Every timed call comes right after an untimed
    call of the same way: a way's
    first call after the other way's traffic (or the first of its size) measured up to twice
    its time (its buffers no longer in the cache), which kept the slower way chosen
    (BENCHMARKS.md, "Round 2, session 9"). A timing of the chosen way more than `relearn`
    times its lowest kept time is not kept: the next call times the chosen way again, and if
    that one is as slow too, the tries start afresh. The machine's state can change within a
    launch (a hand-over of lines between the cores 3-10x slower), and waiting for `kept` slow
    timings, one a period, ran the slower way for 192 calls (BENCHMARKS.md, "Round 2, session
    13"); a single preempted call, on a machine running more processes than cores, must not
    cost the tries. The times recorded must be the same on every rank
    (`slowest`), so that every rank makes the same choices; `pick` says when a call is to be
    timed, and only those calls pay for that agreement.

    Example:
        >>> c, seen = TimedChoice(("stream", "copy"), period=8), []
        >>> for _ in range(32):
        ...     way, timed = c.pick(1 << 20)
        ...     seen.append(way[0] + ("*" if timed else ""))
        ...     if timed:
        ...         c.record(1 << 20, way, {"stream": 3e-4, "copy": 1e-4}[way])
        >>> " ".join(seen)   # * timed, after a call to warm up: each twice, then the faster,
        ...                  # it again every 8 calls, the 3x slower one in one period of
        ...                  # retry_every(3e-4, 1e-4, 3, 8) = 75 (at most 1% of the time)
        's s* c c* s s* c c* c c c c c c c c* c c c c c c c c* c c c c c c c c*'
    """

    kept = 3  # times kept per way: the lowest of them counts, so one slow call does not flip it
    relearn = 3.0  # the chosen way this many times slower than its lowest kept time, twice: try afresh
    share = RETRY_COST_SHARE  # the most the slower way's retries may add to the calls' time
    # what a retry costs, in calls of the slower way over the chosen one's: the call that warms
    # it, the timed call, and the chosen way's next call, which finds its buffers out of cache
    retry_calls = 3

    def __init__(self, ways: tuple, period: int = PATH_TIMING_PERIOD_CALLS, tries: int = 2):
        if period < 2 * len(ways) or tries < 1:
            raise ValueError(f"a period of {period} calls cannot warm up and time {len(ways)} ways; "
                             "tries must be at least 1")
        self.ways, self.period, self.tries = tuple(ways), period, tries
        self._timed_from = period - 2 * len(ways)  # the calls of a period from here on are timed
        # power of two -> [calls, the faster way once each was tried, [times of each way],
        #                  whether its last timing was over `relearn` times its lowest]
        self._sizes: dict[int, list] = {}

    def pick(self, nbytes: int) -> tuple:
        """(the way to run, whether to time it and `record` the slowest rank's time)."""
        entry = self._sizes.get(nbytes.bit_length())
        if entry is None:
            entry = self._sizes[nbytes.bit_length()] = self._afresh()
        calls, faster = entry[0], entry[1]
        entry[0] = calls + 1
        if entry[3]:  # the chosen way's last timing was slow: again, right after it
            return faster, True
        if faster is None:  # the tries: each way warmed up and timed in turn
            phase = calls % (2 * len(self.ways))
            return self.ways[phase // 2], phase % 2 == 1
        phase = calls % self.period - self._timed_from
        if phase < 0:
            return faster, False
        i = phase // 2
        if self.ways[i] != faster:
            times = entry[2]
            every = retry_every(min(times[i]), min(times[self.ways.index(faster)]), self.retry_calls,
                                self.period, self.share)
            if every > 1 and calls // self.period % every:
                return faster, False
        return self.ways[i], phase % 2 == 1

    def run(self, rt, nbytes: int, run_way):
        """`run_way(way)` for the way `pick` chooses, timed where `pick` says so (the slowest
        rank's time: a collective); returns what it returned."""
        way, timed = self.pick(nbytes)
        began = time.perf_counter()
        result = run_way(way)
        if timed:
            self.record(nbytes, way, slowest(rt, time.perf_counter() - began))
        return result

    def record(self, nbytes: int, way, seconds: float) -> None:
        entry = self._sizes[nbytes.bit_length()]
        times = entry[2][self.ways.index(way)]
        if way == entry[1] and seconds > self.relearn * min(times):
            if entry[3]:  # the second in a row: the machine changed, not one call
                entry[:] = self._afresh()
            else:
                entry[3] = True
            return
        entry[3] = False
        times.append(seconds)
        del times[:-self.kept]
        if all(len(t) >= self.tries for t in entry[2]):
            entry[1] = min(zip(self.ways, entry[2]), key=lambda way_times: min(way_times[1]))[0]

    def _afresh(self) -> list:
        return [0, None, [[] for _ in self.ways], False]


def retry_every(slower: float, faster: float, calls: float, period: int, share: float = RETRY_COST_SHARE) -> int:
    """In how many periods of `period` calls a way (or path) that took `slower` seconds a call
    against the chosen one's `faster` is tried once, where a try costs `calls` of its calls
    over the chosen way's: as often as keeps its tries within `share` of the calls' time, and
    at least once a period. In time the interval is about calls * (slower - faster) / share,
    so a way that has become the faster is found within that: 300 times the difference of one
    call's times for three calls a try (a 1 MiB broadcast's stream at 300 µs against single
    copy's 43: 77 ms of calls).

    Example:
        >>> retry_every(2e-3, 1e-3, 1, 64)   # twice the time, one call a try: one period in 2 (0.8%)
        2
        >>> retry_every(6e-3, 1e-3, 3, 64)   # 6x, three calls a try: one period in 24
        24
        >>> retry_every(1e-3, 1e-3, 3, 64), retry_every(0.9e-3, 1e-3, 3, 64)
        (1, 1)
    """
    return max(1, math.ceil(calls * (slower - faster) / (share * period * max(faster, 1e-12))))


def slowest(rt, seconds: float) -> float:
    """The largest of every rank's `seconds`, the same on every rank (a collective: recursive
    doubling over the transport).

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> from fastring._core.runtime import runtime
        >>> slowest(runtime(), 0.5)
        0.5
    """
    value = np.array([seconds])
    if rt.size > 1:
        rt.transport.recursive_doubling(array_address(value), value.nbytes, array_address(rt.scratch(value.nbytes)),
                                        kernels.reduce_cfunc(KERNEL_OP[ReduceOp.Max], value.dtype), value.itemsize)
    return float(value[0])


def choice_of(rt, collective: str, ways: tuple) -> TimedChoice:
    """The runtime's TimedChoice for `collective` (`rt.choices`: fastring.init may run again
    after shutdown, and a new runtime learns afresh).

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> from fastring._core.runtime import runtime
        >>> choice_of(runtime(), "broadcast", ("stream", "copy")) is runtime().choices["broadcast"]
        True
    """
    found = rt.choices.get(collective)
    if found is None:
        found = rt.choices[collective] = TimedChoice(ways)
    return found


def timed_stores(rt, collective: str, nbytes: int, call):
    """`call(streaming)`, by plain or streaming stores (SHM_STORE_WAYS), whichever the calls of
    `collective` of this size measured faster (`choice_of`); returns what it returned.

    Example:
        >>> import fastring
        >>> fastring.init()
        >>> from fastring._core.runtime import runtime
        >>> timed_stores(runtime(), "allreduce", 1 << 20, lambda streaming: streaming)   # plain first
        False
    """
    return choice_of(rt, collective, SHM_STORE_WAYS).run(rt, nbytes, lambda way: call(way == "streaming"))
