"""Numba kernels of fastring.kernels, in GB/s of the destination (or float32) array's bytes,
beside NumPy's copy and add on the same arrays: the core's ceiling."""
import numpy as np

from fastring.kernels import KernelOp, accumulate16, decode16, encode16, reduce_into, scale_into

from .common import KIB, MIB, gbps, numpy_dtype, small_ints

SIZES = [64 * KIB, 64 * MIB]   # in cache; well beyond the last-level cache


class Reduce:
    """reduce_into(dst, src, SUM) and scale_into(dst, -1) per dtype."""

    params = (["float32", "float16", "bfloat16", "int32"], SIZES)
    param_names = ["dtype", "bytes"]

    def setup(self, dtype: str, nbytes: int) -> None:
        dt = numpy_dtype(dtype)
        self.dst = small_ints(nbytes, dt, 0)
        self.src = small_ints(nbytes, dt, 1)
        self.nbytes = self.dst.nbytes

    def track_reduce_into_sum(self, dtype: str, nbytes: int) -> float:
        return gbps(lambda: reduce_into(self.dst, self.src, KernelOp.SUM), self.nbytes)

    track_reduce_into_sum.unit = "GB/s"

    def track_scale_into(self, dtype: str, nbytes: int) -> float:
        # -1 keeps the values bounded and normal however often it runs
        return gbps(lambda: scale_into(self.dst, -1.0), self.nbytes)

    track_scale_into.unit = "GB/s"


class Codec16:
    """16-bit wire format kernels on float32 data: encode, decode, and the fused ring step."""

    params = (["fp16", "bf16"], SIZES)
    param_names = ["wire", "bytes"]

    def setup(self, wire: str, nbytes: int) -> None:
        self.acc = small_ints(nbytes, np.float32)
        self.bits = np.empty(self.acc.size, np.uint16)
        self.send = np.empty_like(self.bits)
        encode16(self.acc, self.bits, wire)
        self.nbytes = self.acc.nbytes

    def track_encode16(self, wire: str, nbytes: int) -> float:
        return gbps(lambda: encode16(self.acc, self.send, wire), self.nbytes)

    track_encode16.unit = "GB/s"

    def track_decode16(self, wire: str, nbytes: int) -> float:
        return gbps(lambda: decode16(self.bits, self.acc, wire), self.nbytes)

    track_decode16.unit = "GB/s"

    def track_accumulate16(self, wire: str, nbytes: int) -> float:
        # acc grows by at most 8 per call: a handful of calls stays exact and normal
        return gbps(lambda: accumulate16(self.acc, self.bits, self.send, wire, KernelOp.SUM),
                    self.nbytes)

    track_accumulate16.unit = "GB/s"


class NumpyCeiling:
    """np.copyto and np.add(a, b, out=a) on one core: what the kernels are measured against."""

    params = [SIZES]
    param_names = ["bytes"]

    def setup(self, nbytes: int) -> None:
        self.a = small_ints(nbytes, np.float32, 0)
        self.b = small_ints(nbytes, np.float32, 1)

    def track_copyto(self, nbytes: int) -> float:
        return gbps(lambda: np.copyto(self.a, self.b), self.a.nbytes)

    track_copyto.unit = "GB/s"

    def track_add(self, nbytes: int) -> float:
        return gbps(lambda: np.add(self.a, self.b, out=self.a), self.a.nbytes)

    track_add.unit = "GB/s"
