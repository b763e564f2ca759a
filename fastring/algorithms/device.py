"""The device ring: a fused batch of device allreduces reduced on the GPU.

* ``reduce_batch`` (called by the engine for a fused batch) waits for the producers' events,
  packs the batch into a device fusion buffer (``kernels.cuda.pack``, or the 16-bit-to-float
  conversion under compression) with the prescale / Average pre-division, and runs a ring:
  reduce-scatter whose reductions are ``kernels.cuda`` kernels on a CUDA stream, then
  allgather. When MPI is not CUDA-aware, every segment is staged through pinned host
  buffers: the device-to-host copy of the next segment (second stream) and the upload and
  reduction of the previous one overlap the exchange of the current one. A CUDA-aware MPI
  (``MPIX_Query_cuda_support`` or ``FASTRING_CUDA_AWARE_MPI=1``) is given device pointers.
* Results are bitwise identical on every rank (each chunk is finalized once by its owner
  and circulated), and -- same ring, same operands -- bitwise equal to the host ring's.

How device tensors are viewed and where their buffers live: `fastring._core.device`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import kernels
from .._core.config import DEVICE_SEGMENT_BYTES
from .._core.device import (U16, U8, DeviceState, cuda_aware_mpi, current_device, device_address,
                            new_event, numba_cuda, state_of, to_device)
from .._core.dtypes import BFLOAT16, DtypeSpec
from .._core.ops import KERNEL_OP, ReduceOp
from .._core.work import AllreduceWork, Entry, predivides, prescale as prescale_host, split_for_average, unpack
from .._transport import Tag, array_address
from .base import Message, Phase, chunk_offsets

_RS_TAG, _AG_TAG = Tag.DEVICE_REDUCE_SCATTER, Tag.DEVICE_ALLGATHER

# ================================================================ reduction

@dataclass
class _Layout:
    """How a batch sits in the device buffer the ring reduces."""
    work: AllreduceWork
    acc: np.dtype            # accumulator dtype (float32/float64 under compression, int64
                             # for an integer Average)
    storage: np.dtype        # dtype of the buffer the kernels index (bfloat16 as uint16)
    kdtype: Any              # the kernels' dtype= override (bfloat16) or None
    wire: str | None         # 16-bit wire format of the ring, or None
    counts: list[int] = field(default_factory=list)  # elements per request


def _layout(requests: list) -> _Layout:
    work = requests[0].allreduce
    wire = work.compression.wire
    bf16 = wire is None and work.spec.dtype == BFLOAT16
    acc = work.accumulator
    per_element = 2 if work.splits_average else 1  # quotient and remainder
    return _Layout(work, acc, U16 if bf16 else acc, BFLOAT16 if bf16 else None, wire,
                   [per_element * sum(e.src.size for e in r.entries) for r in requests])


def _own_format(spec: DtypeSpec) -> str | None:
    """The 16-bit format a float16/bfloat16 tensor is stored in (None for other dtypes)."""
    return {"float16": "fp16", "bfloat16": "bf16"}.get(spec.name)


def _as_device(entry: Entry, stream: Any) -> Entry:
    """A host Entry (a joined rank's zeros) as device arrays; device entries as they are."""
    if not isinstance(entry.src, np.ndarray):
        return entry
    src = to_device(entry.src.reshape(-1), stream)
    if src.dtype == BFLOAT16:
        src = src.view(U16)
    return Entry(src, src, src, entry.result)


class _Batch:
    """One fused batch on the device: pack, ring, unpack."""

    def __init__(self, rt: Any, state: DeviceState, names: list[str], requests: list, phase: Phase):
        self.rt, self.state, self.names, self.requests, self.phase = rt, state, names, requests, phase
        self.lay = _layout(requests)
        self.kc = _kernels()
        self.up, self.down = state.streams
        self.entries = [[_as_device(e, self.up) for e in r.entries] for r in requests]

    # ------------------------------------------------------------ pack / unpack
    def buffer(self) -> tuple[Any, bool]:
        """(the 1-D buffer to reduce in, whether it is the lone output itself)."""
        lay = self.lay
        if (len(self.requests) == 1 and len(self.entries[0]) == 1 and lay.acc == self.lay.work.spec.dtype
                and not lay.work.splits_average):
            e = self.entries[0][0]
            if e.src is not e.work and e.src.size:
                e.work.copy_to_device(e.src, stream=self.up)
            return e.work, True
        fusion = self.state.buffer("fusion", sum(lay.counts) * lay.acc.itemsize).view(lay.storage)
        self.move(fusion, pack=True)
        return fusion, False

    def move(self, flat: Any, pack: bool) -> None:
        """Copy every tensor into its place in `flat` (`pack`) or its result back out; under
        compression 16-bit tensors are widened to float32 on the way in, narrowed on the way
        out. Plain copies go up to 8 buffers per kernel launch."""
        lay, kc = self.lay, self.kc
        if lay.work.splits_average:
            self.move_split(flat, pack)
            return
        fmt = _own_format(lay.work.spec) if lay.wire is not None else None
        parts, offsets = [], []
        offset = 0
        for entries in self.entries:
            for e in entries:
                arr = e.src if pack else e.work
                n = arr.size
                if n and fmt is not None:
                    if pack:
                        kc.decode16(arr, flat[offset:offset + n], fmt, stream=self.up)
                    else:
                        kc.encode16(flat[offset:offset + n], arr, fmt, stream=self.up)
                elif n:
                    parts.append(arr.view(U8))
                    offsets.append(offset * lay.acc.itemsize)
                offset += n
        if parts:
            (kc.pack if pack else kc.unpack)(flat.view(U8), parts, offsets, stream=self.up)

    def move_split(self, flat: Any, pack: bool) -> None:
        """`move` for an integer Average, through host memory: each tensor is prescaled and
        split into int64 quotients and remainders on the way in, and the summed parts joined
        into the exact mean (truncated toward zero) and postscaled on the way out, by the
        host's own functions (fastring._core.work), so that no sum can wrap and the result
        is the host path's. Integer averages are rare enough that the round trip is cheap
        next to being right."""
        if not flat.size:
            return
        size, offset = self.rt.size, 0
        host = np.empty(flat.size, np.int64)
        if not pack:
            flat.copy_to_host(host, stream=self.up)
            self.up.synchronize()
        work = self.lay.work
        for entries in self.entries:
            n = sum(e.src.size for e in entries)
            parts = host[offset:offset + 2 * n]
            offset += 2 * n
            if pack:
                values = np.concatenate([e.src.copy_to_host().reshape(-1) for e in entries]).astype(np.int64)
                prescale_host(work, values, size)
                split_for_average(values, size, parts)
                continue
            mean, at = unpack(work, parts, size), 0
            for e in entries:
                e.work.copy_to_device(np.ascontiguousarray(mean[at:at + e.work.size], e.work.dtype))
                at += e.work.size
        if pack:
            flat.copy_to_device(host, stream=self.up)
            self.up.synchronize()

    # ------------------------------------------------------------ scaling
    def prescale(self, flat: Any) -> None:
        work, kc = self.lay.work, self.kc
        if work.splits_average:
            return  # prescaled on the host (move_split)
        if work.prescale != 1.0:
            kc.scale_into(flat, work.prescale, dtype=self.lay.kdtype, stream=self.up)
        if predivides(work, self.rt.size):
            kc.divide_into(flat, self.rt.size, dtype=self.lay.kdtype, stream=self.up)

    def finalize(self, view: Any) -> None:
        """Average's division and the postscale, on fully reduced data (fastring._core.work.finalizer)."""
        work, size, kc = self.lay.work, self.rt.size, self.kc
        if not view.size or work.splits_average:
            return  # an integer Average finishes on the host (move_split)
        if work.op == ReduceOp.Average and size > 1 and not predivides(work, size):
            kc.divide_into(view, size, dtype=self.lay.kdtype, stream=self.up)
        if work.postscale != 1.0:
            kc.scale_into(view, work.postscale, dtype=self.lay.kdtype, stream=self.up)

    def feed_back_error(self, flat: Any) -> None:
        """Error feedback on the device, per tensor name (as the host path does)."""
        lay, kc, up = self.lay, self.kc, self.up
        if not lay.work.compression.error_feedback:
            return
        bits = self.state.buffer("bits", flat.size * 2).view(U16)
        offset = 0
        for name, n in zip(self.names, lay.counts):
            mine = flat[offset:offset + n]
            offset += n
            if not n:
                continue
            residual = self.state.residuals.get(name, (n,), lay.acc)
            if residual is not None:
                kc.reduce_into(mine, residual, KERNEL_OP[ReduceOp.Sum], stream=up)
            else:
                residual = numba_cuda().device_array(n, lay.acc)
                self.state.residuals.put(name, residual)
            kc.encode16(mine, bits[:n], lay.wire, stream=up)
            kc.decode16(bits[:n], residual, lay.wire, stream=up)      # what is sent
            kc.scale_into(residual, -1.0, stream=up)                   # exact negation
            kc.reduce_into(residual, mine, KERNEL_OP[ReduceOp.Sum], stream=up)  # input - sent
            kc.decode16(bits[:n], mine, lay.wire, stream=up)

    # ------------------------------------------------------------ run
    def run(self) -> list:
        """Reduce the batch; return each work's result (a list for a grouped one)."""
        with self.phase("pack"):
            for r in self.requests:
                for e in r.entries:
                    ready = getattr(e, "ready", None)
                    if ready is not None:
                        ready.synchronize()
            flat, lone = self.buffer()
            self.prescale(flat)
            self.feed_back_error(flat)
        _Ring(self, flat).run()
        with self.phase("unpack"):
            if not lone:
                self.move(flat, pack=False)
            self.up.synchronize()
        results = []
        for r, entries in zip(self.requests, self.entries):
            mine = [e.result for e in entries]
            results.append(mine if r.grouped else mine[0])
        return results


class _Ring:
    """The ring on the device buffer `flat` (see the module docstring).

    Uncompressed, the ring sends and reduces `flat` itself. Compressed, `flat` accumulates
    in float32/float64 and a uint16 `wire` copy of it travels: each received segment is
    decoded, accumulated and re-encoded by one fused kernel (accumulate16), as the host's
    CompressedRing does; the allgather circulates the encoded result and every rank decodes
    the same bits.
    """

    def __init__(self, b: _Batch, flat: Any):
        self.b, self.flat, self.kc, self.up, self.down = b, flat, b.kc, b.up, b.down
        self.rank, self.size = b.rt.rank, b.rt.size
        self.transport = b.rt.transport
        self.count = flat.size
        self.offsets = chunk_offsets(self.count, self.size, 1)  # elements
        lay = b.lay
        self.op = KERNEL_OP[lay.work.reduce_op]
        if lay.wire is None:
            self.send = flat
        else:
            self.send = b.state.buffer("wire", 2 * self.count).view(U16)
        self.isz = self.send.dtype.itemsize
        self.seg = max(1, DEVICE_SEGMENT_BYTES // self.isz)
        if b.state.aware is None:
            b.state.aware = cuda_aware_mpi()
        self.staged = not b.state.aware

    def chunk(self, c: int) -> tuple[int, int]:
        return int(self.offsets[c]), int(self.offsets[c + 1])

    def apply(self, lo: int, hi: int, received: Any, last: bool) -> None:
        """Reduce the received segment `received` into elements lo:hi of the buffer."""
        b = self.b
        if b.lay.wire is None:
            self.kc.reduce_into(self.flat[lo:hi], received, self.op, dtype=b.lay.kdtype, stream=self.up)
        else:
            self.kc.accumulate16(self.flat[lo:hi], received, None if last else self.send[lo:hi],
                                 b.lay.wire, self.op, stream=self.up)

    def run(self) -> None:
        b = self.b
        own_lo, own_hi = self.chunk(self.rank)
        with b.phase("reduce-scatter"):
            if self.size > 1 and self.count:
                if b.lay.wire is not None:
                    first = self.chunk((self.rank - 1) % self.size)
                    self._encode(*first)
                self._reduce_scatter()
            b.finalize(self.flat[own_lo:own_hi])
            if b.lay.wire is not None:
                self._encode(own_lo, own_hi)
        with b.phase("allgather"):
            if self.size > 1 and self.count:
                self._allgather()
            if b.lay.wire is not None and self.count:
                self.kc.decode16(self.send, self.flat, b.lay.wire, stream=self.up)

    def _encode(self, lo: int, hi: int) -> None:
        if hi > lo:
            self.kc.encode16(self.flat[lo:hi], self.send[lo:hi], self.b.lay.wire, stream=self.up)

    def _steps(self) -> list[tuple[int, int, int, int, bool]]:
        """(send lo, hi, receive lo, hi, last step) per segment exchange, in ring order. Every
        rank walks the same number of segments (some possibly empty) so that each exchange
        has its partner; exchange j + segments sends what exchange j reduced."""
        size, rank, seg = self.size, self.rank, self.seg
        largest = max(self.chunk(c)[1] - self.chunk(c)[0] for c in range(size))
        self.segments = max(1, -(-largest // seg))
        steps = []
        for step in range(size - 1):
            s0, s1 = self.chunk((rank - step - 1) % size)
            r0, r1 = self.chunk((rank - step - 2) % size)
            for k in range(self.segments):
                s_lo, r_lo = s0 + k * seg, r0 + k * seg
                steps.append((s_lo, max(min(s_lo + seg, s1), s_lo), r_lo, max(min(r_lo + seg, r1), r_lo),
                              step == size - 2))
        return steps

    def _reduce_scatter(self) -> None:
        steps = self._steps()
        total, segs, isz = len(steps), self.segments, self.isz
        right, left = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        nbytes = self.seg * isz
        state = self.b.state
        dev_tmp = [state.buffer(f"recv{k}", nbytes) for k in range(2)]
        applied = [new_event() for _ in range(total)]
        packed = new_event()
        packed.record(self.up)
        if not self.staged:
            self.up.synchronize()
            base = device_address(self.send)
            for i, (s_lo, s_hi, r_lo, r_hi, last) in enumerate(steps):
                for j in (i - segs, i - 2):  # what this exchange sends is reduced; its slot is free
                    if j >= 0:
                        applied[j].synchronize()
                slot = dev_tmp[i % 2]
                self.transport.sendrecv(base + s_lo * isz, (s_hi - s_lo) * isz, right,
                                        device_address(slot), (r_hi - r_lo) * isz, left, _RS_TAG)
                if r_hi > r_lo:
                    self.apply(r_lo, r_hi, slot[:(r_hi - r_lo) * isz].view(self.send.dtype), last)
                applied[i].record(self.up)
            return
        # Staged: send_host/recv_host are pinned; `down` copies segments out ahead of the
        # exchange, `up` uploads and reduces behind it.
        send_host = [state.buffer(f"send_host{k}", nbytes, pinned=True) for k in range(2)]
        recv_host = [state.buffer(f"recv_host{k}", nbytes, pinned=True) for k in range(2)]
        copied = [new_event() for _ in range(total)]
        uploaded = [new_event() for _ in range(total)]
        send_u8 = self.send.view(U8)
        issued = 0  # exchanges whose outgoing segment has been queued for download

        def download(upto_applied: int, upto_sent: int) -> None:
            nonlocal issued
            while issued < total and issued - 2 <= upto_sent and issued - segs <= upto_applied:
                s_lo, s_hi = steps[issued][:2]
                (applied[issued - segs] if issued >= segs else packed).wait(self.down)
                if s_hi > s_lo:
                    send_u8[s_lo * isz:s_hi * isz].copy_to_host(
                        send_host[issued % 2][:(s_hi - s_lo) * isz], stream=self.down)
                copied[issued].record(self.down)
                issued += 1

        download(-1, -1)
        for i, (s_lo, s_hi, r_lo, r_hi, last) in enumerate(steps):
            copied[i].synchronize()
            if i >= 2:
                uploaded[i - 2].synchronize()  # recv_host[i % 2] has been uploaded
            sn, rn = (s_hi - s_lo) * isz, (r_hi - r_lo) * isz
            self.transport.sendrecv(array_address(send_host[i % 2]), sn, right,
                                    array_address(recv_host[i % 2]), rn, left, _RS_TAG)
            slot = dev_tmp[i % 2]
            if rn:
                slot[:rn].copy_to_device(recv_host[i % 2][:rn], stream=self.up)
            uploaded[i].record(self.up)
            if rn:
                self.apply(r_lo, r_hi, slot[:rn].view(self.send.dtype), last)
            applied[i].record(self.up)
            download(i, i)

    def _allgather(self) -> None:
        """Circulate chunk c, complete on rank c, so that every rank holds every chunk."""
        isz, size, rank = self.isz, self.size, self.rank
        byte_offsets = self.offsets * isz
        right, left = (rank + 1) % size, (rank - 1) % size
        self.up.synchronize()
        if not self.staged:
            self.transport.ring_allgather(device_address(self.send), byte_offsets, _AG_TAG)
            return
        # Staged: the ring runs on a pinned host mirror; each received chunk is uploaded
        # while the next one is exchanged.
        mirror = self.b.state.buffer("mirror", int(byte_offsets[-1]), pinned=True)
        send_u8 = self.send.view(U8)
        lo, hi = int(byte_offsets[rank]), int(byte_offsets[rank + 1])
        if hi > lo:
            send_u8[lo:hi].copy_to_host(mirror[lo:hi], stream=self.up)
            self.up.synchronize()
        base = array_address(mirror)
        for step in range(size - 1):
            s0, s1 = (int(x) for x in byte_offsets[(rank - step) % size:(rank - step) % size + 2])
            r0, r1 = (int(x) for x in byte_offsets[(rank - step - 1) % size:(rank - step - 1) % size + 2])
            self.transport.sendrecv(base + s0, s1 - s0, right, base + r0, r1 - r0, left, _AG_TAG)
            if r1 > r0:
                send_u8[r0:r1].copy_to_device(mirror[r0:r1], stream=self.up)


def _kernels():
    return kernels.cuda_kernels()


def reduce_batch(rt: Any, names: list[str], requests: list, phase: Phase) -> list:
    """Reduce a batch of device allreduce requests of one key (the same batch, in the same
    order, on every rank); return each one's result (a list for a grouped one).

    Called by the engine; users call fastring.allreduce on a device tensor.

    Example:
        >>> from numba import cuda; import numpy as np, fastring                  # doctest: +SKIP
        >>> fastring.allreduce(cuda.to_device(np.ones(2)), op=fastring.Sum)       # doctest: +SKIP
        array([1., 1.])
    """
    if not requests:
        return []
    state = state_of(rt)
    cuda = numba_cuda()
    device = state.device if state.device is not None else current_device()
    with cuda.gpus[device]:
        if state.streams is None:
            state.streams = (cuda.stream(), cuda.stream())
        return _Batch(rt, state, names, requests, phase).run()


class DeviceRing:
    """Allreduce of device (CUDA) tensors: the batch is fused and reduced on its GPU."""

    name = "device_ring"
    selectable = False
    batched = True  # runs whole fused batches: `run_batch`, not `run`

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.device == "cuda"

    available = accepts
    run_batch = staticmethod(reduce_batch)
