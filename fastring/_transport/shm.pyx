# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""One host at memory speed: a POSIX shared-memory segment shared by every rank of a
communicator whose ranks all run on one host, and the collectives that move bytes through it
with loads and stores instead of MPI messages.

Layout (every area on its own cache lines):

    [sequence word of rank 0 | ... of rank n-1]            one 128-byte line each
    [claim counter]                                        one line
    [address table of rank 0 | ... of rank n-1]            2n + 3 words each (`_table`)
    [cycle slot 0 and 1 of rank 0 | ... of rank n-1]       negotiation blocks
    [data buffer 0 and 1 of rank 0 | ... of rank n-1]      `tile` bytes each
    [stream ring of rank 0 | ... of rank n-1]              `tile` bytes each (streams)

Synchronisation is one counter per rank: a rank that has written what the others need bumps
its counter, and a rank that needs it waits until every counter has reached its own (a
barrier on loads, no syscall while the peers keep up). Each kind of round (a data round, a
negotiation cycle) alternates between its two buffers, so a rank may start writing round k+1
while a slower peer still reads round k: the barrier of round k+1 cannot pass until every
rank has finished reading round k, and round k+2, which reuses round k's buffers, comes after
it. Every rank runs the same sequence of rounds (the engine agrees on what runs), so the
counters move in step.

Large messages, where every rank may read and write the others' memory (Cross Memory
Attach, `Transport.enable_single_copy`), do not bounce through the data buffers: each rank
publishes in its address table where its input and its result are, and after one barrier the
ranks split the message's chunks between them, claiming each from the shared claim counter:
whoever claims a chunk reads it from the ranks that hold it and writes it (or, for a
reduction, its reduction over every rank in rank order) into the ranks that need it, one
copy each way. A second barrier ends the call, when no rank touches another's memory any
more. Two barriers a call, however large: a rank that is preempted holds back at most the
chunk it was working on, and the others take the rest of the work.

Broadcasts stream instead (`stream_broadcast`): the root copies its bytes
into its ring piece by piece and publishes after each how far it got, and every other rank
copies each piece out once published and publishes how far it has read, which is what the root
waits for before it reuses ring space. The position is counted alike on every rank
(`_stream_begin`), so no call needs a barrier to start or end. Outputs of
SHM_STREAMING_STORE_BYTES and more are written with streaming stores (`copy_streaming`).
Allgathers and alltoalls up to SHM_STREAM_EXCHANGE_MAX_BYTES of output stream the same way
(`_stream_exchange`), every rank at once, each writing into its own ring and reading the
others': after the one barrier that carries the row counts, each rank steps through the same
stream positions, at each writing its piece (an alltoall: a slot per destination), copying its
own block's part while its source is in the cache, and copying the peers' pieces out as soon
as they are published.

Allgather and alltoall results may lie in the results area that follows the segment in the
same object (`results`: blocks of each rank's part handed out by a fastring._core.pool.Arena),
which every rank maps: then each rank publishes where its result lies, and after one barrier
every rank writes its bytes straight into every rank's result (`_results_ready`,
`_direct_allgather`, `_direct_alltoall`): one copy, no syscall, and a barrier to end.

