"""Every tunable of fastring in one place: environment variables, their defaults, and the
algorithm thresholds measured on the reference machine (see BENCHMARKS.md)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

LOG_LEVELS = ("warning", "info", "debug")

# Messages up to this size take a latency algorithm under FASTRING_ALGORITHM=auto, and a
# synchronous allreduce this small travels inside its own negotiation cycle: below it MPI's
# allreduce and the cycle are faster than the ring (BENCHMARKS.md, allreduce tables).
SMALL_MESSAGE_BYTES = 64 * 1024
# A synchronous broadcast or reducescatter (its whole input) this small rides its negotiation
# cycle too (the root's bytes summed with the others' zeros, the whole input reduced), so that
# it costs one cycle instead of a cycle and a data phase: np=2, a 64 B broadcast 4.6-5.1 us
# against 7.1-8.1; switched within a launch, 16 KiB 7.7 against 8.4 and 9.5 against 11.1, while
# at 32-64 KiB the data phase was the faster (BENCHMARKS.md, "Round 2, session 15").
CYCLE_COLLECTIVE_MAX_BYTES = 16 * 1024
# A synchronous allgather's cycle (and an object collective's), which carries every rank's row
# count (or header word), also has room for this many bytes of rows: CYCLE_GATHER_BYTES // size
# per rank in whole 8-byte words (128 B at np=2, 80 B at 3, none above 32 ranks). An allgather
# whose every rank's rows fit needs no data phase. Every allgather's cycle carries the room, so
# it stays small: with 1 KiB, allgathers too large for it took about 1 us more (np=2, 4-64
# KiB); with 256 B a 4 KiB allgather took 9.6-9.9 us against 8.8-8.9 before the room, the
# room and the call that reads it (BENCHMARKS.md, "Round 2, session 15").
CYCLE_GATHER_BYTES = 256
# The ring's reduce-scatter moves and reduces chunks in segments of this size, double
# buffered: large enough that MPI round trips are few (MPICH's shared-memory copies run best
# on large messages), small enough that a received segment is still in cache when it is
# reduced. Chosen by measurement against 64 KiB-8 MiB at np=2 on the reference machine that
# BENCHMARKS.md describes.
RING_SEGMENT_BYTES = 1024 * 1024
# Where the ring crosses hosts, segments of this size instead: over TCP each MPI message costs
# a rendezvous round trip that waits behind the previous message's bytes on the same stream,
# an idle wire for every segment. On simulated hosts at 2 Gbit/s (2 x 1 ranks, interleaved in
# one launch) a 64 MiB ring took 1.4x MPI_Allreduce's time in 1 MiB segments and 0.9x in 16 MiB.
NETWORK_RING_SEGMENT_BYTES = 16 * 1024 * 1024
# The hierarchical allreduce and broadcast through a host's shared segment work in slices of
# at least HIERARCHY_SLICE_BYTES, the host's work on the next and previous slices running
# while the current one crosses hosts (fastring/algorithms/hierarchical.py). Each slice costs
# the ring across hosts its 2 (H - 1) steps of latency again, so a slice also sends at least
# HIERARCHY_CHUNK_BYTES through each host's link per step: on many hosts, fewer slices.
HIERARCHY_SLICE_BYTES = 8 * 1024 * 1024
HIERARCHY_CHUNK_BYTES = 1024 * 1024
# The ring on a 16-bit wire runs whole (reduce-scatter and allgather) one segment at a time,
# through three 16-bit buffers of a segment each. Small segments stay in cache and large ones
# stream; which is faster depends on how the cores share their caches at the time, which can
# change between runs (BENCHMARKS.md, "Why compression misses"). So the ring times both per
# message size on the user's calls and uses the faster one, as the one-host ways are chosen
# (fastring.algorithms.choice.TimedChoice, PATH_TIMING_PERIOD_CALLS).
WIRE_SEGMENT_ELEMENTS = 256 * 1024
WIRE_STREAM_SEGMENT_ELEMENTS = 4 * 1024 * 1024
# Broadcasts above this size on 3 or more ranks take the pipelined chain, in segments of
# BROADCAST_SEGMENT_BYTES; smaller ones (and all on two ranks) take the binomial tree.
BROADCAST_CHAIN_BYTES = SMALL_MESSAGE_BYTES
BROADCAST_SEGMENT_BYTES = 256 * 1024
# Broadcasts from this size up copy straight between the ranks' memories when every rank is
# on one host (root and receivers copying at once); below it the extra address and status
# exchanges cost more than they save (single copy and tree break even at about this size;
# BENCHMARKS.md, Broadcast, for the large sizes).
BROADCAST_SINGLE_COPY_BYTES = SMALL_MESSAGE_BYTES
# The one-host shared-memory path (fastring/_transport/shm.pyx): each rank has two data
# buffers of SHM_TILE_BYTES in the host's segment, and a large allreduce runs in rounds of that
# many bytes, so that what one rank copies in is still in the shared L3 cache when the others
# read it (the segment's data area, 2 x ranks x tile, is half of a 32 MiB L3 at np=2), with
# few enough round barriers that a rank preempted on a loaded machine stalls the others
# rarely (1 MiB tiles lost up to 20x at 16 MiB under load; BENCHMARKS.md, issue 18).
# Up to SHM_ONE_STEP_BYTES every rank reduces the whole message itself after one barrier,
# which beats two barriers and a split below that size (BENCHMARKS.md, issue 18).
SHM_TILE_BYTES = 4 << 20
SHM_ONE_STEP_BYTES = 256 * 1024
# A group of tensors reduced where they lie (grouped_allreduce, a fused batch:
# SharedSegment.allreduce_pieces), and an allreduce of one buffer or less above
# SHM_ONE_STEP_BYTES, go through the segment in rounds of this many bytes: a round's inputs,
# the buffers it passes through and its results stay in this CPU's 1 MiB L2, where a round of
# a whole 4 MiB buffer went through memory (100 x 40 KB: 180-200 against 280-300 us; a 4 MiB
# allreduce in the machine's slow state 296-304 against 442-466 us; BENCHMARKS.md, issue 18,
# round 2, session 5).
SHM_PIECES_ROUND_BYTES = 1 << 20
# allgather, broadcast, alltoall and reducescatter move their data through the segment's
# buffers up to this many bytes (the whole result of an allgather, the input otherwise;
# broadcasts stream: SHM_STREAM_BROADCAST_MAX_BYTES):
# there the MPI round trips it saves dominate. Above it the segment's two copies (in, out)
# lost to MPI's own large-message transfers and to the single-copy broadcast, at 16 MiB by
# 2-3x (BENCHMARKS.md, issue 18); allgather, broadcast and alltoall go by single copy through
# the segment instead where they may (SHM_SINGLE_COPY_BYTES), reducescatter takes the ring.
# Their row counts always travel through it.
SHM_COLLECTIVE_MAX_BYTES = 1 << 20
# reducescatter's input goes through the segment's buffers up to this many bytes, the ring
# above, in rounds that move at most SHM_REDUCESCATTER_ROUND_BYTES of every rank's part: what a
# rank copies in is still in the cache when its peer reduces it. np=2, against rounds of a
# whole buffer's share (2 MiB) and the ring, µs: 4 MiB of input 174-178 against 336 and 225;
# 8 MiB 330-345 against 726 and 492; 16 MiB 913-943 against 1269 and 1479; at 32 MiB the ring
# won (2022 against 2330); 256 and 512 KiB tied (BENCHMARKS.md, session 5, after the merge;
# scripts/bench_reducescatter.py).
SHM_REDUCESCATTER_MAX_BYTES = 16 << 20
SHM_REDUCESCATTER_ROUND_BYTES = 256 << 10
# How a rank writes into the segment what the others read (a reducescatter's rounds; an
# allreduce through the segment's buffers, in one step or in rounds, up to a buffer): plain
# stores (the lines then move from its cache to the reader's) or streaming stores (to memory,
# read from there). Which is faster changes from one launch to the next on one machine: a
# reducescatter of 1 MiB of input, np=2, plain 45-54 µs and streaming 80-95 in most launches,
# plain 267-305 and streaming 62-78 in others; an allreduce of 1 MiB with plain stores 86 µs
# in most and about 500 in others (BENCHMARKS.md, "Round 2, session 12"). So the calls time
# both (`fastring.algorithms.choice.timed_stores`).
SHM_STORE_WAYS = ("cached", "streaming")
# Where the ranks may copy between their memories (Cross Memory Attach), allgather and
# alltoall from SHM_SINGLE_COPY_BYTES moved between the ranks, and allreduce from
# SHM_ALLREDUCE_SINGLE_COPY_BYTES, copy straight between the ranks' buffers instead of through
# the segment's: one copy instead of two, and two barriers a call instead of one or two a
# round. The ranks claim SHM_SINGLE_COPY_CHUNK_BYTES at a time, so a rank that is preempted
# holds back one chunk while the others take the rest. A copy between processes costs several
# times a memcpy per byte on this kind of VM, so they switch only where the rounds' barriers
# cost more: up to one buffer (SHM_TILE_BYTES: one round) the segment's buffers were faster
# (BENCHMARKS.md, issue 18, large messages). The allreduce pipelined through the segment's
# buffers (SHM_PIPELINE_TILE_BYTES) beat single copy at 6-48 MiB in most states of the machine
# (tied in others), by 10-25% on huge pages and more on 4 KiB pages, and tied at 256 MiB; but
# with more busy processes than cores its tiles wait on each other (once 10x longer at 64 MiB,
# 60 ms a 16 MiB call in one launch), so from SHM_ALLREDUCE_SINGLE_COPY_BYTES the faster of
# the two for each buffer runs (PathTimes; BENCHMARKS.md, issue 18, session 5). That starts
# above one buffer: at 5-12 MiB the pipeline took 4x single copy's time in the machine's slow
# state (where every hand-over of a line between the cores is slow) and up to 1.17x in its
# fast state (BENCHMARKS.md, "Round 2, session 13"). Broadcasts
# from SHM_COLLECTIVE_MAX_BYTES take the single-copy broadcast instead, which splits the bytes
# between the root and the readers by their measured speeds and beat both claimed chunks and
# the segment's buffers.
SHM_SINGLE_COPY_BYTES = SHM_TILE_BYTES
SHM_ALLREDUCE_SINGLE_COPY_BYTES = SHM_TILE_BYTES + 1  # more than one buffer
SHM_SINGLE_COPY_CHUNK_BYTES = 1 << 20
# A group reduced where its tensors lie (grouped_allreduce, a fused batch: `allreduce_pieces`)
# goes in rounds through the segment's buffers, with the stores timed as up to a buffer, until
# this many bytes in all; from here single copy, which needs the group gathered into one buffer
# first (np=2, 8-16 MB groups: the rounds 993-2381 us against 1478-3346 gathered and copied in
# the fast state; in the slow state, plain stores 3030-6142 against 1406-3247: BENCHMARKS.md,
# "Round 2, session 13").
SHM_PIECES_SINGLE_COPY_BYTES = 16 << 20
# An allreduce of more than a buffer that does not go by single copy is pipelined through the
# segment's buffers in tiles of at most this many bytes per rank's part: small enough that a
# tile one rank stages is still in the cache when another reduces it, large enough that the
# three flags a tile costs stay small beside its copies (at 16 MiB, 128 and 192 KiB ran alike,
# 64 and 256 KiB 4-8% slower, 32 KiB 15-20%; BENCHMARKS.md, issue 18, session 5).
SHM_PIPELINE_TILE_BYTES = 128 * 1024
# A broadcast on one host streams through the root's ring in the segment (SHM_TILE_BYTES) in
# pieces of this many bytes (below SHM_STREAMING_STORE_BYTES): the readers copy a piece out
# while the root copies the next in.
SHM_STREAM_PIECE_BYTES = 64 * 1024
# Streams whose outputs take streaming stores (broadcasts from SHM_STREAMING_STORE_BYTES), and
# every allgather and alltoall that streams, hand over pieces of this size instead: fewer waits
# for the peers' flags (16 MiB broadcast 430 against 481 us with 64 KiB pieces; allgather
# 1 MiB 60 against 67 us, 16 MiB 2072 against 2583 us: BENCHMARKS.md, issue 18, session 5).
SHM_STREAM_LARGE_PIECE_BYTES = 512 * 1024
# A streamed call in which a rank writes this many bytes or more into its ring starts at the
# start of the ring; a smaller one where the last one ended. Back at the ring's start a call
# writes the ring memory that the last such call wrote, still in the cache, but after a
# smaller call the readers' own caches still hold those lines, which the writer must take back
# from them: at 256 KiB, np=2, 47 against 33 us a call; at 1 MiB the lines had left them, and
# starting where the last call ended found its part of the ring cold: a stream run after 30
# single copies, as a timed choice tries it, 66-75 against 45-49 us (BENCHMARKS.md, "Round 2,
# session 16").
SHM_STREAM_RESTART_BYTES = 1 << 20
# Broadcasts up to this size stream (up to SHM_STREAMING_STORE_BYTES the readers' copies out
# of the ring stay in the cache; from it they take streaming stores); above it the single-copy
# broadcast, which tied with the stream at 32 and 64 MiB (BENCHMARKS.md, issue 18, session 4).
SHM_STREAM_BROADCAST_MAX_BYTES = 16 << 20
# The segment's allgathers write outputs of this many bytes and more with streaming
# (non-temporal) stores: at this size the output no longer stays in the cache anyway, and a
# plain store reads each line before writing it.
SHM_STREAMING_STORE_BYTES = 16 << 20
# A negotiation cycle's payload (a small allreduce riding it) of this many bytes and more goes
# into the rank's cycle slot with streaming stores, so that the other ranks read it from
# memory, not out of this core's cache: in the machine's slow state, where a hand-over of
# freshly written lines between the cores is 3-10x slower, a 64 KiB allreduce riding the
# cycle took 18 us so against 40 with plain stores; in the fast state 8-20% more (64 KiB 15.2
# against 14.1 us, 16 KiB 6.4-6.6 against 5.5-5.8: still 1.4-1.9x MPI); at 4 and 8 KiB the
# fast state's loss made it slower than MPI (BENCHMARKS.md, "Round 2, session 14").
SHM_CYCLE_STREAMING_BYTES = 16 * 1024
# allgather and alltoall whose output on a rank is at most this many bytes stream through the
# ranks' rings as broadcasts do (every rank writes a piece into its ring and copies the others'
# pieces out while they are still in the cache); larger ones go by single copy or in rounds.
SHM_STREAM_EXCHANGE_MAX_BYTES = 32 << 20
# In those streams each rank writes this many pieces ahead of the ones it reads, so that one
# held up for a moment finds its peers' next pieces already published (the 16 MiB alltoall,
# np=2 under load: 1927 against 2405 us with no lead; 1 and 4 pieces in between).
SHM_STREAM_EXCHANGE_LEAD_PIECES = 2
# A single-copy-sized allreduce of a buffer goes by single copy or in rounds, whichever was the
# faster for that buffer (huge pages or not decide it: fastring.algorithms.shm.PathTimes); the
# other is tried again in one of every so many SHM_ALLREDUCE_RETRY_CALLS calls that retrying it
# costs at most RETRY_COST_SHARE of the calls' time.
SHM_ALLREDUCE_RETRY_CALLS = 64
# A TimedChoice way or PathTimes path slower than the chosen one is tried again only so often
# that its tries, as their kept times price them, add at most this share to the calls' time
# (fastring.algorithms.choice.retry_every). Retried every k periods where k times slower, a
# 1 MiB broadcast's stream in the machine's slow state ran at 6-8x single copy's time in its
# tries and the single-copy call after each at 1.7x (BENCHMARKS.md, "Round 2, session 14").
RETRY_COST_SHARE = 0.01
# Where two ways of moving a one-host message are both correct and which is faster depends on
# the machine (a broadcast streamed through the segment or copied between the processes:
# fastring.algorithms.choice), each way is timed again once in every this many calls of a size;
# a timed call costs one small allreduce more to agree on the time.
PATH_TIMING_PERIOD_CALLS = 64
# The background thread leaves the queue alone while submissions keep coming (one within this
# share of a cycle time, FASTRING_CYCLE_TIME) or another thread drives its own cycles, for this
# many cycle times from the oldest request's submission (or its own last cycle, where that
# came later): a burst fuses into one cycle, and a steady stream still progresses
# (fastring._transport.gate.Gate.decide).
BURST_QUIET_CYCLES = 0.5
BURST_MOST_CYCLES = 5
# It looks at the queue once a cycle time without the GIL until nothing was submitted for this
# many cycle times, then waits for a submission to wake it: a training loop's steps come
# sooner, and cost no wake-up; an idle process is not woken a thousand times a second.
POLL_IDLE_CYCLES = 100
# Allgathers and alltoalls on one host whose every rank knows the call's bytes (the lean path)
# choose so between streaming and single copy from this many bytes of output in all up to
# SHM_STREAM_EXCHANGE_MAX_BYTES; smaller ones stream: a copy between processes costs a
# barrier and syscalls more.
SHM_TIMED_CHOICE_MIN_BYTES = 64 * 1024
# ...unless every rank's result lies in the segment's results area: a pool of result buffers
# in shared memory that every rank on the host maps, this many bytes of it each (allocated in
# /dev/shm at init; without room there, the segment comes without the area). Then each rank
# writes its bytes straight into every rank's result: one copy, no syscall, one barrier before
# and one after (np=2, 1 MiB: an alltoall 53-55 us against 75-87 streamed and 70-74 for
# MPI_Alltoall, an allgather 83-90 against 134-158 and 137-146; BENCHMARKS.md, "Round 2,
# session 9"). Room for the results of a 16 MiB allgather at np=2 and of a few smaller calls
# beside it.
SHM_RESULTS_BYTES = 64 << 20
# Where MPICH (the `mpich` wheel's MPI) names each host's shared-memory segment: it keeps the
# name until MPI_Finalize, so a killed or aborted job leaves it. The host's first rank unlinks
# it in `init` (fastring/_transport/shm.pyx, `unlink_mapped`), and fastring-run removes those a
# job left unmapped (a rank killed before `init`, a program without fastring).
MPI_SEGMENT_PREFIX = "/dev/shm/mpich_shm_"
# Where MPICH's process manager writes the host's topology for each job's ranks: its proxy
# removes the file when it ends, but not when it is killed, as it is when a failing rank stops
# the job; fastring-run removes those a job left (fastring/tools/launcher.py).
HYDRA_TOPOLOGY_PREFIX = "/tmp/hydra_hwloc_xmlfile_"
# A wait on the segment spins on loads this long (a peer in step arrives within microseconds),
# then yields its core between loads until its spin time (WAIT_*_SPIN_SECONDS below) is up: on
# a loaded machine the peer may be queued behind this very core, and a round barrier that
# spins it out stalls both ranks for a time slice (BENCHMARKS.md, issue 18).
SHM_HOT_SPIN_SECONDS = 50e-6
# ...unless this rank left its previous barrier less than this long ago: the ranks are in a run
# of back-to-back collectives, and a peer that is late has been preempted on its own core (or
# is in Python between calls), not queued behind this one (that shows in the core it
# publishes). Then the wait spins this long before it yields: a yield on a loaded machine hands
# the core to another process for a whole slice, the peer's next wait then outlasts the hot
# spin and yields in turn, and the pair stays in that slow state call after call.
SHM_ACTIVE_SPIN_SECONDS = 1e-3
# A negotiation cycle's slot in the segment: the header, the bit vectors of a full response
# cache (16,384 entries: 4 KiB) and SMALL_MESSAGE_BYTES of payload.
SHM_CYCLE_BYTES = 80 * 1024
# A tensor of at least this many bytes is never fused: it is reduced alone, where it lies. Its
# copies into the fusion buffer and back cost more than a call of its own (a 24M-parameter
# MLP's gradients took twice as long fused as alone: BENCHMARKS.md, issue 18, small messages
# and the cost per call), and at this size a call's fixed cost is a few percent of its time
# on every path.
FUSION_MAX_TENSOR_BYTES = 1 << 20
# Bytes per pipelined segment of the device ring: large enough that a copy costs far more than
# its launch, small enough that the copies of one segment hide behind the exchange of the next.
DEVICE_SEGMENT_BYTES = 1 << 20


def cuda_aware_setting(env: dict | None = None) -> bool | None:
    """FASTRING_CUDA_AWARE_MPI: True (1) or False (0) if set, None to ask MPI.

    Read when the first device allreduce runs, not at init, so it may be set late.

    Example:
        >>> cuda_aware_setting({"FASTRING_CUDA_AWARE_MPI": "1"})
        True
    """
    env = os.environ if env is None else env
    setting = env.get("FASTRING_CUDA_AWARE_MPI", "").strip().lower()
    if not setting:
        return None
    if setting not in ("0", "1", "true", "false", "yes", "no"):
        raise ValueError(f"FASTRING_CUDA_AWARE_MPI={setting!r} is not one of 1, 0")
    return setting in ("1", "true", "yes")


@dataclass(frozen=True)
class Config:
    fusion_threshold: int = 134217728
    cycle_time_ms: float = 1.0
    algorithm: str = "auto"
    timeline: str | None = None
    stall_check_time: float = 60.0
    stall_shutdown_time: float = 0.0
    log_level: str = "warning"
    shm: bool = True


# The settings the ranks must share, by Config field: they decide which messages the ranks
# exchange (the algorithm, how requests are cut into batches: every rank of the job; whether
# a host's segment is attached: every rank of that host, as a host whose segment cannot be
# mapped goes without one), so two values would pair messages of different algorithms or
# lengths and hang. `init` compares them before anything else.
AGREED_SETTINGS = {"algorithm": "FASTRING_ALGORITHM", "fusion_threshold": "FASTRING_FUSION_THRESHOLD"}
HOST_AGREED_SETTINGS = {"shm": "FASTRING_SHM"}


def _number(env: dict, key: str, default, cast):
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = cast(raw)
    except ValueError:
        raise ValueError(f"{key}={raw!r} is not a valid {cast.__name__}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{key}={raw!r} must be a finite number, not negative")
    return value


def _choice(env: dict, key: str, default: str, allowed: tuple) -> str:
    value = env.get(key, default).strip().lower() or default
    if value not in allowed:
        raise ValueError(f"{key}={value!r} is not one of {', '.join(allowed)}")
    return value


def from_environment(env: dict | None = None) -> Config:
    """Read the FASTRING_* variables (README.md, Configuration), validating each.

    Example:
        >>> from_environment({"FASTRING_ALGORITHM": "ring"}).algorithm
        'ring'
    """
    env = os.environ if env is None else env
    d = Config()
    return Config(
        fusion_threshold=_number(env, "FASTRING_FUSION_THRESHOLD", d.fusion_threshold, int),
        cycle_time_ms=_number(env, "FASTRING_CYCLE_TIME", d.cycle_time_ms, float),
        # the names are the algorithm registry's; `init` checks them (algorithms.check_setting)
        algorithm=env.get("FASTRING_ALGORITHM", d.algorithm).strip().lower() or d.algorithm,
        timeline=env.get("FASTRING_TIMELINE") or None,
        stall_check_time=_number(env, "FASTRING_STALL_CHECK_TIME", d.stall_check_time, float),
        stall_shutdown_time=_number(env, "FASTRING_STALL_SHUTDOWN_TIME", d.stall_shutdown_time, float),
        log_level=_choice(env, "FASTRING_LOG_LEVEL", d.log_level, LOG_LEVELS),
        shm=_choice(env, "FASTRING_SHM", "1", ("1", "0")) == "1",
    )


# ================================================================ bounded memory
# Result buffers (fastring._core.pool) below this size come from malloc's reused heap memory
# anyway; from it up a fresh buffer faults in a page per 4 KiB on first touch.
POOL_MIN_BYTES = 64 * 1024
# The pool rounds a request up to one of this many sizes (a power of two) per power of two,
# so results of nearby sizes (variable batch or sequence lengths, uneven allgather rows)
# share buffers; at most 1/8 of a buffer goes unused, and pages never touched cost no memory.
POOL_CLASSES_PER_OCTAVE = 8
# Buffers kept per size: results of one size that callers hold at once (same-shaped layers'
# gradients of one step). A request whose shape's last buffer is still held scans these for a
# free one, so a few, not dozens.
POOL_PER_SIZE = 8
# What the pool keeps, in all: one default fusion buffer's worth (Config.fusion_threshold,
# 128 MiB), so that after a warm-up the pool stops growing however the sizes vary (a soak of
# mixed sizes grew it past 230 MiB under a 1 GiB cap); a result larger than this is never
# pooled and costs its page faults, about one pass over the data. 256 entries bound the
# eviction scan. Without caps 2,000 distinct shapes of 64 KiB and more took a rank from
# 112 MB to 2.7 GB.
POOL_MAX_BYTES = 128 << 20
POOL_MAX_ENTRIES = 256
# Pooled buffers start on this boundary: XLA's CPU client imports (DLPack, device_put) host
# memory without a copy only when it is 64-byte aligned, and numpy's allocator gives 16.
POOL_ALIGN_BYTES = 64
# An Arena (the shared results area) hands out whole pages, so blocks share no page.
ARENA_BLOCK_BYTES = 4096
# On two ranks of one host, a reducescatter's result that the ring fills starts at the same
# offset modulo this many bytes as its part of the input (`Pool.empty`'s `phase`) where the
# input is not on such a boundary (numpy's large arrays start 16 bytes past one; the
# frameworks' inputs, and so the results JAX and TensorFlow take without a copy, on one): the
# peer's part, received straight into it, lies so too where the ranks allocate alike.
# `rep movsb`, on which the kernel's copies between processes run (and glibc's memcpy from 8
# KiB to about 1 MiB), is slower on this machine's CPU (AMD EPYC) between buffers at different
# offsets modulo 32: 16 MiB in 720-850 µs at the same offset, 919-983 with the destination 16
# bytes behind the source, 1560-1837 16 bytes ahead (the case `fr_copy` avoids); 64, a cache
# line, covers that. np=2, the reducescatter of 32 MiB ran 1.65 / 1.80 times MPI's speed
# against 1.53 / 1.61 (min / median over six launches each, alternating; BENCHMARKS.md,
# "Round 2, session 17").
COPY_PHASE_BYTES = 64
# Error-feedback residuals (fastring._core.residuals), one per tensor name, on the host and
# on the device. A residual dropped costs that tensor one step's rounding correction, so the
# caps sit well above a real model's gradients - 4 GiB is every float32 gradient of a
# 1B-parameter model, 8,192 names more parameter tensors than any common model has - and
# stop only names that come and go (per-step or per-batch names) from piling up forever.
RESIDUAL_MAX_BYTES = 4 << 30
RESIDUAL_MAX_ENTRIES = 8192


# ================================================================ waiting for a partner
# Every wait of the transport (fastring/_transport/mpi.pyx, `wait`) first spins on MPI_Test
# for WAIT_CYCLE_SPIN_SECONDS (negotiation) or WAIT_DATA_SPIN_SECONDS (the data phase), or as
# long as its bytes take at WAIT_SPIN_BYTES_PER_SECOND if that is longer: a partner already in
# the collective answers within microseconds, and MPICH's shared-memory copies move only while
# a rank polls. With a 1 ms spin everywhere the 64 MiB allreduce took twice as long at np=2
# (steps of the ring that a busy machine delays past 1 ms slept mid-copy, and woke late);
# 1 GB/s is a quarter of the slowest copy rate measured at np=2. The cycle spins briefly, so
# that a rank whose peer is a training step behind leaves its core to the training thread.
# Then it sleeps between tests, the
# pause growing by WAIT_PAUSE_STEP_SECONDS up to WAIT_SHORT_PAUSE_SECONDS (what the negotiation
# cycle always did), and, once the wait has lasted WAIT_LONG_SECONDS (a joined or early rank
# waiting for a busy peer), doubling up to WAIT_LONG_PAUSE_SECONDS, so that a long wait leaves
# its core to the training threads (BENCHMARKS.md, "Waiting").
WAIT_CYCLE_SPIN_SECONDS = 1e-3
WAIT_DATA_SPIN_SECONDS = 20e-3
WAIT_SPIN_BYTES_PER_SECOND = 1e9
WAIT_PAUSE_STEP_SECONDS = 20e-6
WAIT_SHORT_PAUSE_SECONDS = 500e-6
WAIT_LONG_SECONDS = 1.0
WAIT_LONG_PAUSE_SECONDS = 5e-3
# A rank that gave up on another (a stall) gives the others this long past
# FASTRING_STALL_SHUTDOWN_TIME to reach MPI_Finalize at exit (a late rank notices the abandon
# within a quarter of that time), then exits without it, which ends the job: MPI_Finalize
# waits for every rank, forever when one is stopped or hung (README.md, "Failure behaviour").
FINALIZE_WAIT_SECONDS = 5.0
