"""Gradient compression: 16-bit wire formats with float32 accumulation.

`Compression.fp16` / `Compression.bf16` make allreduce send floating tensors as 16-bit values
while every rank accumulates in float32 (float64 tensors: in float64), with a fused kernel
that decodes a received segment, adds this rank's input and re-encodes it in one pass. The
ring reads the input where it lies and runs segment by segment, so the 16-bit values live only
in three segment-sized buffers (on one host the "wire" is memory); it times a cache-sized and
a streaming segment size per message size and keeps the faster (algorithms.choice.TimedChoice).
Average and the prescale are applied as the input is read, before the reduction, so partial
sums of inputs that fit the format stay within it. Integer and bool tensors are never compressed. On the CPU the fp16
conversions are the processor's own (F16C): a NaN stays NaN, but a signalling NaN arrives
quiet.

Error bound (measured against the same allreduce in float32, N ranks, u = 2^-11 for fp16 and
2^-8 for bf16, s = prescale / N for Average and prescale for the other ops):
    |result - exact| <= N * u * sum_i |s * x_i| + N * d        (then times the postscale)
where d is half the smallest subnormal of the wire format (2^-25 for fp16): each of the N-1
forwarded partial sums and the final value are rounded once to 16 bits, each partial sum
bounded by sum_i |s * x_i|.

`Compression.fp16_ef` / `bf16_ef` add error feedback: what this rank's input lost to 16-bit
rounding is kept per tensor name and added to that name's next input, so rounding errors do
not accumulate over steps. It needs named tensors.
"""
from __future__ import annotations

import numpy as np

from .dtypes import BFLOAT16
from .tensor import as_array, like


class Compressor:
    """How a tensor travels. `wire` is None (as is) or 'fp16' / 'bf16'.

    `compress(tensor) -> (tensor, ctx)` and `decompress(tensor, ctx) -> tensor` have the
    shape of Horovod's compressors: floating tensors are cast to the wire format and back,
    integer tensors pass through untouched. Allreduce does not call them: it compresses
    inside the ring (see the module docstring); they exist for code written against Horovod.

    Example:
        >>> import numpy as np
        >>> c, ctx = Compression.fp16.compress(np.ones(2, np.float32))
        >>> c.dtype, Compression.fp16.decompress(c, ctx).dtype
        (dtype('float16'), dtype('float32'))
    """

    def __init__(self, name: str, wire: str | None, error_feedback: bool = False):
        self.name, self.wire, self.error_feedback = name, wire, error_feedback

    def __repr__(self) -> str:
        return f"Compression.{self.name}"

    @property
    def wire_dtype(self) -> np.dtype | None:
        return {None: None, "fp16": np.dtype(np.float16), "bf16": BFLOAT16}[self.wire]

    def compress(self, tensor):
        """(tensor cast to the wire format if it is floating, the original dtype)."""
        arr = as_array(tensor)
        if self.wire is None or arr.dtype.kind != "f" and arr.dtype != BFLOAT16:
            return tensor, arr.dtype
        return like(tensor, arr.astype(self.wire_dtype)), arr.dtype

    def decompress(self, tensor, ctx):
        """The tensor cast back to the dtype `compress` recorded in `ctx`."""
        arr = as_array(tensor)
        if arr.dtype == ctx:
            return tensor
        return like(tensor, arr.astype(ctx))


class Compression:
    """The compressors accepted by every API's `compression=` argument.

    Example:
        >>> Compression.bf16.wire
        'bf16'
    """

    none = Compressor("none", None)
    fp16 = Compressor("fp16", "fp16")
    bf16 = Compressor("bf16", "bf16")
    fp16_ef = Compressor("fp16_ef", "fp16", error_feedback=True)
    bf16_ef = Compressor("bf16_ef", "bf16", error_feedback=True)


def as_compressor(compression) -> Compressor:
    """Validate a `compression=` argument (None means Compression.none).

    Example:
        >>> as_compressor(None).name
        'none'
    """
    if compression is None:
        return Compression.none
    if isinstance(compression, Compressor):
        return compression
    raise TypeError(f"compression must be one of Compression.none, fp16, bf16, fp16_ef, bf16_ef; "
                    f"got {compression!r}")