The segment is created by rank 0 under a name unique to the launch and unlinked as soon as
every rank has mapped it: nothing is left in /dev/shm after any exit, SIGKILL included (the
kernel frees the memory at the last unmap). The one moment a name exists is inside `attach`;
a rank 0 killed right then leaves it, and the next segment's rank 0 on the host removes it
(`remove_orphans`: the name carries its creator's pid). MPICH's own segment loses its name
there too (`unlink_mapped`), which MPICH would keep until MPI_Finalize. Waits spin, then yield, then sleep with a growing
pause, and call the stall hook on time, as the MPI waits do (mpi.pyx's `wait`): a peer that
stops answering is reported and, past FASTRING_STALL_SHUTDOWN_TIME, becomes an error. A wait
that gave up leaves this rank out of step with the others, so the segment refuses any later
call.
"""

from libc.stdint cimport int64_t, uint64_t, uintptr_t
from libc.stdlib cimport free
from posix.fcntl cimport O_CREAT, O_EXCL, O_RDWR
from posix.mman cimport MAP_POPULATE, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap, shm_open, shm_unlink
from posix.types cimport off_t, pid_t
from posix.unistd cimport close

from .broadcast cimport learn_root_share, root_part, root_share_of, vm_copy
from .cycle cimport HASH, HEADER_WORDS, PAYLOAD_BYTES, block_bytes, combine_blocks, lone_payload, lone_result
from .mpi cimport Link, TransportBase, back_off, now, reduce_fn_t

from .._core.config import (MPI_SEGMENT_PREFIX, SHM_ACTIVE_SPIN_SECONDS, SHM_ALLREDUCE_SINGLE_COPY_BYTES,
                            SHM_CYCLE_STREAMING_BYTES, SHM_HOT_SPIN_SECONDS,
                            SHM_PIECES_ROUND_BYTES, SHM_PIECES_SINGLE_COPY_BYTES, SHM_PIPELINE_TILE_BYTES, SHM_REDUCESCATTER_ROUND_BYTES,
                            SHM_SINGLE_COPY_BYTES,
                            SHM_SINGLE_COPY_CHUNK_BYTES, SHM_STREAM_EXCHANGE_LEAD_PIECES, SHM_STREAM_EXCHANGE_MAX_BYTES,
                            SHM_STREAM_LARGE_PIECE_BYTES, SHM_STREAM_PIECE_BYTES, SHM_STREAM_RESTART_BYTES,
                            SHM_STREAMING_STORE_BYTES, WAIT_CYCLE_SPIN_SECONDS)
from .._core.errors import FastringError
from .._core.pool import Arena
from .._core.shm_files import mapped_under, unlink_each

import mmap as pymmap
import os
import re
import secrets

import numpy as np

cimport numpy as cnp

cnp.import_array()

cdef extern from "<fcntl.h>" nogil:
    int posix_fallocate(int fd, off_t offset, off_t length)

cdef extern from "<sched.h>" nogil:
    int sched_yield()
    int sched_getcpu()

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t fr_load(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void fr_store(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
    /* The next index below `end` from the shared counter at p, or `end` when none is left:
       a compare-and-swap, so that the counter stops at `end` and the next call starts there. */
    static inline uint64_t fr_claim(uint64_t* p, uint64_t end) {
        uint64_t v = __atomic_load_n(p, __ATOMIC_RELAXED);
        while (v < end)
            if (__atomic_compare_exchange_n(p, &v, v + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
                return v;
        return end;
    }
    static inline void fr_relax(void) {
    #if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
    #elif defined(__aarch64__)
        __asm__ __volatile__("yield");
    #endif
    }
    #if defined(__x86_64__)
    #include <emmintrin.h>
    #endif
    #include <string.h>
    /* memcpy in 64-byte lines of SSE loads and stores onto aligned destination lines, with
       streaming (non-temporal) stores where `streaming`: each destination line is then written
       whole without being read first, and evicts nothing from the cache. glibc's memcpy copies
       8 KiB to ~1 MiB with `rep movsb`, which on this machine's CPU (AMD Zen 3) runs at a
       fifteenth of its speed when the destination lies 1-63 bytes past the source modulo 4 KiB:
       numpy's large arrays start 16 bytes into a page, the segment's buffers on one, so every
       copy out of the segment into a result was that case (scripts/bench_shm.py, BENCHMARKS.md
       "Round 2, session 6"). */
    static inline void fr_copy_lines(char* d, const char* s, size_t n, int streaming) {
    #if defined(__x86_64__)
        size_t head = (64 - ((uintptr_t) d & 63)) & 63, i = 0;
        if (head > n) head = n;
        memcpy(d, s, head);
        d += head; s += head; n -= head;
        for (; i + 64 <= n; i += 64) {
            __m128i a = _mm_loadu_si128((const __m128i*) (s + i));
            __m128i b = _mm_loadu_si128((const __m128i*) (s + i + 16));
            __m128i c = _mm_loadu_si128((const __m128i*) (s + i + 32));
            __m128i e = _mm_loadu_si128((const __m128i*) (s + i + 48));
            if (streaming) {
                _mm_stream_si128((__m128i*) (d + i), a);
                _mm_stream_si128((__m128i*) (d + i + 16), b);
                _mm_stream_si128((__m128i*) (d + i + 32), c);
                _mm_stream_si128((__m128i*) (d + i + 48), e);
            } else {
                _mm_store_si128((__m128i*) (d + i), a);
                _mm_store_si128((__m128i*) (d + i + 16), b);
                _mm_store_si128((__m128i*) (d + i + 32), c);
                _mm_store_si128((__m128i*) (d + i + 48), e);
            }
        }
        if (streaming)
            _mm_sfence();  /* ordered before any later store, the flags included */
        memcpy(d + i, s + i, n - i);
    #else
        memcpy(d, s, n);
    #endif
    }
    static inline void fr_copy_streaming(char* d, const char* s, size_t n) { fr_copy_lines(d, s, n, 1); }
    /* memcpy, but in SSE lines where `rep movsb` would hit that case */
    static inline void fr_copy(char* d, const char* s, size_t n) {
        if (((uintptr_t) d - (uintptr_t) s - 1) % 4096 < 63)
            fr_copy_lines(d, s, n, 0);
        else
            memcpy(d, s, n);
    }
    /* fr_copy, or with streaming stores */
    static inline void fr_copy_as(char* d, const char* s, size_t n, int streaming) {
        if (streaming)
            fr_copy_streaming(d, s, n);
        else
            fr_copy(d, s, n);
    }
    """
    void fr_copy_streaming(char* d, const char* s, size_t n) nogil
    void fr_copy(char* d, const char* s, size_t n) nogil
    void fr_copy_as(char* d, const char* s, size_t n, bint streaming) nogil
    uint64_t fr_load(const uint64_t* p) nogil
    uint64_t fr_claim(uint64_t* p, uint64_t end) nogil
    void fr_store(uint64_t* p, uint64_t v) nogil
    void fr_relax() nogil

DEF LINE = 128          # bytes per sequence word: no two ranks' words share a prefetched pair of lines
DEF PAGE = 4096
DEF PURE_SPINS = 2048   # loads before a wait reads the clock (and, oversubscribed, yields)
DEF CPU_WORD = 3       # in a rank's sequence line: the core it last arrived from (1, 2: allgather counts)
DEF SUB_BYTES = 32768   # the reduction's unit: a piece copied and reduced while in L1
DEF DIRECT_TILE = 262144  # a direct allgather's unit: written to every rank's result while in L2
# In a rank's sequence line, on the second 64-byte half (away from the counter the barriers
# poll): how far the streams it sent have been published, and how far it has read the
# streams it received (both in bytes of the one stream position every rank counts alike).
DEF STREAM_SENT = 8
DEF STREAM_READ = 9
DEF BY_CHOICE = -2      # a single-copy allreduce that rank 0 sent through the segment's buffers instead
# In a rank's sequence line, second half: how many tiles of the pipelined allreduce
# (`_pipeline`) this rank has staged, reduced, and finished (copied every other part out),
# counted over every pipelined call so far, alike on every rank.
DEF PIPE_STAGED = 10
DEF PIPE_REDUCED = 11
DEF PIPE_DONE = 12
DEF PIPE_SLOTS = 2      # slots (of a tile per part) per rank's buffer, used in turn
# In a rank's sequence line, second half: where the result of its running allgather or
# alltoall lies in the results area (bytes from the area's start), or NO_RESULT where it
# lies elsewhere (`_results_ready`), in one of two words by the parity of the barrier after
# which it is read
DEF RESULT_AT = 13      # and 14
DEF NO_RESULT = -1  # as a uint64_t: no offset in the area

# How allgather_rows and alltoall_rows move their bytes (`way`): by their size (streamed up to
# stream_exchange_bytes, above by single copy or in rounds), or streamed, or by single copy
# where the ranks may copy between their memories, or written straight into every rank's
# result where every result lies in the segment's results area (streamed where one does
# not), as the caller chose alike on every rank
DEF BY_SIZE = 0
DEF STREAMED = 1
DEF COPIED = 2
DEF DIRECT = 3
EXCHANGE_BY_SIZE, EXCHANGE_STREAM, EXCHANGE_SINGLE_COPY, EXCHANGE_DIRECT = BY_SIZE, STREAMED, COPIED, DIRECT

cdef double _CYCLE_SPIN = WAIT_CYCLE_SPIN_SECONDS
cdef double _HOT_SPIN = SHM_HOT_SPIN_SECONDS
cdef double _ACTIVE_SPIN = SHM_ACTIVE_SPIN_SECONDS
cdef int64_t _EXCHANGE_LEAD = SHM_STREAM_EXCHANGE_LEAD_PIECES
cdef int64_t _STREAM_RESTART = SHM_STREAM_RESTART_BYTES
cdef int64_t _PIECES_ROUND = SHM_PIECES_ROUND_BYTES


cdef struct Pieces:
    # An input given as pieces that lie apart (each tensor of a group where it is), read as if
    # they were one buffer: at[i] is the address of piece i, bytes[i] its length; a walk keeps
    # the piece it stands in (i, starting at byte `start` of the whole), so that the walks of
    # a call, which go forward, cost one step per piece.
    const int64_t* at
    const int64_t* bytes
    int64_t count
    int64_t i
    int64_t start


cdef inline void _seek(Pieces* p, int64_t offset) noexcept nogil:
    """Stand `p` in the piece that holds byte `offset` (past its zero-length pieces)."""
    if offset < p.start:
        p.i, p.start = 0, 0
    while p.i < p.count and p.start + p.bytes[p.i] <= offset:
        p.start += p.bytes[p.i]
        p.i += 1


cdef void _gather(Pieces* p, char* dst, int64_t offset, int64_t nbytes, bint streaming) noexcept nogil:
    """Copy bytes offset .. offset + nbytes of the pieces, as one buffer, to `dst` (with
    streaming stores where `streaming`)."""
    cdef int64_t inside, m
    _seek(p, offset)
    while nbytes > 0:
        inside = offset - p.start
        m = min(nbytes, p.bytes[p.i] - inside)
        fr_copy_as(dst, <char*> p.at[p.i] + inside, m, streaming)
        dst += m
        offset += m
        nbytes -= m
        _seek(p, offset)


cdef void _reduce_pieces(Pieces* p, char* acc, int64_t offset, int64_t nbytes, reduce_fn_t reduce,
                         int64_t itemsize) noexcept nogil:
    """acc = acc op (bytes offset .. offset + nbytes of the pieces); every piece is a whole
    number of items."""
    cdef int64_t inside, m
    _seek(p, offset)
    while nbytes > 0:
        inside = offset - p.start
        m = min(nbytes, p.bytes[p.i] - inside)
        reduce(acc, <char*> p.at[p.i] + inside, m // itemsize)
        acc += m
        offset += m
        nbytes -= m
        _seek(p, offset)


cdef inline int64_t _part_start(int r, int n, int64_t count) noexcept nogil:
    """Where rank r's part of `count` items split between n ranks starts (the first
    count % n ranks take one more)."""
    return r * (count // n) + min(r, count % n)


ctypedef void (*finish_fn_t)(void* dst, int64_t count, int64_t divisor, double factor) noexcept nogil


cdef struct PipeCall:  # one pipelined allreduce (SharedSegment._pipeline)
    char* src
    char* dst
    reduce_fn_t reduce
    int64_t isz, count, per  # bytes per element, elements, elements per tile of a part
    uint64_t round_, steps   # its data round, tiles per part


cdef inline int64_t _align(int64_t n, int64_t to) noexcept nogil:
    return (n + to - 1) // to * to


cdef int _call(void* hook, int partner, double waited) except -1 with gil:
    (<object> hook)(partner, waited)
    return 0


SEGMENT_PREFIX = "fastring-"
_SEGMENT_NAME = re.compile(re.escape(SEGMENT_PREFIX) + r"(\d+)-[0-9a-f]{12}")


def remove_orphans(folder: str = "/dev/shm") -> list:
    """Unlink the segments in `folder` whose creating process no longer exists, and return
    their names: a rank 0 killed inside `attach`, after creating its segment and before every
    rank had mapped it, leaves the name, and nothing else would remove it. A creator that is
    alive (this launch's, another launch's) keeps its segment.

    Example:
        >>> remove_orphans("/nonexistent")
        []
    """
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        found = _SEGMENT_NAME.fullmatch(name)
        if found is None or _alive(int(found.group(1))):
            continue
        try:
            os.unlink(os.path.join(folder, name))
            removed.append(name)
        except OSError:  # another launch removed it first, or it is not ours to remove
            pass
    return removed


def unlink_mapped(prefix: str = MPI_SEGMENT_PREFIX, maps: str = "/proc/self/maps") -> list:
    """Unlink the files under `prefix` that this process has mapped, and return their paths.

    MPICH keeps the name of each host's shared-memory segment (made in MPI_Init) until
    MPI_Finalize, so a rank killed or aborted leaves it in /dev/shm for good (several MiB a
    job). Called by a host's first rank once every rank of the host is past MPI_Init (and so
    has mapped it): the mappings stay, the name goes, the memory is freed at the last unmap.
    MPICH's own unlink at MPI_Finalize then finds no name, which it ignores.

    Example:
        >>> unlink_mapped(maps="/nonexistent")
        []
    """
    return unlink_each(mapped_under(prefix, maps))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, and belongs to someone else
        return True
    return True


cdef class SharedSegment:
    """The host's shared segment, mapped by every rank of `transport` (see the module
    docstring). Build it with `SharedSegment.attach`, which returns None (and why) where it
    cannot be set up."""

    cdef char* base
    cdef int64_t length
    cdef int64_t cycle_bytes, tile, cycle_off, data_off, table_off, table_stride
    cdef int read_time_word    # in each rank's table: see `_table`
    cdef readonly int rank, size
    cdef uint64_t seq          # this rank's counter, mirrored in the segment
    cdef uint64_t data_rounds, cycles
    cdef uint64_t claimed      # where the claim counter stands when every rank is between calls
    cdef int64_t chunk         # bytes per claimed chunk of a single-copy call
    cdef int64_t stream_off, stream_piece, large_piece, ring
    cdef uint64_t streamed     # the stream position: where the last streamed call ended
    cdef uint64_t stream_start, stream_data_end  # `_stream_begin`
    cdef uint64_t piped        # tiles every pipelined allreduce so far ran (`_pipeline`)
    # Where single copy starts (SHM_SINGLE_COPY_BYTES, SHM_ALLREDUCE_SINGLE_COPY_BYTES); tests
    # lower them, on every rank alike, to run small messages that way.
    cdef public int64_t single_copy_bytes, allreduce_single_copy_bytes, pieces_single_copy_bytes
    cdef public int64_t streaming_bytes  # outputs from this size are written with streaming stores
    cdef public int64_t cycle_streaming_bytes  # cycle payloads from this size go into the slot so too
    # allgather_rows and alltoall_rows stream when each rank's output is at most this many bytes
    # (SHM_STREAM_EXCHANGE_MAX_BYTES); tests change it, on every rank alike
    cdef public int64_t stream_exchange_bytes
    # a reducescatter round moves at most this many bytes of every rank's part
    # (SHM_REDUCESCATTER_ROUND_BYTES); tests change it, on every rank alike
    cdef public int64_t reduce_scatter_round_bytes
    cdef public int64_t pipeline_tile  # bytes per part and tile of a pipelined allreduce, at most
    # Whether an allreduce of more than a buffer is pipelined (`_pipeline`) rather than in rounds:
    # unless more ranks than cores share the host, where every one of its many waits per call
    # may wait for a rank that is not running (8 MiB at np=3 on 2 cores: 50 ms, median).
    cdef public bint pipelined
    # Two chunks of private memory, each with a page to spare: an accumulator and a landing
    # place, each used from the page offset of the peer's memory it is copied from or to, as a
    # copy between processes (process_vm_readv/writev) runs as `rep movsb` too (fr_copy)
    cdef char* scratch
    # More ranks than this process may run on cores: a spinning wait yields its core at once.
    # Otherwise only after SHM_HOT_SPIN_SECONDS (SHM_ACTIVE_SPIN_SECONDS in a run of back-to-back
    # calls): a yield may hand the core to any other runnable process for a whole slice, but a
    # peer that has not arrived by then may be waiting for this very core.
    cdef bint oversubscribed
    cdef double last_left      # when this rank's last barrier ended (now())
    cdef TransportBase transport
    cdef object broken         # the error that left this rank out of step, or None
    # The running allreduce's finish (kernels.finish_cfunc, or NULL) and its arguments: the
    # rank that reduces a piece finishes it while it is in cache, before anyone copies it.
    cdef finish_fn_t finish
    cdef bint stage_streaming  # the running allreduce writes what others read with streaming stores
    cdef int64_t finish_divisor
    cdef double finish_factor
    # The results area: `results_bytes` for each rank's results after the segment, mapped by
    # every rank at `results_base` (in this process), so that an allgather or alltoall whose
    # results lie there writes every rank's bytes straight into them; `results` hands out this
    # rank's part (a fastring._core.pool.Arena), None without an area
    cdef char* results_base
    cdef readonly int64_t results_bytes
    cdef readonly object results
    cdef int result_word       # the word the running call's offsets were published in

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, self.length)
        free(self.scratch)

    @staticmethod
    def attach(TransportBase transport not None, int64_t tile_bytes, int64_t cycle_bytes,
               int64_t results_bytes=0):
        """Collective over `transport`'s ranks, which must all run on this host: rank 0
        creates the segment, every rank maps it, rank 0 unlinks it. Returns (segment, None),
        or (None, why) on every rank alike when any rank could not map it. With
        `results_bytes`, a results area of that many bytes for each rank follows the segment
        (`results`), unless /dev/shm has no room for it: then the segment comes without.

        Example:
            >>> from mpi4py import MPI
            >>> from fastring._transport import Transport
            >>> seg, why = SharedSegment.attach(Transport(MPI.COMM_WORLD), 1 << 20, 81920)
            >>> (seg.size, why) if seg is not None else why
            (1, None)
        """
        if tile_bytes < PAGE or cycle_bytes < 64:
            raise ValueError(f"tile_bytes must be at least {PAGE} and cycle_bytes at least 64, "
                             f"got {tile_bytes} and {cycle_bytes}")
        comm = (<object> transport).comm  # the mpi4py communicator, not the C handle
        n, me = transport.size, transport.rank
        cdef SharedSegment s = SharedSegment.__new__(SharedSegment)
        s.rank, s.size, s.transport = me, n, transport
        s.oversubscribed = n > len(os.sched_getaffinity(0))
        s.allreduce_single_copy_bytes = SHM_ALLREDUCE_SINGLE_COPY_BYTES
        s.pieces_single_copy_bytes = SHM_PIECES_SINGLE_COPY_BYTES
        s.tile = _align(tile_bytes, PAGE)
        s.cycle_bytes = _align(cycle_bytes, PAGE)
        s.table_off = (n + 1) * LINE
        s.read_time_word = 2 * n + 2
        s.table_stride = _align((s.read_time_word + 1) * 8, LINE)
        s.cycle_off = _align(s.table_off + n * s.table_stride, PAGE)
        s.chunk = _align(SHM_SINGLE_COPY_CHUNK_BYTES, PAGE)
        s.single_copy_bytes = SHM_SINGLE_COPY_BYTES
        s.streaming_bytes = SHM_STREAMING_STORE_BYTES
        s.cycle_streaming_bytes = SHM_CYCLE_STREAMING_BYTES
        s.stream_exchange_bytes = SHM_STREAM_EXCHANGE_MAX_BYTES
        s.reduce_scatter_round_bytes = SHM_REDUCESCATTER_ROUND_BYTES
        s.pipeline_tile = SHM_PIPELINE_TILE_BYTES
        # a single copy's landing chunks, and a piece of a streaming allreduce's rounds
        s.scratch = <char*> aligned_alloc(PAGE, max(2 * (s.chunk + PAGE), _align(SUB_BYTES, PAGE)))
        if s.scratch == NULL:
            raise MemoryError()
        s.data_off = s.cycle_off + 2 * n * s.cycle_bytes
        s.stream_off = s.data_off + 2 * n * s.tile
        # at least two pieces to a ring, so that the root writes one while a reader copies one;
        # the ring a whole number of large pieces, each a whole number of small ones, so that
        # no piece of either size straddles its end
        s.stream_piece = min(_align(SHM_STREAM_PIECE_BYTES, LINE), s.tile // 2 // LINE * LINE)
        s.large_piece = max(s.stream_piece, min(SHM_STREAM_LARGE_PIECE_BYTES, s.tile // 2) // s.stream_piece
                            * s.stream_piece)
        s.ring = s.tile // s.large_piece * s.large_piece
        s.length = s.stream_off + n * s.tile
        s.results_bytes = _align(max(results_bytes, 0), PAGE)
        name = ""
        why = None
        if me == 0:
            remove_orphans()
            name = f"/{SEGMENT_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
            why = s._map(name.encode(), True)
            if why is not None:
                name = ""
        name, s.results_bytes = comm.bcast((name, s.results_bytes), root=0)
        if me != 0 and name:
            why = s._map(name.encode(), False)
        elif not name and why is None:
            why = "rank 0 could not create the segment"
        # the path that depends on the cores must be the same on every rank, whatever each
        # rank's own affinity mask says
        reasons, crowded = zip(*comm.allgather((why, s.oversubscribed)))
        s.pipelined = not any(crowded)
        if me == 0 and name:
            shm_unlink(name.encode())  # every rank has mapped it (or given up): the name goes now
        if me == 0:
            unlink_mapped()  # MPI's segment: every rank is past MPI_Init
        failed = [(r, w) for r, w in enumerate(reasons) if w is not None]
        if failed:
            s.close()
            return None, "; ".join(f"rank {r}: {w}" for r, w in failed)
        return s, None

    cdef object _map(self, bytes name, bint create):
        """Map the segment `name` (creating and sizing it when `create`); None or why not."""
        cdef int fd = shm_open(name, O_RDWR | (O_CREAT | O_EXCL if create else 0), 0o600)
        if fd < 0:
            return f"shm_open({name.decode()}): {os.strerror(_errno())}"
        cdef int err = 0
        cdef int64_t results = self.size * self.results_bytes
        if create:
            # fallocate, not only ftruncate: a full /dev/shm must fail here, not with SIGBUS on
            # the first touch of a page; without room for the results area, the segment alone
            err = posix_fallocate(fd, 0, self.length + results)
            if err != 0 and results:
                self.results_bytes = results = 0
                err = posix_fallocate(fd, 0, self.length)
            if err != 0:
                close(fd)
                shm_unlink(name)
                return f"posix_fallocate({self.length} bytes in /dev/shm): {os.strerror(err)}"
        # every page mapped now, not on its first touch: a first pipelined allreduce faulted in
        # its slots for 1-2 ms, and PathTimes took that for the path's speed
        cdef void* p = mmap(NULL, self.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
        err = _errno()
        if p == <void*> -1:
            close(fd)
            if create:
                shm_unlink(name)
            return f"mmap of {self.length} bytes: {os.strerror(err)}"
        self.base = <char*> p
        if results:
            # a mapping of its own, from Python: the results handed out keep it (the arrays'
            # memory) alive after close; its memory is allocated (posix_fallocate above), but
            # each process maps a page only when it first touches it
            try:
                area = pymmap.mmap(fd, results, pymmap.MAP_SHARED, pymmap.PROT_READ | pymmap.PROT_WRITE,
                                   offset=self.length)
            except (OSError, ValueError, OverflowError) as e:
                close(fd)
                if create:
                    shm_unlink(name)
                return f"mmap of the {results}-byte results area: {e}"
            self.results_base = <char*> <uintptr_t> np.frombuffer(area, np.uint8).ctypes.data
            self.results = Arena(area, self.rank * self.results_bytes, self.results_bytes)
        close(fd)
        return None

    def close(self):
        """Unmap the segment (the memory goes when the last rank has unmapped it; the results
        area's, when the last result from it is gone too)."""
        if self.base != NULL:
            munmap(self.base, self.length)
            self.base = NULL
        self.results_base, self.results_bytes, self.results = NULL, 0, None
        self.broken = FastringError("the shared-memory segment was closed")

    @property
    def tile_bytes(self):
        """Bytes of one data buffer: a data round moves at most this much per rank."""
        return self.tile

    # ------------------------------------------------------------------ waiting
    cdef inline uint64_t* _word(self, int r) noexcept nogil:
        return <uint64_t*> (self.base + r * LINE)

    cdef inline char* _data(self, int r, uint64_t round_) noexcept nogil:
        return self.base + self.data_off + (2 * r + (round_ & 1)) * self.tile

    cdef inline char* _cycle_slot(self, int r, uint64_t round_) noexcept nogil:
        return self.base + self.cycle_off + (2 * r + (round_ & 1)) * self.cycle_bytes

    cdef inline void _copy_out(self, char* dst, const char* src, int64_t nbytes, bint streaming) noexcept nogil:
        """Copy into a call's output: with streaming stores for outputs of `streaming_bytes`
        and more, which no one reads soon and whose lines need not be read before written."""
        fr_copy_as(dst, src, nbytes, streaming)

    cdef int _check(self) except -1:
        if self.broken is not None:
            raise FastringError(f"the shared-memory path cannot run after: {self.broken}")
        return 0

    cdef int _arrive(self, double spin, double interval, void* hook) except -1 nogil:
        """Bump this rank's counter and wait until every rank's has reached it. Calls
        `hook(partner, seconds waited)` every `interval` seconds (0: never) while waiting."""
        self.seq += 1
        self._publish(0, self.seq)
        return self._await(0, self.seq, -1, -1, spin, interval, hook)

    cdef inline void _publish(self, int word, uint64_t value) noexcept nogil:
        # Where this rank runs, beside its counters: a peer that waits for it and finds it was
        # last on the peer's own core yields at once, since it cannot go on while the peer
        # spins there (spinning first cost about 200 us a barrier in that state).
        self._word(self.rank)[CPU_WORD] = <uint64_t> sched_getcpu()
        fr_store(self._word(self.rank) + word, value)

    cdef int _await(self, int word, uint64_t target, int only, int skip, double spin, double interval,
                    void* hook) except -1 nogil:
        """Wait until word `word` of rank `only`'s sequence line (-1: of every rank but `skip`)
        has reached `target`; spins, then yields, then sleeps, calling the stall hook on time
        (see `_arrive`)."""
        cdef uint64_t cpu = <uint64_t> sched_getcpu()
        cdef int r = 0 if only < 0 else only, n = self.size if only < 0 else only + 1
        cdef long tries = 0
        cdef double start = 0, t, next_report = 0, pause_s = 0, hot = _HOT_SPIN
        cdef bint shared
        while True:
            while r < n and (r == skip or fr_load(self._word(r) + word) >= target):
                r += 1
            if r == n:
                self.last_left = now()
                return 0
            tries += 1
            shared = self._word(r)[CPU_WORD] == cpu
            if tries < PURE_SPINS and not shared:
                fr_relax()
                continue
            t = now()
            if start == 0:
                start, next_report = t, t + interval
                if start - self.last_left < _ACTIVE_SPIN:  # back to back (SHM_ACTIVE_SPIN_SECONDS)
                    hot = _ACTIVE_SPIN
                continue
            # The scheduler may have moved this rank since it arrived: onto the core its peer
            # last ran on, where spinning would keep the peer from arriving.
            cpu = <uint64_t> sched_getcpu()
            if t - start < spin:
                if self.oversubscribed or shared or t - start > hot:
                    sched_yield()  # the peer we wait for may be waiting for this core
                continue
            pause_s = back_off(pause_s, t - start)
            if hook != NULL and interval > 0 and t >= next_report:
                _call(hook, r, now() - start)
                next_report = now() + interval

    cdef int _data_arrive(self) except -1 nogil:
        cdef Link* link = &self.transport.link
        return self._arrive(link.spin, link.interval, link.hook)

    cdef int _failed(self) except -1:
        """A loop raised (its stall hook gave up): this rank is out of step from now on."""
        self.broken = FastringError("a collective through the segment failed part-way")
        return 0

    # ------------------------------------------------------------------ single copy
    # Address table words: [0] the errno of this rank's last single-copy call (0: none), then
    # SEND[k] (1 + k): where this rank's bytes for rank k start, then RECV[j] (1 + n + j):
    # where the bytes from rank j land in this rank's memory, then (1 + 2n, rank 0's alone)
    # whether this allreduce goes in rounds instead.

    cdef inline uint64_t* _table(self, int r) noexcept nogil:
        """Rank r's words: [0] its errno at a single-copy call's end (`_finish`), [1..2n+1]
        the addresses and flags a call publishes before its first barrier (a single-copy
        broadcast: its buffer at [1], the root's part at [2]), [read_time_word] how long its
        read of a single-copy broadcast took, which the root reads after the last barrier: no
        other call writes that word before its own first barrier."""
        return <uint64_t*> (self.base + self.table_off + r * self.table_stride)

    cdef inline bint _single_copy(self, int64_t nbytes, int64_t threshold) noexcept nogil:
        """Whether a call moving `nbytes` (the same on every rank) goes by single copy."""
        return self.transport.pids != NULL and nbytes >= threshold

    cdef inline bint _stages(self, int64_t nbytes) noexcept nogil:
        """Whether a rank sending `nbytes` to the others stages them in its buffer before the
        first barrier of allgather_rows / alltoall_rows: not when they alone would go by
        single copy, nor when the whole call may stream (decided after the barrier, on the
        bytes of every rank)."""
        return nbytes > self.stream_exchange_bytes and not self._single_copy(nbytes, self.single_copy_bytes)

    cdef inline uint64_t _chunks(self, uint64_t count) noexcept nogil:
        """Reserve the next `count` claim indices for this call; returns the first."""
        cdef uint64_t first = self.claimed
        self.claimed += count
        return first

    cdef inline uint64_t _claim(self, uint64_t end) noexcept nogil:
        return fr_claim(<uint64_t*> (self.base + self.size * LINE), end)

    cdef int _finish(self, int err) except -1 nogil:
        """The closing barrier of a single-copy call: publishes this rank's errno (0: none)
        and returns the first one any rank published, the same on every rank."""
        cdef int r
        self._table(self.rank)[0] = <uint64_t> err
        self._data_arrive()
        for r in range(self.size):
            if self._table(r)[0] != 0:
                return <int> self._table(r)[0]
        return 0

    cdef int _raise_copy_error(self, int err) except -1:
        """Every rank alike, after `_finish` reported `err`: the data of this call is not to be
        trusted, and single copy is off from now on (the segment stays in step)."""
        self.transport.disable_single_copy()
        raise FastringError(f"a copy between the ranks' memories failed ({os.strerror(err)}); "
                            "the result is incomplete, and such copies are off from now on")

    cdef inline void _finish_piece(self, char* p, int64_t count) noexcept nogil:
        if self.finish != NULL:
            self.finish(p, count, self.finish_divisor, self.finish_factor)

    cdef int _gather_reduce(self, char** acc_at, char* out, char* src, int64_t at, int64_t nbytes,
                            reduce_fn_t reduce, reduce_fn_t reduce_after, int64_t itemsize) noexcept nogil:
        """*acc_at = (rank 0's op rank 1's op ...) over the `nbytes` at byte `at` of every rank's
        input (SEND[0]; this rank's is `src`); *acc_at may be `src + at` on rank 0 only. In
        place (`out`, where this rank's result goes, is `src + at`) with *acc_at elsewhere (a
        rank other than 0 must not overwrite its input before it reduced it), `reduce_after`
        (dst = src op dst; may be NULL) reduces the step that reads this rank's input into the
        input itself, and *acc_at becomes `out`: no copy out of the accumulator afterwards
        (4-9% off a 256 MiB call by single copy: BENCHMARKS.md, "Round 2, session 28").
        Returns 0 or an errno."""
        cdef int n = self.size, me = self.rank, r, err = 0
        cdef const pid_t* pids = self.transport.pids
        cdef char* acc = acc_at[0]
        cdef char* landing
        if me == 0:
            if acc != src + at:
                fr_copy(acc, src + at, nbytes)
        else:
            err = vm_copy(False, pids[0], acc, self._table(0)[1] + at, nbytes)
        for r in range(1, n):
            if err:
                break
            if r == me and acc != out and out == src + at and reduce_after != NULL:
                reduce_after(out, acc, nbytes // itemsize)
                acc = out
            elif r == me:
                reduce(acc, src + at, nbytes // itemsize)
            else:
                landing = self.scratch + self.chunk + PAGE + ((self._table(r)[1] + at) & (PAGE - 1))
                err = vm_copy(False, pids[r], landing, self._table(r)[1] + at, nbytes)
                if not err:
                    reduce(acc, landing, nbytes // itemsize)
        acc_at[0] = acc
        return err

    cdef int _single_copy_allreduce(self, char* src, char* dst, int64_t nbytes, reduce_fn_t reduce,
                                    reduce_fn_t reduce_after, int64_t itemsize, bint buffers) except -1 nogil:
        """Whoever claims a chunk reduces it over every rank, in rank order, and writes the
        result into every rank's `dst`: one reducer per chunk, so the same bits everywhere.
        In place, a chunk of a rank's input is overwritten only by its own reducer, after it
        read it. Rank 0's `buffers`, published with its addresses, sends every rank through the
        segment's buffers instead after the first barrier (nothing has been copied then):
        returns BY_CHOICE."""
        cdef int n = self.size, me = self.rank, r, err = 0
        cdef const pid_t* pids = self.transport.pids
        cdef int64_t per = self.chunk // itemsize * itemsize, at, k
        cdef uint64_t first, end, c
        cdef char* acc
        self._table(me)[1] = <uint64_t> src
        self._table(me)[1 + n] = <uint64_t> dst
        if me == 0:
            self._table(0)[1 + 2 * n] = buffers
        self._data_arrive()
        if self._table(0)[1 + 2 * n]:
            return BY_CHOICE
        first = self._chunks((nbytes + per - 1) // per)
        end = self.claimed
        while not err:
            c = self._claim(end)
            if c >= end:
                break
            at = (c - first) * per
            k = min(per, nbytes - at)
            # rank 0 accumulates in its result; another rank must not overwrite its input in
            # place before reducing it, so it accumulates in its scratch, at the page offset of
            # rank 0's result, which it copies from and to (see `scratch`), until the step that
            # reads its input, which reduces into the input where the call has a `reduce_after`
            acc = (self.scratch + ((self._table(0)[1 + n] + at) & (PAGE - 1)) if src == dst and me != 0
                   else dst + at)
            err = self._gather_reduce(&acc, dst + at, src, at, k, reduce, reduce_after, itemsize)
            if not err:
                self._finish_piece(acc, k // itemsize)
            if not err and acc != dst + at:
                fr_copy(dst + at, acc, k)
            r = 0
            while not err and r < n:
                if r != me:
                    err = vm_copy(True, pids[r], acc, self._table(r)[1 + n] + at, k)
                r += 1
        return self._finish(err)

    cdef int _single_copy_moves(self, const int64_t* lengths, bint per_source) except -1 nogil:
        """Every rank j's bytes for every other rank k, lengths[j * n + k] of them (or
        lengths[j] for every k when `per_source`), from j's SEND[k] to k's RECV[j], which
        every rank has published. Whoever claims a chunk copies it: from its own memory into
        k's, from j's into its own, or (neither j nor k) through its scratch."""
        cdef int n = self.size, me = self.rank, j, k, err = 0
        cdef const pid_t* pids = self.transport.pids
        cdef int64_t per = self.chunk, at, piece, length
        cdef uint64_t first, end, c, total = 0, pair_first
        cdef uint64_t source, target
        cdef int64_t p = 0
        for p in range(n * n):
            j, k = p // n, p % n
            if j != k:
                total += (lengths[j if per_source else p] + per - 1) // per
        self._data_arrive()
        first = self._chunks(total)
        end = self.claimed
        p, pair_first = 0, first
        while not err:
            c = self._claim(end)
            if c >= end:
                break
            while True:  # the pair (j, k) of chunk c, searching forward
                j, k = p // n, p % n
                length = 0 if j == k else lengths[j if per_source else p]
                if c < pair_first + <uint64_t> ((length + per - 1) // per):
                    break
                pair_first += (length + per - 1) // per
                p += 1
            at = (c - pair_first) * per
            piece = min(per, length - at)
            source = self._table(j)[1 + k] + at
            target = self._table(k)[1 + n + j] + at
            if me == j:
                err = vm_copy(True, pids[k], <char*> source, target, piece)
            elif me == k:
                err = vm_copy(False, pids[j], <char*> target, source, piece)
            else:
                err = vm_copy(False, pids[j], self.scratch, source, piece)
                if not err:
                    err = vm_copy(True, pids[k], self.scratch, target, piece)
        return self._finish(err)

    # ------------------------------------------------------------------ collectives
    # Each runs whole without the GIL (a training thread holding it for milliseconds must not
    # stall every round); only a slow wait's stall hook takes it.

    def allreduce(self, uintptr_t src, uintptr_t dst, int64_t nbytes, uintptr_t reduce_fn,
                  int64_t itemsize, bint one_step, bint prefer_buffers=False, uintptr_t finish_fn=0,
                  int64_t divisor=1, double factor=1.0, bint streaming=False, uintptr_t reduce_after_fn=0):
        """Allreduce `nbytes` at `src` into `dst` (may be `src`) with `reduce_fn`
        (dst = dst op src, a reduction cfunc over `itemsize`-byte elements), then, given
        `finish_fn` (kernels.finish_cfunc of the dtype), finish every element with it
        (Average's `divisor`, the postscale `factor`) where it was reduced, in cache.

        `one_step` (the message must fit in one buffer): every rank copies its input into its
        buffer, and after one barrier reduces all of them, in rank order, into `dst`: the
        same bits everywhere, one synchronisation. From SHM_ALLREDUCE_SINGLE_COPY_BYTES, where the
        ranks may copy between their memories, by single copy (the module docstring).
        Otherwise through the segment's buffers: up to a buffer in rounds of
        SHM_PIECES_ROUND_BYTES (`_rounds`), in each of which every rank copies the parts of its
        input that the others reduce into its buffer, reduces its own part (its input and every
        peer's copy of that part, piece by piece while it is in L1) into its buffer and `dst`,
        and after a second barrier copies the others' reduced parts into `dst`; above a buffer
        the same pipelined tile by tile (`_pipeline`; in rounds of a buffer where more ranks
        than cores share the host: `pipelined`). Each element
        is reduced by one rank (or by all alike), so `dst` holds the same bits on every rank.
        `streaming`: in one step and in rounds, what a rank writes for the others to read
        goes to memory with streaming stores, not to its cache (SHM_STORE_WAYS). `reduce_after_fn`
        (kernels.reduce_after_cfunc of the same op and dtype): by single copy in place, a rank
        other than 0 reduces into its input itself, not into its scratch copied after.

        Where single copy could run, rank 0's `prefer_buffers` (the others' is ignored, so
        that every rank takes the same path) sends the call through the segment's buffers
        instead: a copy between processes pins every page it touches, and on a machine
        running more than the ranks the pipeline's tiles wait on each other (PathTimes
        chooses). Returns which path ran: "one step", "rounds", "pipeline", "rounds by
        choice", "pipeline by choice" or "single copy"."""
        self._check()
        if nbytes % itemsize or nbytes < 0 or itemsize <= 0:
            raise ValueError(f"nbytes ({nbytes}) must be a multiple of itemsize ({itemsize})")
        if one_step and nbytes > self.tile:
            raise ValueError(f"a one-step allreduce must fit in {self.tile} bytes, got {nbytes}")
        if nbytes == 0:
            return "one step"
        cdef int err = 0
        self.finish = <finish_fn_t> finish_fn
        self.finish_divisor, self.finish_factor = divisor, factor
        self.stage_streaming = streaming
        cdef bint single = not one_step and self._single_copy(nbytes, self.allreduce_single_copy_bytes)
        cdef bint piped = self.pipelined and nbytes > self.tile
        try:
            with nogil:
                if one_step:
                    self._one_step(<char*> src, <char*> dst, nbytes, <reduce_fn_t> reduce_fn, itemsize)
                elif single:
                    err = self._single_copy_allreduce(<char*> src, <char*> dst, nbytes, <reduce_fn_t> reduce_fn,
                                                      <reduce_fn_t> reduce_after_fn, itemsize, prefer_buffers)
                if err == BY_CHOICE or not (one_step or single):
                    if piped:
                        self._pipeline(<char*> src, <char*> dst, nbytes, <reduce_fn_t> reduce_fn, itemsize)
                    else:
                        self._rounds(<char*> src, <char*> dst, nbytes, <reduce_fn_t> reduce_fn, itemsize)
        except BaseException:
            self._failed()
            raise
        if err and err != BY_CHOICE:
            self._raise_copy_error(err)
        if one_step or (single and not err):
            return "one step" if one_step else "single copy"
        return ("pipeline" if piped else "rounds") + (" by choice" if err else "")

    cdef int _one_step(self, char* src, char* dst, int64_t nbytes, reduce_fn_t reduce,
                       int64_t itemsize) except -1 nogil:
        cdef uint64_t round_ = self.data_rounds
        cdef int r
        self.data_rounds += 1
        if src != self._data(self.rank, round_):  # else gathered there (`allreduce_pieces`)
            fr_copy_as(self._data(self.rank, round_), src, nbytes, self.stage_streaming)
        self._data_arrive()
        fr_copy(dst, self._data(0, round_), nbytes)
        for r in range(1, self.size):
            reduce(dst, self._data(r, round_), nbytes // itemsize)
        self._finish_piece(dst, nbytes // itemsize)
        return 0

    cdef int _rounds(self, char* src, char* dst, int64_t nbytes, reduce_fn_t reduce,
                     int64_t itemsize) except -1 nogil:
        """`_pieces_rounds` of `src` as its one piece, in rounds of SHM_PIECES_ROUND_BYTES; of
        a whole buffer where more ranks than cores share the host (`pipelined` is off), as
        every round's barriers may wait for a rank that is not running."""
        cdef int64_t at = <int64_t> src
        cdef int64_t length = nbytes
        cdef Pieces p
        p.at, p.bytes, p.count, p.i, p.start = &at, &length, 1, 0, 0
        return self._pieces_rounds(&p, dst, nbytes, reduce, itemsize,
                                   min(_PIECES_ROUND, self.tile) if self.pipelined else self.tile)

    def allreduce_pieces(self, const int64_t[::1] addresses, const int64_t[::1] lengths, uintptr_t dst,
                         uintptr_t reduce_fn, int64_t itemsize, bint one_step, uintptr_t finish_fn=0,
                         int64_t divisor=1, double factor=1.0, bint streaming=False):
        """`allreduce` of an input that lies in pieces (each tensor of a group where it is:
        lengths[i] bytes at addresses[i], each a whole number of items), read as their
        concatenation, into `dst` (contiguous, their total bytes; it may hold the pieces
        themselves at the same offsets). Nothing is gathered first: `one_step` (the total must
        fit one buffer) copies the pieces into this rank's buffer as `allreduce` copies its
        input; otherwise, in rounds of SHM_PIECES_ROUND_BYTES, each rank copies only the parts
        the others reduce into its buffer and reduces its own part reading its pieces where
        they lie (in rank order, as every path: the same bits). Returns False, having done
        nothing, where the group is to be gathered and copied between the ranks' memories
        instead (from SHM_PIECES_SINGLE_COPY_BYTES in all). `streaming` as in `allreduce`."""
        self._check()
        cdef int64_t count = addresses.shape[0], nbytes = 0, i
        if lengths.shape[0] != count:
            raise ValueError(f"{count} addresses but {lengths.shape[0]} lengths")
        if itemsize <= 0:
            raise ValueError(f"itemsize must be positive, got {itemsize}")
        for i in range(count):
            if lengths[i] < 0 or lengths[i] % itemsize:
                raise ValueError(f"piece {i} has {lengths[i]} bytes, not a whole number of {itemsize}-byte items")
            nbytes += lengths[i]
        if one_step and nbytes > self.tile:
            raise ValueError(f"a one-step allreduce must fit in {self.tile} bytes, got {nbytes}")
        if self._single_copy(nbytes, self.pieces_single_copy_bytes):
            return False
        if nbytes == 0:
            return True
        cdef Pieces p
        p.at, p.bytes, p.count, p.i, p.start = &addresses[0], &lengths[0], count, 0, 0
        self.finish = <finish_fn_t> finish_fn
        self.finish_divisor, self.finish_factor = divisor, factor
        self.stage_streaming = streaming
        try:
            with nogil:
                if one_step:
                    _gather(&p, self._data(self.rank, self.data_rounds), 0, nbytes, streaming)
                    self._one_step(self._data(self.rank, self.data_rounds), <char*> dst, nbytes,
                                   <reduce_fn_t> reduce_fn, itemsize)
                else:
                    self._pieces_rounds(&p, <char*> dst, nbytes, <reduce_fn_t> reduce_fn, itemsize,
                                        min(_PIECES_ROUND, self.tile))
        except BaseException:
            self._failed()
            raise
        return True

    cdef int _pieces_rounds(self, Pieces* p, char* dst, int64_t nbytes, reduce_fn_t reduce,
                            int64_t itemsize, int64_t round_bytes) except -1 nogil:
        """`_rounds` whose input is `p`, in rounds of `round_bytes`: each rank's part of a
        round is reduced by that rank, published in its buffer and copied from there by the
        others after the second barrier."""
        cdef int n = self.size, me = self.rank, r
        cdef int64_t per_round = max(n, round_bytes // itemsize), total = nbytes // itemsize
        cdef int64_t sub = max(1, SUB_BYTES // itemsize), done = 0, c, off, end, k
        cdef uint64_t round_
        cdef char* mine
        cdef char* acc
        while done < total:
            c = min(per_round, total - done)
            round_ = self.data_rounds
            self.data_rounds += 1
            mine = self._data(me, round_)
            for r in range(n):  # the others' parts, for them to reduce
                off, end = _part_start(r, n, c), _part_start(r + 1, n, c)
                if r != me and end > off:
                    _gather(p, mine + off * itemsize, (done + off) * itemsize, (end - off) * itemsize,
                            self.stage_streaming)
            self._data_arrive()
            off, end = _part_start(me, n, c), _part_start(me + 1, n, c)
            while off < end:
                # piece by piece while in L1: accumulated in this rank's buffer (where the
                # others copy it from), then copied into `dst`; streaming, accumulated in this
                # rank's scratch, then copied into `dst` and, by streaming stores, its buffer
                k = min(sub, end - off)
                acc = self.scratch if self.stage_streaming else mine + off * itemsize
                if me == 0:
                    _gather(p, acc, (done + off) * itemsize, k * itemsize, False)
                else:
                    fr_copy(acc, self._data(0, round_) + off * itemsize, k * itemsize)
                for r in range(1, n):
                    if r == me:
                        _reduce_pieces(p, acc, (done + off) * itemsize, k * itemsize, reduce, itemsize)
                    else:
                        reduce(acc, self._data(r, round_) + off * itemsize, k)
                self._finish_piece(acc, k)
                fr_copy(dst + (done + off) * itemsize, acc, k * itemsize)
                if self.stage_streaming:
                    fr_copy_streaming(mine + off * itemsize, acc, k * itemsize)
                off += k
            self._data_arrive()
            for r in range(n):  # the others' reduced parts
                off, end = _part_start(r, n, c), _part_start(r + 1, n, c)
                if r != me and end > off:
                    fr_copy(dst + (done + off) * itemsize, self._data(r, round_) + off * itemsize,
                            (end - off) * itemsize)
            done += c
        return 0

    cdef int _pipeline(self, char* src, char* dst, int64_t nbytes, reduce_fn_t reduce,
                       int64_t itemsize) except -1 nogil:
        """The rounds without their round barriers, in tiles small enough that what one rank
        writes is still in the cache when another reads it. Every rank's part is cut into
        tiles; for tile k each rank copies its input's tile k of every other part into a slot of
        its buffer (stage), reduces tile k of its own part from its input and every other
        rank's staged copy, in rank order, into rank 0's slot of that part and `dst` (reduce),
        then copies every other part's reduced tile k from rank 0's slots into `dst` (out), onto
        the lines it staged from a moment before, still in its L2. Accumulating in rank 0's
        staged copy makes two passes over each piece where a slot of the reducer's own made
        three (15% slower at 16 MiB); staging a tile ahead or copying out a tile behind put
        more between the stage and the out (5-10% slower). One counter per stage and rank,
        counted over every pipelined call so far, is all the synchronisation; a rank writes a
        slot again only when every rank is done with the tile PIPE_SLOTS earlier in it: with
        two, a rank stages tile k while a slower one still copies tile k - 1 out, and the
        slots stay small beside the L2. The call is one data round: it uses only this round's
        buffer of each rank, and a rank cannot leave it before every other rank has reduced its
        last tile, so before the next round reuses the buffer every rank has finished reading
        it."""
        cdef PipeCall c
        cdef uint64_t k
        c.src, c.dst, c.reduce, c.isz, c.count = src, dst, reduce, itemsize, nbytes // itemsize
        c.per = max(1, min(self.pipeline_tile, self.tile // (PIPE_SLOTS * self.size)) // itemsize)
        c.round_ = self.data_rounds
        c.steps = <uint64_t> ((c.count // self.size + (1 if c.count % self.size else 0) + c.per - 1) // c.per)
        self.data_rounds += 1
        for k in range(c.steps):
            self._pipe_stage(&c, k)
            self._pipe_reduce(&c, k)
            self._pipe_out(&c, k)
        self.piped += c.steps
        return 0

    cdef inline char* _pipe_slot(self, const PipeCall* c, int r, uint64_t k, int part) noexcept nogil:
        """Where rank r's tile k of part `part` lies in r's buffer: its staged copy of that
        part; in rank 0's buffer, once reduced, the reduced tile."""
        return (self._data(r, c.round_) + <int64_t> ((self.piped + k) % PIPE_SLOTS) * self.size * c.per * c.isz
                + part * c.per * c.isz)

    cdef inline int64_t _pipe_tile(self, const PipeCall* c, int part, uint64_t k, int64_t* hi) noexcept nogil:
        """Tile k of `part`: its first element (returned) and its end (`hi`; hi <= first: empty)."""
        cdef int64_t lo = _part_start(part, self.size, c.count) + <int64_t> k * c.per
        hi[0] = min(lo + c.per, _part_start(part + 1, self.size, c.count))
        return lo

    cdef int _pipe_stage(self, const PipeCall* c, uint64_t k) except -1 nogil:
        cdef Link* link = &self.transport.link
        cdef uint64_t pos = self.piped + k
        cdef int r
        cdef int64_t lo, hi
        if pos >= PIPE_SLOTS:
            self._await(PIPE_DONE, pos - PIPE_SLOTS + 1, -1, self.rank, link.spin, link.interval, link.hook)
        for r in range(self.size):
            if r != self.rank:
                lo = self._pipe_tile(c, r, k, &hi)
                if hi > lo:
                    fr_copy(self._pipe_slot(c, self.rank, k, r), c.src + lo * c.isz, (hi - lo) * c.isz)
        self._publish(PIPE_STAGED, pos + 1)
        return 0

    cdef int _pipe_reduce(self, const PipeCall* c, uint64_t k) except -1 nogil:
        cdef Link* link = &self.transport.link
        cdef int me = self.rank, r
        cdef int64_t isz = c.isz, sub = max(1, SUB_BYTES // c.isz), hi, m
        cdef int64_t lo = self._pipe_tile(c, me, k, &hi), off = 0
        # The reduced tile goes where every rank copies it from: rank 0's slot of this part, which
        # holds rank 0's staged input, the first operand in rank order, so that a rank after 0
        # accumulates there. Rank 0 reduces in place straight in its result (its input being the
        # first operand), and copies the tile into its slot after.
        cdef char* res = self._pipe_slot(c, 0, k, me)
        cdef char* mine = c.src + lo * isz
        cdef char* out = c.dst + lo * isz
        cdef bint direct = me == 0 and c.src == c.dst
        self._await(PIPE_STAGED, self.piped + k + 1, -1, me, link.spin, link.interval, link.hook)
        while off < hi - lo:  # in rank order, piece by piece while in L1
            m = min(sub, hi - lo - off)
            if me == 0 and not direct:
                fr_copy(res + off * isz, mine + off * isz, m * isz)
            for r in range(1, self.size):
                c.reduce((out if direct else res) + off * isz,
                         (mine if r == me else self._pipe_slot(c, r, k, me)) + off * isz, m)
            self._finish_piece((out if direct else res) + off * isz, m)
            if direct:
                fr_copy(res + off * isz, out + off * isz, m * isz)
            else:
                fr_copy(out + off * isz, res + off * isz, m * isz)
            off += m
        self._publish(PIPE_REDUCED, self.piped + k + 1)
        return 0

    cdef int _pipe_out(self, const PipeCall* c, uint64_t k) except -1 nogil:
        cdef Link* link = &self.transport.link
        cdef int r
        cdef int64_t lo, hi
        self._await(PIPE_REDUCED, self.piped + k + 1, -1, self.rank, link.spin, link.interval, link.hook)
        for r in range(self.size):
            if r != self.rank:
                lo = self._pipe_tile(c, r, k, &hi)
                if hi > lo:
                    fr_copy(c.dst + lo * c.isz, self._pipe_slot(c, 0, k, r), (hi - lo) * c.isz)
        self._publish(PIPE_DONE, self.piped + k + 1)
        return 0

    def gatherv(self, uintptr_t src, uintptr_t dst, const int64_t[::1] counts,
                const int64_t[::1] displs):
        """Every rank r contributes counts[r] bytes (this rank's at `src`), and every rank
        receives rank r's at dst + displs[r]: an allgather, or with one nonzero count a
        broadcast (the root's `src` may be its `dst`: it copies nothing to itself). `displs`
        is the same on every rank. From SHM_SINGLE_COPY_BYTES in all, where the ranks may copy
        between their memories, by single copy (the module docstring); otherwise in rounds of
        up to a buffer: each rank copies its piece into its buffer, and after one barrier
        every rank copies every other rank's piece out."""
        self._check()
        cdef int n = self.size, me = self.rank, r
        if counts.shape[0] != n or displs.shape[0] != n:
            raise ValueError(f"counts and displs need {n} entries, got {counts.shape[0]} and {displs.shape[0]}")
        cdef int64_t most = 0, total = 0
        for r in range(n):
            if counts[r] < 0:
                raise ValueError(f"counts[{r}] is negative: {counts[r]}")
            most = max(most, counts[r])
            total += counts[r]
        cdef int err = 0
        try:
            with nogil:
                if self._single_copy(total, self.single_copy_bytes):
                    if counts[me] and <char*> dst + displs[me] != <char*> src:
                        self._copy_out(<char*> dst + displs[me], <char*> src, counts[me], total >= self.streaming_bytes)
                    for r in range(n):
                        self._table(me)[1 + r] = src
                        self._table(me)[1 + n + r] = dst + displs[r]
                    err = self._single_copy_moves(&counts[0], True)
                else:
                    self._gatherv(<char*> src, <char*> dst, &counts[0], &displs[0], most, total >= self.streaming_bytes)
        except BaseException:
            self._failed()
            raise
        if err:
            self._raise_copy_error(err)

    def single_copy_broadcast(self, uintptr_t buf, int64_t nbytes, int root):
        """Broadcast the `nbytes` at `buf` on rank `root` into `buf` on every other rank by
        copying straight between the ranks' memories, as the transport's
        `single_copy_broadcast` does (the root writes the leading part into every other rank
        while each reads the rest, the root's part following the speeds measured on the
        broadcasts of about this size), with the addresses, the root's part and every rank's
        status exchanged through the segment and two barriers instead of MPI messages.
        Returns 0, or the errno of a copy that failed, the same on every rank: the bytes are
        then incomplete, and the caller sends them again another way."""
        self._check()
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is outside [0, {self.size})")
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        if not self._single_copy(nbytes, 0):
            raise ValueError("single copy is not enabled on this transport (enable_single_copy)")
        cdef int err = 0
        try:
            with nogil:
                err = self._single_copy_broadcast(<char*> buf, nbytes, root)
        except BaseException:
            self._failed()
            raise
        return err

    cdef int _single_copy_broadcast(self, char* buf, int64_t nbytes, int root) except -1 nogil:
        cdef int n = self.size, me = self.rank, j, err = 0
        cdef const pid_t* pids = self.transport.pids
        cdef double* share = root_share_of(self.transport, nbytes)
        cdef double began, wrote = 0, slowest_read = 0
        cdef int64_t part
        self._table(me)[1] = <uint64_t> buf
        if me == root:
            self._table(me)[2] = <uint64_t> root_part(share, nbytes)
        self._data_arrive()
        part = <int64_t> self._table(root)[2]
        began = now()
        if me == root:
            for j in range(n):
                if j != root and not err:
                    err = vm_copy(True, pids[j], buf, self._table(j)[1], part)
            wrote = now() - began
        else:
            err = vm_copy(False, pids[root], buf + part, self._table(root)[1] + part, nbytes - part)
            self._table(me)[self.read_time_word] = <uint64_t> ((now() - began) * 1e9)
        err = self._finish(err)
        if me == root and not err:
            for j in range(n):
                if j != root:
                    slowest_read = max(slowest_read, 1e-9 * self._table(j)[self.read_time_word])
            learn_root_share(share, nbytes, part, n, wrote, slowest_read)
        return err

    def stream_broadcast(self, uintptr_t buf, int64_t nbytes, int root):
        """Broadcast the `nbytes` at `buf` on rank `root` into `buf` on every other rank,
        through the root's stream ring: the root copies the bytes into its ring in pieces of
        SHM_STREAM_PIECE_BYTES (SHM_STREAM_LARGE_PIECE_BYTES where the readers write with
        streaming stores), publishing how far it got after each, and every other rank
        copies each piece out as soon as it is published and publishes how far it has read,
        which frees ring space for the root's later pieces. No barrier: the readers copy
        while the root writes, and each rank waits only for the piece, or the ring space, it
        needs next, so the call takes about one copy's time plus a piece."""
        self._check()
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is outside [0, {self.size})")
        if nbytes < 0:
            raise ValueError(f"nbytes must not be negative, got {nbytes}")
        cdef int64_t ring = self.ring
        cdef bint streaming = nbytes >= self.streaming_bytes
        # large pieces where the readers write with streaming stores: fewer hand-overs, and no
        # cache for a smaller piece to stay in
        cdef int64_t step = self.large_piece if streaming else self.stream_piece, piece
        cdef uint64_t start = self._stream_begin(nbytes, step, nbytes)
        cdef uint64_t end = start + <uint64_t> nbytes, at
        cdef Link* link = &self.transport.link
        cdef char* ring_base = self.base + self.stream_off + root * self.tile
        try:
            with nogil:
                at = start
                while at < end:
                    piece = min(step, <int64_t> (end - at))
                    if self.rank == root:
                        self._await_ring_space(at, piece)
                        fr_copy(ring_base + at % ring, <char*> buf + (at - start), piece)
                        self._publish(STREAM_SENT, at + piece)
                    else:
                        self._await(STREAM_SENT, at + piece, root, -1, link.spin, link.interval, link.hook)
                        self._copy_out(<char*> buf + (at - start), ring_base + at % ring, piece, streaming)
                        self._publish(STREAM_READ, at + piece)
                    at += piece
                self._publish(STREAM_READ, end)
        except BaseException:
            self._failed()
            raise

    cdef inline uint64_t _stream_begin(self, uint64_t length, int64_t piece, int64_t moved) noexcept nogil:
        """Start a streamed call of `length` stream bytes in pieces of `piece`, in which a rank
        writes at most `moved` bytes into its ring (all three the same on every rank); returns
        its first stream position, the same on every rank: the first past the last call's on a
        piece boundary (so no piece straddles the ring's end), or, where `moved` is
        SHM_STREAM_RESTART_BYTES or more, the first at the start of the ring."""
        if self.streamed > self.stream_start:  # the last call moved bytes: they end there
            self.stream_data_end = self.streamed
        self.stream_start = <uint64_t> _align(<int64_t> self.streamed,
                                              self.ring if moved >= _STREAM_RESTART else piece)
        self.streamed = self.stream_start + length
        return self.stream_start

    cdef int _await_ring_space(self, uint64_t p, int64_t piece) except -1 nogil:
        """Before this rank writes the piece of stream position `p` into its ring: wait until
        every other rank has read what that ring space last held, the bytes a ring's length
        earlier, or, where those fall between the last bytes streamed and this call's start
        (which `_stream_begin` may move up to the ring's start), the last bytes streamed."""
        cdef Link* link = &self.transport.link
        cdef uint64_t until = p + <uint64_t> piece
        if until <= <uint64_t> self.ring:
            return 0
        until -= <uint64_t> self.ring
        if until <= self.stream_start:
            until = min(until, self.stream_data_end)
        return self._await(STREAM_READ, until, -1, self.rank, link.spin, link.interval, link.hook)

    cdef int _exchange_write(self, const int64_t* io, bint per_dest, uint64_t p, int64_t off, int64_t w,
                             bint streaming) except -1 nogil:
        """`_stream_exchange`'s step at stream position `p`: this rank's slots (bytes `off` to
        `off + w` of each block it sends) into its ring, then how far it got published; an
        allgather's own block, the one it sends, then copied from where it is still in the
        cache."""
        cdef int n = self.size, me = self.rank, r, t
        cdef int64_t piece = self.large_piece, ring = self.ring, k
        cdef char* mine = self.base + self.stream_off + me * self.tile
        cdef bint wrote = False
        for r in range(n if per_dest else 1):
            if per_dest and r == me:
                continue
            k = min(w, io[2 * r + 1] - off)
            if k <= 0:
                continue
            if not wrote:
                self._await_ring_space(p, piece)
            wrote = True
            t = (r - me - 1 + n) % n if per_dest else 0
            fr_copy(mine + p % ring + t * w, <const char*> io[2 * r] + off, k)
        if wrote:
            self._publish(STREAM_SENT, p + piece)
            k = min(w, io[4 * n + 1] - off)
            if not per_dest and k > 0:
                self._copy_out(<char*> io[4 * n + 2] + off, <const char*> io[4 * n] + off, k, streaming)
        return 0

    cdef int _stream_exchange(self, const int64_t* io, bint per_dest, int64_t most, bint streaming) except -1 nogil:
        """Every rank's blocks to every other rank through the rings, in pieces, with no
        barrier: `io` holds 6n words, [send address, send length] per destination, [receive
        address, receive length] per source, then this rank's own block as [source, length]
        and [destination, 0] padding (this rank's entries in the first two are unused).
        `per_dest`: every destination gets its own block (alltoall: a piece is split into a
        slot per other rank); otherwise one block goes to all (allgather: destination 0's
        entry). `most` is the longest block any rank sends, the same on every rank, so that
        every rank steps through the same stream positions: at each, it writes its slots of
        a later position into its ring and publishes how far it got
        (SHM_STREAM_EXCHANGE_LEAD_PIECES ahead; an allgather copies the same piece into its
        own result there, while it is in the cache), copies its own block's part (alltoall),
        copies every peer's slot for it out of the peer's ring once published, and publishes
        how far it has read."""
        cdef int n = self.size, me = self.rank, r, t, slots = max(1, n - 1) if per_dest else 1
        cdef int64_t piece = self.large_piece, ring = self.ring
        cdef int64_t w = piece // slots // LINE * LINE, k, off
        cdef int64_t steps = (most + w - 1) // w
        cdef uint64_t start = self._stream_begin(<uint64_t> (steps * piece), piece, most * slots), p
        cdef Link* link = &self.transport.link
        cdef char* own_dst = <char*> io[4 * n + 2]
        cdef const char* own_src = <const char*> io[4 * n]
        cdef int64_t own_len = io[4 * n + 1], s
        # writing ahead of its reading, a rank that is held up a moment still finds its peers'
        # next pieces published (SHM_STREAM_EXCHANGE_LEAD_PIECES); never more than the ring holds
        cdef int64_t lead = min(_EXCHANGE_LEAD, ring // piece - 1)
        for s in range(min(lead, steps)):
            self._exchange_write(io, per_dest, start + <uint64_t> (s * piece), s * w, w, streaming)
        for s in range(steps):
            p = start + <uint64_t> (s * piece)
            off = s * w
            if s + lead < steps:
                self._exchange_write(io, per_dest, p + <uint64_t> (lead * piece), off + lead * w, w, streaming)
            k = min(w, own_len - off)
            if k > 0 and per_dest:  # an allgather's was copied as it was written
                self._copy_out(own_dst + off, own_src + off, k, streaming)
            for r in range(n):
                k = min(w, io[2 * n + 2 * r + 1] - off)
                if r == me or k <= 0:
                    continue
                self._await(STREAM_SENT, p + piece, r, -1, link.spin, link.interval, link.hook)
                t = (me - r - 1 + n) % n if per_dest else 0
                self._copy_out(<char*> io[2 * n + 2 * r] + off, self.base + self.stream_off + r * self.tile
                               + p % ring + t * w, k, streaming)
            self._publish(STREAM_READ, p + piece)
        off = steps * w
        if own_len > off and per_dest:
            self._copy_out(own_dst + off, own_src + off, own_len - off, streaming)
        return 0

    def allgather_rows(self, uintptr_t src, int64_t rows, int64_t row_bytes, object allocate,
                       cnp.ndarray known=None, int way=BY_SIZE):
        """An allgather whose row counts travel with the data: rank r contributes `rows`
        rows of `row_bytes` bytes at `src` (C-contiguous), every rank learns every rank's
        count in the barrier of the first data round, calls `allocate(counts)` (an int64
        array, rows per rank) for a C-contiguous result of sum(counts) rows, and receives
        every rank's rows there in rank order; returns (counts, the result). One barrier
        fewer than exchanging the counts first. The first round stages each rank's rows in its
        buffer unless they alone would go by single copy (SHM_SINGLE_COPY_BYTES): below that
        threshold in all, every rank has staged; from it on, the single-copy path runs and the
        staged bytes are not used. `known`: the counts, where every rank passes them alike
        (the engine's lean path learned them in its negotiation cycle): no first round, so
        no barrier before the data moves. `way` (EXCHANGE_*, alike on every rank): streamed
        or by single copy whatever the size, instead of by it."""
        self._check()
        cdef int n = self.size, me = self.rank, r
        cdef int64_t mine = rows * row_bytes
        cdef bint staged = known is None and self._stages(mine)
        cdef uint64_t round_ = self.data_rounds
        cdef int err = 0
        cdef int64_t most = 0, total = 0
        cdef int64_t[::1] c, b, d, bd
        cdef int64_t[::1] io
        cdef uintptr_t dst
        cdef bint streaming, direct, all_staged = known is None
        if known is None:
            self.data_rounds += 1
            try:
                with nogil:
                    # Beside the sequence word, one count slot per buffer parity: a rank cannot
                    # write round k+2's before every rank has passed round k+1's barrier.
                    self._word(me)[1 + (round_ & 1)] = <uint64_t> rows
                    if staged and mine:
                        fr_copy(self._data(me, round_), <char*> src, min(self.tile, mine))
                    self._data_arrive()
            except BaseException:
                self._failed()
                raise
            counts = np.empty(n, np.int64)
            c = counts
            for r in range(n):
                c[r] = <int64_t> self._word(r)[1 + (round_ & 1)]
        else:
            counts = known
            c = counts
            if c.shape[0] != n or c[me] != rows:
                raise ValueError(f"known counts must hold {n} entries, this rank's {rows}; got {known!r}")
        try:
            out = allocate(counts)
            dst = <uintptr_t> cnp.PyArray_DATA(out)
            # bytes from each rank, then where they land (C loops: NumPy calls on these few
            # numbers cost more than the barrier)
            bd = np.empty(2 * n, np.int64)
            b = bd[:n]
            d = bd[n:]
            for r in range(n):
                b[r] = c[r] * row_bytes
                d[r] = total
                most = max(most, b[r])
                total += b[r]
                all_staged = all_staged and self._stages(b[r])
            streaming = total >= self.streaming_bytes
            if way == DIRECT:
                with nogil:
                    direct = self._results_ready(dst, total)
                    if direct:
                        self._direct_allgather(<char*> src, mine, d[me], streaming)
                if direct:
                    return counts, out
                way = STREAMED
            if way == STREAMED or (way == BY_SIZE and total <= self.stream_exchange_bytes):
                io = np.zeros(6 * n, np.int64)
                io[0], io[1] = <int64_t> src, mine
                for r in range(n):
                    io[2 * n + 2 * r], io[2 * n + 2 * r + 1] = <int64_t> dst + d[r], b[r]
                if <char*> dst + d[me] != <char*> src:
                    io[4 * n], io[4 * n + 1], io[4 * n + 2] = <int64_t> src, mine, <int64_t> dst + d[me]
                with nogil:
                    self._stream_exchange(&io[0], False, most, streaming)
                return counts, out
            with nogil:
                if mine and <char*> dst + d[me] != <char*> src:
                    self._copy_out(<char*> dst + d[me], <char*> src, mine, streaming)
                if self._single_copy(total, 0 if way == COPIED else self.single_copy_bytes):
                    for r in range(n):
                        self._table(me)[1 + r] = src
                        self._table(me)[1 + n + r] = dst + d[r]
                    err = self._single_copy_moves(&b[0], True)
                elif all_staged:
                    for r in range(n):
                        if r != me and b[r]:
                            self._copy_out(<char*> dst + d[r], self._data(r, round_), min(self.tile, b[r]), streaming)
                    self._gather_rounds(<char*> src, <char*> dst, &b[0], &d[0], most, self.tile, streaming)
                else:
                    self._gather_rounds(<char*> src, <char*> dst, &b[0], &d[0], most, 0, streaming)
        except BaseException:
            self._failed()
            raise
        if err:
            self._raise_copy_error(err)
        return counts, out

    # ------------------------------------------------------------------ results area
    cdef bint _results_ready(self, uintptr_t dst, int64_t nbytes) except -1 nogil:
        """Publish where this rank's result of `nbytes` at `dst` lies in the results area (or
        that it lies elsewhere; an empty one, which no rank writes into, counts as in it),
        then one barrier: whether every rank's does, the same answer on every rank. The
        offsets go into the word of the barrier's parity: a rank that went on (the streamed
        way does not wait for a peer it receives nothing from) publishes its next ones after
        a barrier of the other parity, and cannot pass a third before every rank has read
        these."""
        cdef uintptr_t mine = <uintptr_t> self.results_base + self.rank * self.results_bytes
        cdef int r
        self.result_word = RESULT_AT + <int> ((self.seq + 1) & 1)
        if nbytes == 0:
            self._word(self.rank)[self.result_word] = 0
        elif self.results_bytes and mine <= dst and dst + nbytes <= mine + <uintptr_t> self.results_bytes:
            self._word(self.rank)[self.result_word] = dst - <uintptr_t> self.results_base
        else:
            self._word(self.rank)[self.result_word] = <uint64_t> NO_RESULT
        self._data_arrive()
        for r in range(self.size):
            if self._word(r)[self.result_word] == <uint64_t> NO_RESULT:
                return False
        return True

    cdef inline char* _result(self, int r) noexcept nogil:
        """Rank r's result, as `_results_ready` published it, in this process's mapping."""
        return self.results_base + self._word(r)[self.result_word]

    cdef int _direct_allgather(self, char* src, int64_t nbytes, int64_t at, bint streaming) except -1 nogil:
        """After `_results_ready`: this rank's `nbytes` at `src` into byte `at` of every rank's
        result, a tile at a time to every rank while the tile is in the cache, each rank
        starting at the next one's so that no two write into one result at once; then the
        barrier after which every rank's result is whole."""
        cdef int n = self.size, me = self.rank, i
        cdef int64_t lo = 0, piece
        cdef char* to
        while lo < nbytes:
            piece = min(<int64_t> DIRECT_TILE, nbytes - lo)
            for i in range(n):
                to = self._result((me + 1 + i) % n) + at + lo
                if to != src + lo:
                    self._copy_out(to, src + lo, piece, streaming)
            lo += piece
        self._data_arrive()
        return 0

    cdef int _direct_alltoall(self, char* src, const int64_t* counts, const int64_t* sdispls,
                              bint streaming) except -1 nogil:
        """After `_results_ready`: this rank's counts[me * n + k] bytes for each rank k, from
        src + sdispls[k], into k's result after the bytes of the ranks before this one, each
        rank starting at the next one's; then the barrier after which every result is whole."""
        cdef int n = self.size, me = self.rank, i, k, q
        cdef int64_t at
        for i in range(n):
            k = (me + 1 + i) % n
            at = 0
            for q in range(me):
                at += counts[q * n + k]
            if counts[me * n + k]:
                self._copy_out(self._result(k) + at, src + sdispls[k], counts[me * n + k], streaming)
        self._data_arrive()
        return 0

    cdef int _gatherv(self, char* src, char* dst, const int64_t* counts, const int64_t* displs,
                      int64_t most, bint streaming) except -1 nogil:
        if counts[self.rank] and dst + displs[self.rank] != src:
            self._copy_out(dst + displs[self.rank], src, counts[self.rank], streaming)
        return self._gather_rounds(src, dst, counts, displs, most, 0, streaming)

    cdef int _gather_rounds(self, char* src, char* dst, const int64_t* counts, const int64_t* displs,
                            int64_t most, int64_t lo, bint streaming) except -1 nogil:
        """The data rounds of a gatherv from byte `lo` of every rank's piece on."""
        cdef int n = self.size, me = self.rank, r
        cdef int64_t piece
        cdef uint64_t round_
        while lo < most:
            round_ = self.data_rounds
            self.data_rounds += 1
            piece = min(self.tile, counts[me] - lo)
            if piece > 0:
                fr_copy(self._data(me, round_), src + lo, piece)
            self._data_arrive()
            for r in range(n):
                piece = min(self.tile, counts[r] - lo)
                if r != me and piece > 0:
                    self._copy_out(dst + displs[r] + lo, self._data(r, round_), piece, streaming)
            lo += self.tile
        return 0

    def alltoallv(self, uintptr_t src, const int64_t[:, ::1] counts, const int64_t[::1] sdispls,
                  uintptr_t dst, const int64_t[::1] rdispls):
        """Rank r sends counts[r, j] bytes to rank j (every rank passes the whole matrix):
        this rank's to j from src + sdispls[j], and it receives rank r's at dst + rdispls[r].
        From SHM_SINGLE_COPY_BYTES between ranks in all, where the ranks may copy between
        their memories, by single copy (the module docstring); otherwise in rounds: each
        rank's buffer holds one piece for every destination, side by side."""
        self._check()
        cdef int n = self.size, r, j
        if counts.shape[0] != n or counts.shape[1] != n or sdispls.shape[0] != n or rdispls.shape[0] != n:
            raise ValueError(f"alltoallv needs a {n} x {n} counts matrix and {n} displacements each")
        cdef int64_t most = 0, total = 0, width = self._width(1)
        cdef int me = self.rank, err = 0
        for r in range(n):
            for j in range(n):
                if counts[r, j] < 0:
                    raise ValueError(f"counts[{r}, {j}] is negative: {counts[r, j]}")
                if r != j:
                    most = max(most, counts[r, j])
                    total += counts[r, j]
        try:
            with nogil:
                if self._single_copy(total, self.single_copy_bytes):
                    if counts[me, me]:
                        fr_copy(<char*> dst + rdispls[me], <char*> src + sdispls[me], counts[me, me])
                    for r in range(n):
                        self._table(me)[1 + r] = src + sdispls[r]
                        self._table(me)[1 + n + r] = dst + rdispls[r]
                    err = self._single_copy_moves(&counts[0, 0], False)
                else:
                    self._alltoallv(<char*> src, &counts[0, 0], &sdispls[0], <char*> dst, &rdispls[0], most, width)
        except BaseException:
            self._failed()
            raise
        if err:
            self._raise_copy_error(err)

    cdef int64_t _width(self, int64_t itemsize) except -1:
        """Bytes of one rank's piece when a buffer holds a piece for every rank."""
        cdef int64_t width = self.tile // self.size // 64 * 64
        width -= width % itemsize
        if width <= 0:
            raise ValueError(f"a {self.tile}-byte buffer cannot hold a piece for each of {self.size} ranks")
        return width

    def alltoall_rows(self, uintptr_t src, const int64_t[::1] send_rows, int64_t row_bytes, object allocate,
                      const int64_t[:, ::1] known=None, int way=BY_SIZE):
        """An alltoall whose row counts travel with the data: this rank sends send_rows[j]
        consecutive rows of `row_bytes` bytes from `src` (C-contiguous) to rank j; every rank
        learns the whole matrix of row counts in the barrier of the first data round (each
        rank's row heads its buffer), calls `allocate(received rows per rank)` for a
        C-contiguous result and receives every rank's rows there in rank order; returns (the
        rows received from each rank, the result). One barrier fewer than exchanging the counts
        first. What goes through the buffers and what by single copy is decided as in
        `allgather_rows`, on the bytes this rank sends to the others. `known`: the matrix of
        row counts (row r: rank r's send_rows), where every rank passes it alike (the engine's
        lean path learned it in its negotiation cycle): no first round, so no barrier before
        the data moves. `way`: as in `allgather_rows`."""
        self._check()
        cdef int n = self.size, me = self.rank, r, j
        if send_rows.shape[0] != n:
            raise ValueError(f"send_rows needs {n} entries, got {send_rows.shape[0]}")
        if known is not None and (known.shape[0] != n or known.shape[1] != n):
            raise ValueError(f"known needs {n} x {n} entries, got {known.shape[0]} x {known.shape[1]}")
        cdef int64_t head = _align(8 * n, 64), width = self._width(1)
        cdef int64_t first = (self.tile - head) // n // 64 * 64
        if first <= 0:
            raise ValueError(f"a {self.tile}-byte buffer cannot hold a piece for each of {n} ranks")
        cdef int64_t[::1] sd = np.empty(n + 1, np.int64)
        cdef int64_t mine = 0, most = 0, total = 0
        sd[0] = 0
        for j in range(n):
            sd[j + 1] = sd[j] + send_rows[j] * row_bytes
            if j != me:
                mine += send_rows[j] * row_bytes
        cdef bint staged = known is None and self._stages(mine)
        cdef uint64_t round_ = self.data_rounds
        cdef int err = 0
        cdef char* buf
        cdef int64_t[:, ::1] b, ints
        cdef int64_t[::1] rd, got, sent, gets
        cdef uintptr_t dst
        cdef bint streaming, direct, all_staged = known is None
        cdef int64_t widest = 0
        cdef int64_t* io
        cdef const int64_t* rows_of
        try:
            if known is None:
                self.data_rounds += 1
                with nogil:
                    buf = self._data(me, round_)
                    for j in range(n):
                        (<int64_t*> buf)[j] = send_rows[j]
                        if staged and j != me and sd[j + 1] > sd[j]:
                            fr_copy(buf + head + j * first, <char*> src + sd[j], min(first, sd[j + 1] - sd[j]))
                    self._data_arrive()
            received = np.empty(n, np.int64)
            got = received
            ints = np.zeros((n + 9, n), np.int64)  # one allocation for all of these
            b = ints[:n]  # bytes from rank r to rank j
            rd = ints[n]
            sent = ints[n + 1]  # bytes each rank sends to the others
            gets = ints[n + 2]  # bytes each rank's result holds
            for r in range(n):
                rows_of = <const int64_t*> self._data(r, round_) if known is None else &known[r, 0]
                got[r] = rows_of[me]
                for j in range(n):
                    b[r, j] = rows_of[j] * row_bytes
                    gets[j] += b[r, j]
                    if r != j:
                        most = max(most, b[r, j])
                        total += b[r, j]
                        sent[r] += b[r, j]
            for r in range(n):
                widest = max(widest, gets[r])
                all_staged = all_staged and self._stages(sent[r])
            out = allocate(received)
            dst = <uintptr_t> cnp.PyArray_DATA(out)
            rd[0] = 0
            for r in range(1, n):
                rd[r] = rd[r - 1] + b[r - 1, me]
            streaming = rd[n - 1] + b[n - 1, me] >= self.streaming_bytes
            if way == DIRECT:
                with nogil:
                    direct = self._results_ready(dst, rd[n - 1] + b[n - 1, me])
                    if direct:
                        self._direct_alltoall(<char*> src, &b[0, 0], &sd[0], streaming)
                if direct:
                    return received, out
                way = STREAMED
            if way == STREAMED or (way == BY_SIZE and widest <= self.stream_exchange_bytes):
                io = &ints[n + 3, 0]  # the last 6n words
                for r in range(n):
                    io[2 * r], io[2 * r + 1] = <int64_t> src + sd[r], b[me, r]
                    io[2 * n + 2 * r], io[2 * n + 2 * r + 1] = <int64_t> dst + rd[r], b[r, me]
                io[4 * n], io[4 * n + 1], io[4 * n + 2] = <int64_t> src + sd[me], b[me, me], <int64_t> dst + rd[me]
                with nogil:
                    self._stream_exchange(io, True, most, streaming)
                return received, out
            with nogil:
                if b[me, me]:
                    self._copy_out(<char*> dst + rd[me], <char*> src + sd[me], b[me, me], streaming)
                if self._single_copy(total, 0 if way == COPIED else self.single_copy_bytes):
                    for r in range(n):
                        self._table(me)[1 + r] = src + sd[r]
                        self._table(me)[1 + n + r] = dst + rd[r]
                    err = self._single_copy_moves(&b[0, 0], False)
                elif all_staged:
                    for r in range(n):
                        if r != me and b[r, me]:
                            self._copy_out(<char*> dst + rd[r], self._data(r, round_) + head + me * first,
                                           min(first, b[r, me]), streaming)
                    self._alltoall_rounds(<char*> src, &b[0, 0], &sd[0], <char*> dst, &rd[0], most, width, first,
                                          streaming)
                else:
                    self._alltoall_rounds(<char*> src, &b[0, 0], &sd[0], <char*> dst, &rd[0], most, width, 0,
                                          streaming)
        except BaseException:
            self._failed()
            raise
        if err:
            self._raise_copy_error(err)
        return received, out

    cdef int _alltoallv(self, char* src, const int64_t* counts, const int64_t* sdispls, char* dst,
                        const int64_t* rdispls, int64_t most, int64_t width) except -1 nogil:
        cdef int me = self.rank, n = self.size
        if counts[me * n + me]:
            fr_copy(dst + rdispls[me], src + sdispls[me], counts[me * n + me])
        return self._alltoall_rounds(src, counts, sdispls, dst, rdispls, most, width, 0, False)

    cdef int _alltoall_rounds(self, char* src, const int64_t* counts, const int64_t* sdispls, char* dst,
                              const int64_t* rdispls, int64_t most, int64_t width, int64_t lo,
                              bint streaming) except -1 nogil:
        """The data rounds of an alltoallv from byte `lo` of every piece on."""
        cdef int n = self.size, me = self.rank, r, j
        cdef int64_t piece
        cdef uint64_t round_
        while lo < most:
            round_ = self.data_rounds
            self.data_rounds += 1
            for j in range(n):
                piece = min(width, counts[me * n + j] - lo)
                if j != me and piece > 0:
                    fr_copy(self._data(me, round_) + j * width, src + sdispls[j] + lo, piece)
            self._data_arrive()
            for r in range(n):
                piece = min(width, counts[r * n + me] - lo)
                if r != me and piece > 0:
                    self._copy_out(dst + rdispls[r] + lo, self._data(r, round_) + me * width, piece, streaming)
            lo += width
        return 0

    def reduce_scatter(self, uintptr_t src, const int64_t[::1] offsets, uintptr_t dst,
                       uintptr_t reduce_fn, int64_t itemsize, bint streaming=False):
        """Rank r receives at `dst` the reduction of every rank's bytes
        src[offsets[r]:offsets[r + 1]] (offsets in bytes, multiples of `itemsize`; `src` is
        left as it is). In rounds: each rank copies a piece of every other rank's part into
        its buffer, side by side, and after one barrier reduces its own part's pieces, in rank
        order, straight into `dst`."""
        self._check()
        cdef int n = self.size, r
        if offsets.shape[0] != n + 1:
            raise ValueError(f"offsets needs {n + 1} entries, got {offsets.shape[0]}")
        cdef int64_t most = 0, width = min(self._width(itemsize),
                                           max(itemsize, self.reduce_scatter_round_bytes // itemsize * itemsize))
        for r in range(n):
            if offsets[r + 1] < offsets[r] or (offsets[r + 1] - offsets[r]) % itemsize:
                raise ValueError(f"part {r} ({offsets[r]}..{offsets[r + 1]}) is not a whole number of items")
            most = max(most, offsets[r + 1] - offsets[r])
        try:
            with nogil:
                self._reduce_scatter(<char*> src, &offsets[0], <char*> dst, <reduce_fn_t> reduce_fn,
                                     itemsize, most, width, streaming)
        except BaseException:
            self._failed()
            raise

    cdef int _reduce_scatter(self, char* src, const int64_t* offsets, char* dst, reduce_fn_t reduce,
                             int64_t itemsize, int64_t most, int64_t width, bint streaming) except -1 nogil:
        cdef int n = self.size, me = self.rank, r, j
        cdef int64_t lo = 0, piece, off, k
        cdef int64_t sub = SUB_BYTES // itemsize * itemsize if SUB_BYTES >= itemsize else itemsize
        cdef uint64_t round_
        cdef char* out
        while lo < most:
            round_ = self.data_rounds
            self.data_rounds += 1
            for j in range(n):
                piece = min(width, offsets[j + 1] - offsets[j] - lo)
                if j != me and piece > 0:
                    fr_copy_as(self._data(me, round_) + j * width, src + offsets[j] + lo, piece, streaming)
            self._data_arrive()
            piece = min(width, offsets[me + 1] - offsets[me] - lo)
            # In L1-sized pieces, each copied and then reduced into while still in cache.
            off = 0
            while off < piece:
                k = min(sub, piece - off)
                out = dst + lo + off
                if me == 0:
                    fr_copy(out, src + offsets[me] + lo + off, k)
                else:
                    fr_copy(out, self._data(0, round_) + me * width + off, k)
                for r in range(1, n):
                    reduce(out, src + offsets[me] + lo + off if r == me
                           else self._data(r, round_) + me * width + off, k // itemsize)
                off += k
            lo += width
        return 0

    def cycle_exchange(self, uintptr_t block, int64_t vector_words, int64_t capacity,
                       uintptr_t tmp, uintptr_t reduce_fn, int64_t itemsize,
                       double stall_seconds, object on_stall):
        """`Transport.cycle_exchange` (same arguments and result; `tmp` is not needed)
        through the segment: every rank writes its block into its cycle slot, and after one
        barrier combines every slot, in rank order, into its own block, so that a
        negotiation cycle makes no MPI call."""
        return self._cycle(block, vector_words, capacity, reduce_fn, itemsize, stall_seconds, on_stall)

    def lone_cycle(self, uintptr_t block, int64_t vector_words, int64_t capacity, uintptr_t tmp,
                   uintptr_t reduce_fn, int64_t itemsize, double stall_seconds, object on_stall,
                   uint64_t h, cnp.ndarray src not None, cnp.ndarray dst):
        """`Transport.lone_cycle` (same arguments and result; `tmp` is not needed) through the
        segment: the whole lean path of a small synchronous allreduce in one call. The payload
        goes from `src` straight into this rank's cycle slot, and a clean outcome's reduction
        from the slots straight into `dst`: two copies fewer than through the block."""
        lone_payload(block, vector_words, capacity, h, src, dst, False)
        outcome = self._cycle(block, vector_words, capacity, reduce_fn, itemsize, stall_seconds, on_stall,
                              <const char*> cnp.PyArray_DATA(src),
                              <char*> cnp.PyArray_DATA(dst) if dst is not None else NULL)
        return outcome, lone_result(block, vector_words, h, outcome, None)

    cdef tuple _cycle(self, uintptr_t block, int64_t vector_words, int64_t capacity, uintptr_t reduce_fn,
                      int64_t itemsize, double stall_seconds, object on_stall, const char* src=NULL,
                      char* dst=NULL):
        """The cycle through the segment. `src`: this rank's payload lies there, not in the
        block; `dst`: a clean outcome's payload (this rank's proposal agreed by every rank, no
        flags, nothing else ready or pending) is reduced there, not into the block."""
        self._check()
        cdef int64_t words = HEADER_WORDS + 2 * vector_words
        if words * 8 + capacity > self.cycle_bytes:
            raise ValueError(f"a cycle block of {words * 8 + capacity} bytes does not fit the "
                             f"segment's {self.cycle_bytes}-byte cycle slots")
        cdef uint64_t round_ = self.cycles
        self.cycles += 1
        cdef uint64_t* header = <uint64_t*> block
        cdef uint64_t* ready = header + HEADER_WORDS
        cdef uint64_t* pending = ready + vector_words
        cdef int r
        cdef int64_t i
        cdef bint leftover = False, any_ready = False
        cdef void* hook = <void*> on_stall if on_stall is not None else NULL
        cdef reduce_fn_t reduce = <reduce_fn_t> reduce_fn
        cdef uint64_t* other
        cdef uint64_t proposed = header[HASH]
        cdef int64_t payload = block_bytes(words, <char*> block) - words * 8
        cdef char* slot = self._cycle_slot(self.rank, round_)
        cdef char* into
        cdef bint streaming = payload >= self.cycle_streaming_bytes
        try:
            with nogil:
                fr_copy(slot, <char*> block, words * 8)
                fr_copy_as(slot + words * 8, <char*> block + words * 8 if src == NULL else src, payload, streaming)
                self._arrive(_CYCLE_SPIN, stall_seconds if hook != NULL else 0, hook)
                # The payloads are reduced only where every rank proposed the same request:
                # a rank that proposed another (or none) may not hold their reduction at all.
                for r in range(self.size):
                    other = <uint64_t*> self._cycle_slot(r, round_)
                    if other[HASH] != proposed or <int64_t> other[PAYLOAD_BYTES] != <int64_t> header[PAYLOAD_BYTES]:
                        reduce = NULL
                # the headers and bits first, then the payloads, in rank order, where they go
                fr_copy(<char*> block, self._cycle_slot(0, round_), words * 8)
                for r in range(1, self.size):
                    combine_blocks(words, vector_words, NULL, itemsize, <char*> block, self._cycle_slot(r, round_))
                for i in range(vector_words):
                    any_ready = any_ready or ready[i] != 0
                    leftover = leftover or (pending[i] & ~ready[i]) != 0
                if reduce != NULL and payload > 0:
                    into = (dst if dst != NULL and header[0] == 0 and header[HASH] == proposed
                            and not leftover and not any_ready else <char*> block + words * 8)
                    fr_copy(into, self._cycle_slot(0, round_) + words * 8, payload)
                    for r in range(1, self.size):
                        reduce(into, self._cycle_slot(r, round_) + words * 8, payload // itemsize)
        except BaseException:
            self._failed()
            raise
        return header[0], header[HASH], leftover, any_ready


def copy_streaming(uintptr_t dst, uintptr_t src, int64_t nbytes):
    """Copy `nbytes` from `src` to `dst` (addresses) with streaming stores, as the segment's
    collectives write their large outputs: a copy that does not read the destination's lines
    first (scripts/bench_shm.py's second floor).

    Example:
        >>> import numpy as np
        >>> a, b = np.arange(100, dtype=np.uint8), np.zeros(100, np.uint8)
        >>> copy_streaming(b.ctypes.data, a.ctypes.data, 100); bool((a == b).all())
        True
    """
    if nbytes < 0:
        raise ValueError(f"nbytes must not be negative, got {nbytes}")
    with nogil:
        fr_copy_streaming(<char*> dst, <const char*> src, nbytes)


cdef extern from "<errno.h>":
    int errno


cdef int _errno() noexcept:
    return errno
