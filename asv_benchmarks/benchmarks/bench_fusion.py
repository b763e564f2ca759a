"""Tensor fusion: fastring.kernels.pack / unpack of many tensors into one buffer, in GB/s of
the fused bytes."""
import numpy as np

from fastring.kernels import pack, unpack

from .common import MIB, gbps


class Fusion:
    """16 MiB fused from `tensors` byte arrays of varied sizes (like a model's gradients)."""

    params = [[16, 256]]
    param_names = ["tensors"]

    def setup(self, tensors: int) -> None:
        rng = np.random.default_rng(0)
        weights = rng.uniform(0.1, 1.0, tensors)
        sizes = np.maximum(1, (weights / weights.sum() * 16 * MIB).astype(np.int64))
        self.parts = [rng.integers(0, 256, int(n), dtype=np.uint8) for n in sizes]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
        self.buffer = np.empty(int(sizes.sum()), np.uint8)
        pack(self.buffer, self.parts, self.offsets)

    def track_pack(self, tensors: int) -> float:
        return gbps(lambda: pack(self.buffer, self.parts, self.offsets), self.buffer.nbytes)

    track_pack.unit = "GB/s"

    def track_unpack(self, tensors: int) -> float:
        return gbps(lambda: unpack(self.buffer, self.parts, self.offsets), self.buffer.nbytes)

    track_unpack.unit = "GB/s"
