"""Execution of agreed requests: allreduces of one key are fused into batches of at most the
fusion threshold and each batch is reduced by one algorithm run; every other collective runs
its own `execute`. The same batches run in the same order on every rank."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .. import algorithms, kernels
from .._core.config import FUSION_MAX_TENSOR_BYTES
from .._core.residuals import Residuals
from .._core.work import AllreduceWork, finalizer, nothing, pack, predivides, prescale, unpack
from .._transport import gather_from_arrays, is_c_contiguous, pieces_of, scatter_to_arrays
from .request import Request

Complete = Callable[..., None]  # complete(request, result=None, error=None)


def _plain(work: AllreduceWork, size: int) -> bool:
    """Whether `work`'s input is reduced as it is: no prescale, no division before the sum, no
    error feedback (then packing it is a plain copy)."""
    return work.prescale == 1.0 and not predivides(work, size) and not work.compression.error_feedback


class Executor:
    """Runs agreed requests for one engine; `complete` hands each request its outcome."""

    def __init__(self, rt, timeline, complete: Complete, complete_all: Callable[[list, list], None]):
        self.rt = rt
        self.config = rt.config
        self.timeline = timeline
        self.complete = complete
        self.complete_all = complete_all  # complete_all(requests, results): each with its result
        self._fusion = np.empty(0, np.uint8)
        self.residuals = Residuals()  # error feedback by tensor name, least recently used dropped
        # (what, tensor names) running now: what a data-phase stall names (stall.DataStallReporter)
        self.running: tuple[str, list[str]] = ("", [])

    def phase(self, names) -> algorithms.Phase:
        """The timeline phases of the requests `names`."""
        return lambda what: self.timeline.span(names, what)

    def execute(self, ready: list[Request]) -> None:
        """Run `ready` (agreed, in the same order on every rank); an error of one group of
        requests is theirs alone and goes to their handles."""
        work = ready[0].allreduce
        if work is not None and all([r.allreduce is work for r in ready]):
            groups = {work.key: ready}  # the common case: one signature's requests, one group
        else:
            groups: dict[tuple, list[Request]] = {}
            for r in ready:
                key = r.allreduce.key if r.allreduce is not None else ("single", r.name)
                groups.setdefault(key, []).append(r)
        for key, reqs in groups.items():
            try:
                if key[0] == "allreduce":
                    self._run_allreduce(reqs)
                else:
                    self.running = (reqs[0].kind, [reqs[0].name])
                    with self.timeline.span(reqs[0].name, reqs[0].kind):
                        result = reqs[0].execute(self.rt)
                    self.complete(reqs[0], result)
            except Exception as e:  # noqa: BLE001 - the error belongs to these handles
                for r in reqs:
                    self.complete(r, error=e)

    def _run_allreduce(self, reqs: list[Request]) -> None:
        threshold = max(self.config.fusion_threshold, 1)
        sizes = [r.nbytes for r in reqs]
        if sum(sizes) <= threshold and max(sizes) < FUSION_MAX_TENSOR_BYTES:
            self._reduce_batch(reqs)  # the common case, one batch, decided in two calls
            return
        batch: list[Request] = []
        batch_bytes = 0
        for r in reqs + [None]:
            # A large tensor is reduced alone, where it lies: copying it into the fusion buffer
            # and back costs more than the call it would share (decided alike on every rank).
            alone = r is not None and r.nbytes >= FUSION_MAX_TENSOR_BYTES
            if r is None or alone or (batch and batch_bytes + r.nbytes > threshold):
                if batch:
                    self._reduce_batch(batch)
                batch, batch_bytes = [], 0
            if alone:
                self._reduce_batch([r])
            elif r is not None:
                batch.append(r)
                batch_bytes += r.nbytes

    def _reduce_batch(self, batch: list[Request]) -> None:
        work = batch[0].allreduce
        names = [r.name for r in batch]
        # every request of a batch shares the work's key: reduced in its own dtype, or not
        in_own_dtype = work.accumulator == work.spec.dtype and not work.splits_average
        sizes = [r.nbytes for r in batch] if in_own_dtype else [work.reduced_nbytes(r.nbytes) for r in batch]
        total = sum(sizes)
        algorithm = algorithms.choose("allreduce", total, work.reduced_spec, device=work.device,
                                      wire=work.compression.wire, rt=self.rt, setting=self.config.algorithm,
                                      may_ride_cycle=False)
        self.running = (f"allreduce ({algorithm.name})", names)
        if getattr(algorithm, "batched", False):
            results = algorithm.run_batch(self.rt, names, batch, self.phase(names))
            for r, result in zip(batch, results):
                self.complete(r, result)
            return
        first = batch[0]
        own = first.own_buffer() if len(batch) == 1 else None
        if own is not None and own.dtype == work.accumulator and not work.splits_average:
            entries = first.entries
            if not (first.block is not None and _plain(work, self.rt.size)
                    and hasattr(algorithm, "run_pieces")
                    and self._reduce_pieces(algorithm, self._plain_reduction(names, own, work),
                                            [e.src for e in entries])):
                src = self._unscaled_source(first, algorithm)
                if src is None:
                    with self.timeline.span(names, "pack"):
                        if first.block is not None:
                            _gather(own, [e.src for e in entries])
                        elif entries[0].src is not entries[0].work:
                            np.copyto(entries[0].work, entries[0].src)
                        prescale(work, own, self.rt.size)
                        self._feed_back_error(first, own)
                self.reduce(algorithm, names, own, work, src)
            for e in entries:
                if e.target is not e.work:
                    np.copyto(e.target, e.work)
            results = [e.result for e in entries]
            self.complete(first, results if first.grouped else results[0])
            return
        accumulator = work.accumulator
        flat = self._fusion_view(total // accumulator.itemsize, accumulator)
        # A batch of plain tensors (the common case: gradients) packs in one call; one
        # pack() per tensor costs microseconds each in Python.
        firsts = ([r.entries[0] for r in batch if len(r.entries) == 1]
                  if in_own_dtype and _plain(work, self.rt.size) else [])
        plain = len(firsts) == len(batch)  # then firsts: its requests' one entry each
        # (the Reduction and the list of inputs are built only for an algorithm that reads pieces)
        if not (plain and hasattr(algorithm, "run_pieces")
                and self._reduce_pieces(algorithm, self._plain_reduction(names, flat, work),
                                        [e.src for e in firsts])):
            with self.timeline.span(names, "pack"):
                if plain:
                    _gather(flat, [e.src for e in firsts])
                else:
                    for r, part in zip(batch, _parts(flat, sizes)):
                        pack(work, r.entries, part, self.rt.size)
                        self._feed_back_error(r, part)
            self.reduce(algorithm, names, flat, work)
        if plain and not self.timeline.recording and scatter_to_arrays(flat, [e.work for e in firsts]):
            # the plain batch unpacks in one call too: a copy per tensor costs a microsecond
            results = []
            for r, e in zip(batch, firsts):
                if e.target is not e.work:
                    np.copyto(e.target, e.work)
                results.append([e.result] if r.grouped else e.result)
            self.complete_all(batch, results)
            return
        for r, part in zip(batch, _parts(flat, sizes)):
            self.unpack_and_finish(r, part)

    def _fusion_view(self, count: int, dtype: np.dtype) -> np.ndarray:
        """The persistent fusion buffer as `count` elements of `dtype` (grown, never shrunk)."""
        nbytes = count * dtype.itemsize
        if self._fusion.nbytes < nbytes:
            self._fusion = np.empty(nbytes, np.uint8)
        return self._fusion[:nbytes].view(dtype)

    def reduce_group(self, name: str, inputs: list, flat: np.ndarray, spec, op, finalize) -> None:
        """Allreduce the plain `inputs` (C-contiguous arrays of `spec`'s dtype) into `flat`,
        one after another: read where they lie where the algorithm can, else gathered into
        `flat` first. A group's whole data phase, for the engine's lean grouped call."""
        algorithm = algorithms.choose("allreduce", flat.nbytes, spec, rt=self.rt, setting=self.config.algorithm,
                                      may_ride_cycle=False)
        self.running = (f"allreduce ({algorithm.name})", [name])  # for a stall's message
        reduction = algorithms.Reduction(flat, spec, op, finalize, self.phase([name]))
        if not self._reduce_pieces(algorithm, reduction, inputs):
            _gather(flat, inputs)
            algorithm.run(self.rt, reduction)

    def _reduce_pieces(self, algorithm, reduction: algorithms.Reduction, inputs: list) -> bool:
        """Run `reduction` of a plain batch whose `inputs` lie apart, reading them where they
        lie (`SharedMemory.run_pieces`: no copy into one buffer first); False, having done
        nothing, where `algorithm` cannot."""
        run_pieces = getattr(algorithm, "run_pieces", None)
        pieces = pieces_of(inputs) if run_pieces is not None else None
        return pieces is not None and run_pieces(self.rt, reduction, *pieces)

    def _plain_reduction(self, names, flat: np.ndarray, work: AllreduceWork) -> algorithms.Reduction:
        """The Reduction of a plain batch (`_plain`) of `work`'s key into `flat`."""
        return algorithms.Reduction(flat, work.reduced_spec, work.reduce_op, finalizer(work, self.rt.size) or nothing,
                                    self.phase(names))

    def _unscaled_source(self, req: Request, algorithm) -> np.ndarray | None:
        """The input a lone allreduce is reduced from where it lies (the ring and the
        compressed ring read it directly, scaling as they read under compression), or None
        when it must be copied and scaled into the output first."""
        work, e = req.allreduce, req.entries[0]
        if len(req.entries) != 1 or not is_c_contiguous(e.src):
            return None
        if _compresses(algorithm, work):
            # error feedback must change the input before the ring reads it
            return None if work.compression.error_feedback else e.src.reshape(-1)
        if (algorithm not in (algorithms.Ring, algorithms.Hierarchical) or e.src is e.work or work.prescale != 1.0
                or predivides(work, self.rt.size)):
            return None
        return e.src.reshape(-1)

    def reduce(self, algorithm, names, flat: np.ndarray, work: AllreduceWork,
               src: np.ndarray | None = None) -> None:
        """Allreduce `flat` (or, given `src`, the unscaled input `src` into `flat`) with
        `algorithm`, finalizing as `work` says."""
        phase = self.phase(names)
        if _compresses(algorithm, work):
            # Under compression Average always divides first (predivides), so what is left
            # after the reduction is the postscale; an input packed into `flat` is scaled.
            size = self.rt.size
            scale = ((work.prescale, float(size) if predivides(work, size) else 1.0, work.postscale)
                     if src is not None else (1.0, 1.0, work.postscale))
            algorithm.run(self.rt, algorithms.Reduction(flat, work.spec, work.op, phase=phase, src=src,
                                                        wire=work.compression.wire, scale=scale))
            return
        finalize = finalizer(work, self.rt.size) or nothing
        algorithm.run(self.rt, algorithms.Reduction(flat, work.reduced_spec, work.reduce_op, finalize, phase, src))

    def _feed_back_error(self, req: Request, flat: np.ndarray) -> None:
        """Error feedback: add what this name lost to 16-bit rounding last time, and keep
        what it loses now, so that rounding errors do not pile up over steps."""
        compression = req.allreduce.compression
        if not compression.error_feedback:
            return
        residual = self.residuals.get(req.name, flat.shape, flat.dtype)
        if residual is not None:
            flat += residual
        bits = np.empty(flat.size, np.uint16)
        kernels.encode16(flat, bits, compression.wire)
        sent = np.empty_like(flat)
        kernels.decode16(bits, sent, compression.wire)
        self.residuals.put(req.name, flat - sent)
        flat[...] = sent

    def unpack_and_finish(self, req: Request, flat: np.ndarray) -> None:
        """Copy `req`'s part of a reduced buffer into its targets and complete it."""
        with self.timeline.span(req.name, "unpack"):
            values = unpack(req.allreduce, flat, self.rt.size)
            offset = 0
            for e in req.entries:
                n = e.work.size
                np.copyto(e.target, values[offset:offset + n].reshape(e.target.shape), casting="unsafe")
                offset += n
        entries = req.entries
        self.complete(req, [e.result for e in entries] if req.grouped else entries[0].result)


def _parts(flat: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
    """`flat` cut into consecutive views of `sizes` bytes each: each request's part of a
    fused buffer."""
    parts, offset = [], 0
    for size in sizes:
        count = size // flat.itemsize
        parts.append(flat[offset:offset + count])
        offset += count
    return parts


def _gather(flat: np.ndarray, srcs: list) -> None:
    """Copy `srcs` one after another into `flat`, as many elements as they hold together: one
    call, memcpy where every source is contiguous (a loop of np.copyto costs twice as much as
    np.concatenate at 100 tensors, and np.concatenate six times as much as the memcpy)."""
    if not gather_from_arrays(flat, srcs):
        np.concatenate(srcs, axis=None, out=flat)


def _compresses(algorithm, work: AllreduceWork) -> bool:
    """Whether `algorithm` sends `work` as 16-bit values, reading it scaled (Reduction.scale)."""
    return algorithm is algorithms.CompressedRing or (
        algorithm is algorithms.Hierarchical and work.compression.wire is not None)
