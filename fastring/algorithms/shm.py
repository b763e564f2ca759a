"""The one-host allreduce: through the host's shared segment (fastring._transport.shm), no MPI
message, when every rank runs on this host and `init` could map the segment."""
from __future__ import annotations

from .. import kernels
from .._core.config import SHM_ONE_STEP_BYTES
from .._core.ops import KERNEL_OP
from .._transport import array_address
from .base import Message, Reduction


class SharedMemory:
    """Every rank copies its input into its buffer of the segment and reduces its part of the
    result by reading the others' buffers directly, then copies the other parts from where
    they were reduced (one barrier up to SHM_ONE_STEP_BYTES, where every rank reduces the
    whole message in rank order instead; from SHM_ALLREDUCE_SINGLE_COPY_BYTES, where the ranks
    may copy between their memories, each chunk is read from every rank, reduced and written
    into every rank by whichever rank claims it). Any dtype and op the kernels reduce; each
    element is reduced by one rank (or by all alike), so the results are bitwise identical
    everywhere."""

    name = "shm"
    selectable = True

    @staticmethod
    def accepts(m: Message) -> bool:
        return m.rt is not None and m.rt.shm is not None and m.device == "cpu" and m.wire is None

    available = accepts

    @staticmethod
    def run(rt, r: Reduction) -> None:
        flat, spec = r.flat, r.spec
        src = flat if r.src is None else r.src
        shm = rt.shm
        reduce_fn = kernels.reduce_cfunc(KERNEL_OP[r.op], spec.dtype)
        itemsize = spec.dtype.itemsize
        one_step = flat.nbytes <= min(SHM_ONE_STEP_BYTES, shm.tile_bytes)
        with r.phase("shm-allreduce"):
            shm.allreduce(array_address(src), array_address(flat), flat.nbytes, reduce_fn, itemsize, one_step)
            # Every rank finalizes the whole result, all alike: an extra pass over the data,
            # but no callback into Python (and so no wait for the GIL) inside the loop.
            r.finalize(flat)
