"""`horovod.torch.compression`'s names: the compressors accepted by `compression=`.

Example:
    >>> from fastring.torch.compression import Compression
    >>> Compression.fp16.wire
    'fp16'
"""
from fastring import Compression, Compressor

__all__ = ["Compression", "Compressor"]
