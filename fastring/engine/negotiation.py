"""Negotiation: how the ranks agree, cycle by cycle, on what runs next.

A cycle is one small allreduce (`Transport.cycle_exchange`) of a block
  [flags | speculative request hash, payload bytes | ready bits (AND) | pending bits (OR) | payload]
where bit i stands for entry i of the response cache, a table of (name, fields) pairs that
every rank fills identically from agreed outcomes. So in steady state a cycle costs one tiny
message exchange. Requests the cache does not know, or a stall report, make every rank gather
the full metadata of its pending requests (the engine's full negotiation), which also
explains every mismatch by field and rank (`describe_mismatch`).

Besides, each rank may propose one request as the speculative one (its hash in the header),
with the request's bytes as the payload when it is a small host allreduce: when every rank
proposed the same request and nothing else waits anywhere (`is_clean`), the cycle itself has
reduced it, so a lone synchronous small allreduce costs one exchange and no cycle timer.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from mpi4py import MPI

from .. import kernels
from .._core.errors import FastringError
from .._core.config import SMALL_MESSAGE_BYTES
from .._core.ops import KERNEL_OP, ReduceOp
from .._transport import CYCLE_HEADER_WORDS as HEADER_WORDS
from .._transport import SPECULATION_FAILED, Tag, array_address, copy_to_array, mark_bits

HAS_UNCACHED = 1  # some rank has a request the cache does not know (or knows differently)
WANT_REPORT = 2   # some rank has waited past FASTRING_STALL_CHECK_TIME: gather everything
LEAVING = 4       # some rank is shutting down: nothing pending anywhere can complete
LEFT_RANK_SHIFT = 8  # bit LEFT_RANK_SHIFT + r: rank r is shutting down (ranks below 56)
CACHE_CAPACITY = 1 << 14
FIELD_DIGESTS_KEPT = 1024  # digests of recent fields tuples, a shortcut for repeated signatures
AUTOMATIC_DOMAIN = b"automatic name"  # the digests of automatic names' prefixes (signature_hash)
# Byte offset of the speculative payload in a cycle block with w bit-vector words.
PAYLOAD_OFFSET = [8 * (HEADER_WORDS + 2 * w) for w in range(CACHE_CAPACITY // 64 + 1)]
NO_PAYLOAD = (0, 1)  # (reduction cfunc, item size) of a cycle that carries no payload
ABANDON_TAG = int(Tag.ABANDON_NOTICE)


def _kept(shortcuts: dict, key, value) -> dict:
    """`shortcuts` with key -> value added, or a fresh dict of that alone when it holds
    FIELD_DIGESTS_KEPT already: fields hold every tensor's shape, and varying shapes must not
    pile up."""
    if len(shortcuts) >= FIELD_DIGESTS_KEPT:
        shortcuts = {}
    shortcuts[key] = value
    return shortcuts


def describe_mismatch(name: str, by_rank: dict[int, tuple]) -> str:
    """The error every rank raises when the ranks' fields for `name` differ: each field that
    differs, with the ranks that hold each value.

    Example:
        >>> describe_mismatch("w", {0: (("shape", (4,)),), 1: (("shape", (5,)),)})
        "mismatch for tensor 'w': shape differs: rank 0: (4,); rank 1: (5,)"
    """
    ranks = sorted(by_rank)
    parts = []
    for i, (fname, _) in enumerate(by_rank[ranks[0]]):
        groups: dict[Any, list[int]] = {}
        for r in ranks:
            groups.setdefault(by_rank[r][i][1], []).append(r)
        if len(groups) > 1:
            parts.append(f"{fname} differs: " + "; ".join(
                f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {value}"
                for value, rs in groups.items()))
        if fname == "collective" and len(groups) > 1:
            break  # other fields mean different things for different collectives
    return f"mismatch for tensor '{name}': " + "; ".join(parts)


def leaving_flags(rank: int) -> int:
    """The flags of a rank's last cycle, which tells the others that it is shutting down."""
    return LEAVING | (1 << (LEFT_RANK_SHIFT + rank) if rank < 64 - LEFT_RANK_SHIFT else 0)


