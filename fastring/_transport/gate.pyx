# cython: language_level=3
"""`Gate`: where the engine's background thread waits for work, with the GIL released.

A thread that waits in Python must take the interpreter lock each time it looks at the queue.
While another thread submits and drives a burst of collectives itself, each such look hands
the lock over twice, and on a machine where a futex costs microseconds that is what a burst
of small tensors costs most (about 0.5 us a tensor where the submitting framework lets go of
the lock between calls). The gate keeps what the background thread's decision needs where C
can read it: the queue (a dict, whose size is read without the lock), the time of the latest
submission, how many threads drive their own cycles, whether another rank still has work. It
looks once a cycle time (the first look, too, a cycle time after the call: a burst gathers,
and the thread's own cycles come no faster) and takes the lock only to act.
"""

from cpython.object cimport PyObject
from posix.time cimport nanosleep, timespec

from .mpi cimport now

cdef extern from "Python.h":
    Py_ssize_t PyDict_GET_SIZE(PyObject* d) nogil

cdef enum:
    _LOOK_AGAIN = -1
    _RUN = 0    # run a cycle now
    _IDLE = 1   # nothing to do for a while: wait in Python until a submission wakes the thread
    _STOP = 2   # closed: the engine shuts down

# What `Gate.wait` returns.
RUN, IDLE, STOP = _RUN, _IDLE, _STOP


cdef class Gate:
    """The background thread's view of one engine's queue.

    The engine calls `submitted` before it queues a request, and sets `drivers` (threads in
    its drive loop) and `keep_cycling` (another rank still had work after the last cycle);
    `queue` is the engine's dict of queued requests, emptied in place, never replaced.
    `quiet_cycles`, `most_cycles` and `idle_cycles` are in cycle times (see `decide`).

    Example:
        >>> queue = {}
        >>> gate = Gate(queue, 0.5, 5, 100)
        >>> gate.submitted(10.0)   # (with nothing queued)
        >>> gate.decide(10.05, 0.001) is None   # nothing queued, but a submission lately
        True
        >>> gate.decide(10.2, 0.001) == IDLE
        True
        >>> gate.submitted(10.2); queue["a"] = object()   # told, then queued
        >>> gate.decide(10.2002, 0.001) is None, gate.decide(10.201, 0.001) == RUN  # coming; quiet
        (True, True)
    """
    cdef object _queue  # keeps the dict `_size` reads alive
    cdef PyObject* _size
    cdef readonly double last_submit  # time.monotonic() of the latest submission
    cdef public int drivers
    cdef public bint keep_cycling
    cdef bint _closed
    cdef double _queued_since  # about when the oldest queued request was submitted
    cdef double _quiet, _most, _idle

    def __cinit__(self, dict queue not None, double quiet_cycles, double most_cycles, double idle_cycles):
        self._queue = queue
        self._size = <PyObject*> queue
        self._quiet, self._most, self._idle = quiet_cycles, most_cycles, idle_cycles

    def submitted(self, double at) -> None:
        """A request is about to be queued at `at` (time.monotonic()): told first, so that a
        look that finds it queued finds its time too."""
        self.last_submit = at
        if PyDict_GET_SIZE(self._size) == 0:  # this one will be the oldest
            self._queued_since = at

    def close(self) -> None:
        """Make `wait` return STOP (within a cycle time, on the waiting thread)."""
        self._closed = True

    def wait(self, double cycle_s) -> int:
        """Look every `cycle_s` seconds, the first time `cycle_s` from now, with the GIL
        released, until `decide` says RUN, IDLE or STOP; return that."""
        cdef int decision
        cdef timespec pause
        pause.tv_sec = <long> cycle_s
        pause.tv_nsec = <long> ((cycle_s - pause.tv_sec) * 1e9)
        with nogil:
            while True:
                nanosleep(&pause, NULL)
                decision = self._decide(now(), cycle_s)
                if decision != _LOOK_AGAIN:
                    break
        return decision

    def decide(self, double at, double cycle_s) -> int | None:
        """The decision of one look at time `at` (time.monotonic()): None to look again a
        cycle time later.

        With requests queued: while submissions keep coming (the latest within `quiet_cycles`)
        or a thread drives its own cycles (which run the whole queue), the queue is left to
        them for `most_cycles` from the oldest request's submission, or from this thread's
        last cycle where that came later (a steady stream, whose queue never empties), so
        that a burst fuses into one cycle and a steady stream still progresses; otherwise RUN.
        With none: RUN if another rank still has work, IDLE once nothing was submitted for
        `idle_cycles`, else look again (a training loop's next burst then costs no wake-up).
        """
        decision = self._decide(at, cycle_s)
        return None if decision == _LOOK_AGAIN else decision

    cdef int _decide(self, double at, double cycle_s) noexcept nogil:
        cdef bint busy
        if self._closed:
            return _STOP
        if PyDict_GET_SIZE(self._size) == 0:
            if self.keep_cycling:
                return _RUN
            return _IDLE if at - self.last_submit >= self._idle * cycle_s else _LOOK_AGAIN
        busy = self.drivers > 0 or at - self.last_submit < self._quiet * cycle_s
        if busy and at - self._queued_since < self._most * cycle_s:
            return _LOOK_AGAIN
        self._queued_since = at  # what this cycle leaves was queued after it began
        return _RUN
