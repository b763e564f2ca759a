"""Compression outside the ring: fastring.Compression's Horovod-style compress / decompress
casts, in GB/s of the float32 tensor. (The 16-bit wire kernels are in bench_kernels.Codec16,
compressed 2-rank allreduces in bench_collectives.CompressedAllreduce.) Skipped where this
fastring has no fastring.Compression."""
import numpy as np

import fastring

from .common import KIB, MIB, gbps, small_ints


class Compressors:
    params = (["fp16", "bf16"], [64 * KIB, 64 * MIB])
    param_names = ["compression", "bytes"]

    def setup(self, compression: str, nbytes: int) -> None:
        if getattr(fastring, "Compression", None) is None:
            raise NotImplementedError("fastring.Compression is not available in this fastring")
        self.compressor = getattr(fastring.Compression, compression)
        self.tensor = small_ints(nbytes, np.float32)
        self.wire, self.ctx = self.compressor.compress(self.tensor)

    def track_compress(self, compression: str, nbytes: int) -> float:
        return gbps(lambda: self.compressor.compress(self.tensor), self.tensor.nbytes)

    track_compress.unit = "GB/s"

    def track_decompress(self, compression: str, nbytes: int) -> float:
        return gbps(lambda: self.compressor.decompress(self.wire, self.ctx), self.tensor.nbytes)

    track_decompress.unit = "GB/s"