def ranks_leaving(flags: int) -> list[int]:
    """The ranks whose leaving is recorded in a cycle's combined flags.

    Example:
        >>> ranks_leaving(leaving_flags(1) | leaving_flags(3))
        [1, 3]
    """
    return [b - LEFT_RANK_SHIFT for b in range(LEFT_RANK_SHIFT, 64) if flags >> b & 1]


def is_clean(outcome: tuple, h: int) -> bool:
    """Every rank proposed request hash `h` alone and nothing else waits anywhere."""
    return outcome[1] == h and not (outcome[0] or outcome[2] or outcome[3])


def set_bits(words: np.ndarray) -> list[int]:
    """The indices of the bits set in a bit vector of uint64 words, in increasing order.

    Example:
        >>> set_bits(np.array([0b101, 1 << 63], np.uint64))
        [0, 2, 127]
    """
    found = []
    for i, w in enumerate(words.tolist()):
        base = i * 64 - 1
        while w:
            low = w & -w
            found.append(base + low.bit_length())
            w ^= low
    return found


class Negotiation:
    """The cycle block, the response cache and the request hashes of one engine.

    Every rank calls `remember` with the same agreed outcomes in the same order, so the cache
    (and with it the number of bit-vector words) grows identically everywhere.
    """

    def __init__(self, transport, stall_reporter, cycles=None):
        """`cycles`: what runs the cycles, with `Transport`'s `cycle_exchange` and `lone_cycle`
        (default: the transport, over MPI; on one host the shared segment)."""
        self._transport = transport
        cycles = cycles or transport
        self._cycle_exchange = cycles.cycle_exchange
        self._lone_cycle = cycles.lone_cycle
        self.stall_reporter = stall_reporter
        # Only a rank with a stall deadline abandons cycles, so only then can a notice come.
        self._watch_abandon = stall_reporter.shutdown_after > 0 and transport.size > 1
        self._notices: list = []
        self.cache: dict[str, tuple[int, tuple]] = {}   # name -> (bit, fields)
        self._cache_names: list[str] = []
        self._field_digests: dict[tuple, bytes] = {}
        self._automatic_digests: dict[str, tuple] = {}  # name's prefix -> (last fields, digest)
        self._hashes: dict[str, tuple[tuple, int]] = {}  # name -> (fields, hash)
        self._reducers: dict[tuple, tuple[int, int]] = {}
        # (id of the bits, the words) the last set_cached set: equal AND words after the exchange
        # mean every rank had all of them ready, and ready_requests then decodes no bit. The id,
        # not the object: the engine's dict of requests must not outlive its cycle here.
        self._marked: tuple = (None, [])
        self._bits_dirty = True  # bit words in the cycle block may be nonzero
        self._clean_words = 0    # ...unless this many words were left zero by a clean cycle
        self.block = np.empty(0, np.uint64)
        self._block_tmp = np.empty(0, np.uint64)
        self.block_address = self._block_tmp_address = 0
        self.header: memoryview | None = None
        self.words = 0  # bit-vector words per cycle: the block grows with the cache (_size_block)
        self._size_block()

    def signature_hash(self, name: str, fields: tuple) -> int:
        """A 64-bit digest of (name, fields), equal on every rank for equal requests; never 0
        (no speculation) nor SPECULATION_FAILED."""
        known = self._hashes.get(name)
        if known is not None and known[0] == fields:
            return known[1]
        prefix, _, number = name.rpartition(".noname.")
        if prefix and number.isascii() and number.isdigit() and (number == "0" or number[0] != "0"):
            # An automatic name (Engine.auto_name) is never seen twice: its hash is the digest
            # of its prefix and fields, computed once, XOR its number (one number in its
            # shortest form per name, distinct numbers, distinct hashes), which spares a digest
            # per call (a microsecond of every unnamed call and barrier). Its own digest
            # domain keeps it apart from a name that spells its prefix (or prefix.noname.).
            known = self._automatic_digests.get(prefix)
            if known is not None and (known[0] is fields or known[0] == fields):
                base = known[1]
            else:
                base = self._digest(prefix, fields, AUTOMATIC_DOMAIN)
                self._automatic_digests = _kept(self._automatic_digests, prefix, (fields, base))
            return (base ^ int(number)) % (SPECULATION_FAILED - 1) + 1
        h = self._digest(name, fields) % (SPECULATION_FAILED - 1) + 1
        if len(self._hashes) < CACHE_CAPACITY:
            self._hashes[name] = (fields, h)
        return h

    def _digest(self, name: str, fields: tuple, domain: bytes = b"") -> int:
        """A 64-bit digest of (name, fields) in `domain` (blake2b's personalisation), keyed by
        a digest of the fields kept per fields."""
        fields_digest = self._field_digests.get(fields)
        if fields_digest is None:
            fields_digest = hashlib.blake2b(repr(fields).encode(), digest_size=16).digest()
            self._field_digests = _kept(self._field_digests, fields, fields_digest)
        digest = hashlib.blake2b(name.encode(), digest_size=8, key=fields_digest, person=domain).digest()
        return int.from_bytes(digest, "little")

    def _size_block(self) -> None:
        """Set `words` from the cache's size, and grow the block to hold them and a payload
        (kept as an attribute: cycles read it on every call, the cache changes rarely). A
        grown block keeps the old one's contents: the cycle that grew the cache may still
        read its payload, at the offset of the words it ran with."""
        self.words = words = (len(self._cache_names) + 63) // 64
        total = HEADER_WORDS + 2 * words + SMALL_MESSAGE_BYTES // 8
        if self.block.size < total:
            old = self.block
            self.block = np.zeros(total + 64, np.uint64)
            self.block[:old.size] = old
            self._block_tmp = np.zeros(total + 64, np.uint64)
            self.block_address = array_address(self.block)
            self._block_tmp_address = array_address(self._block_tmp)
            # item writes through a memoryview cost a tenth of numpy scalar assignment
            self.header = memoryview(self.block).cast("B").cast("Q")

    def payload(self, words: int, nbytes: int, dtype) -> np.ndarray:
        """The payload area of the block as `nbytes` bytes of `dtype`."""
        start = HEADER_WORDS + 2 * words
        return self.block[start:].view(np.uint8)[:nbytes].view(dtype)

    def payload_address(self, words: int) -> int:
        return self.block_address + PAYLOAD_OFFSET[words]

    def reducer(self, op: ReduceOp, dtype: np.dtype) -> tuple[int, int]:
        """(reduction cfunc, item size) that combines payloads of `dtype` under `op`."""
        found = self._reducers.get((op, dtype))
        if found is None:
            found = self._reducers[op, dtype] = (kernels.reduce_cfunc(KERNEL_OP[op], dtype), dtype.itemsize)
        return found

    def clear_bits(self, words: int) -> None:
        """Zero the bit words before a cycle that sets some."""
        if words:
            self.block[HEADER_WORDS:HEADER_WORDS + 2 * words] = 0

    def set_cached(self, bits, words: int) -> None:
        """Mark cache entries `bits` as ready (AND words) and pending (OR words) on this rank."""
        self._marked = (id(bits), mark_bits(self.block, words, bits))

    def ready_requests(self, cached: dict, words: int) -> list:
        """The requests of `cached` (cache entry -> request) that every rank had ready in the
        last cycle, in the order of their entries. Where `cached` is the dict the last
        `set_cached` marked (the same object, which the caller still holds) and every rank had
        all of it ready (the common case), no bit is decoded."""
        if not cached:
            return []
        ready = self.block[HEADER_WORDS:HEADER_WORDS + words]
        marked_id, marked_words = self._marked
        if marked_id == id(cached) and ready.tolist() == marked_words:
            return [cached[bit] for bit in sorted(cached)]
        return [cached[bit] for bit in set_bits(ready) if bit in cached]

    def exchange(self, flags: int, h: int, payload_nbytes: int, reducer: tuple[int, int],
                 names, words: int, bits_written: bool) -> tuple:
        """Run one cycle: this rank's header (flags, proposed hash `h`, payload size; its payload
        and, if `bits_written`, its cache bits already in the block). Returns the combined
        (flags, speculative hash, any left over, any ready), the same on every rank."""
        if not bits_written:
            self._clear_stale_bits(words)
        header = self.header
        header[0] = flags
        header[1] = h
        header[2] = payload_nbytes
        self.stall_reporter.names = names
        outcome = self._cycle_exchange(
            self.block_address, words, SMALL_MESSAGE_BYTES, self._block_tmp_address, reducer[0], reducer[1],
            self.stall_reporter.interval, self.stall_reporter)
        if self._watch_abandon:
            self.check_abandoned()
        if bits_written:
            self._bits_dirty = True
        else:
            self._note_bits(outcome, words)
        return outcome

    def _clear_stale_bits(self, words: int) -> None:
        """Zero the bit words before a cycle that sets none, unless the last such cycle left
        them zero: they may hold last cycle's bits, or payload bytes if the cache just grew."""
        if words and (self._bits_dirty or words != self._clean_words):
            self.block[HEADER_WORDS:HEADER_WORDS + 2 * words] = 0

    def _note_bits(self, outcome: tuple, words: int) -> None:
        """After a cycle that set no bits: a clean outcome leaves every bit word zero (nothing
        ready, nothing left over)."""
        self._bits_dirty = bool(outcome[2] or outcome[3])
        self._clean_words = words

    def lone_exchange(self, h: int, src: np.ndarray, dst: np.ndarray, reducer: tuple[int, int],
                      name: str) -> tuple[tuple, bool]:
        """`exchange` of a cycle in which this rank proposes request `h` (named `name`) alone,
        with `src`'s bytes (C-contiguous, at most SMALL_MESSAGE_BYTES) as its payload, in one
        transport call: the result lands in `dst` (writeable, C-contiguous, as many bytes) only
        when the outcome is clean. Returns (the outcome, whether it was clean)."""
        words = self.words
        self._clear_stale_bits(words)
        reporter = self.stall_reporter
        reporter.names = (name,)
        # With an abandon to watch for, the result waits in the block until the check is done:
        # a cycle completed with an abandoned rank's leftovers must not touch the caller's array.
        outcome, clean = self._lone_cycle(self.block_address, words, SMALL_MESSAGE_BYTES, self._block_tmp_address,
                                          reducer[0], reducer[1], reporter.interval, reporter, h, src,
                                          None if self._watch_abandon else dst)
        self._note_bits(outcome, words)
        if self._watch_abandon:
            self.check_abandoned()
            if clean:
                copy_to_array(dst, self.payload_address(words))
        return outcome, clean

    def abandon(self) -> None:
        """Tell every other rank that this one abandoned its cycles: what it left posted (a
        block another rank could still receive) must not complete anyone's cycle."""
        comm, me = self._transport.comm, self._transport.rank
        note = np.array([me], np.int64)
        for r in range(self._transport.size):
            if r != me:
                self._notices.append((note, comm.Isend(note, r, ABANDON_TAG)))

    def check_abandoned(self) -> None:
        """FastringError if another rank has abandoned its cycles: the cycle that just ended
        may have used a block that rank left behind."""
        comm = self._transport.comm
        status = MPI.Status()
        # MPICH's first probe may only pull a queued message in, the second then matches it.
        if comm.Iprobe(MPI.ANY_SOURCE, ABANDON_TAG, status) or comm.Iprobe(MPI.ANY_SOURCE, ABANDON_TAG, status):
            source = status.Get_source()
            comm.Recv(np.empty(1, np.int64), source, ABANDON_TAG)
            raise FastringError(f"rank {source} abandoned its collectives (a stall past "
                                f"FASTRING_STALL_SHUTDOWN_TIME={self.stall_reporter.shutdown_after:g}, or an "
                                "error or interrupt part-way through one); nothing more can run with it")

    def remember(self, name: str, fields: tuple) -> None:
        """Cache an agreed (name, fields); called in the same order on every rank. An entry
        takes the very object given even where it holds equal fields: a cycle then recognises
        the request by identity (`Engine._write_bits`), where comparing the tuples cost most
        of that method's time per request."""
        entry = self.cache.get(name)
        if entry is not None:
            if entry[1] is not fields:
                self.cache[name] = (entry[0], fields)
        elif len(self._cache_names) < CACHE_CAPACITY and ".noname." not in name:
            self.cache[name] = (len(self._cache_names), fields)
            self._cache_names.append(name)
            if len(self._cache_names) % 64 == 1:
                self._size_block()
