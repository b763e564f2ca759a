"""Compression: the ring on a 16-bit wire at np 2, 3, 4 (worker), and the Compressor objects."""
import numpy as np
import pytest

import fastring
from fastring import Compression


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_compressed_allreduce(mpirun, n):
    mpirun(n, "compressed_allreduce")


@pytest.mark.parametrize("comp, wire", [(Compression.fp16, np.float16), (Compression.bf16, fastring._core.dtypes.BFLOAT16)])
def test_compress_casts_floats_and_passes_integers(comp, wire):
    x = np.linspace(-2, 2, 9, dtype=np.float32)
    c, ctx = comp.compress(x)
    assert c.dtype == wire and ctx == np.float32
    back = comp.decompress(c, ctx)
    assert back.dtype == np.float32 and np.array_equal(back, x.astype(wire).astype(np.float32))
    i = np.arange(5, dtype=np.int32)
    ci, ctx = comp.compress(i)
    assert ci is i and comp.decompress(ci, ctx) is i


def test_compress_torch_tensors():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-1, 1, 5)
    c, ctx = Compression.bf16.compress(t)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.bfloat16
    back = Compression.bf16.decompress(c, ctx)
    assert back.dtype == torch.float32 and torch.equal(back, t.to(torch.bfloat16).float())
    none, ctx = Compression.none.compress(t)
    assert none is t


def test_compression_argument_errors():
    fastring.init()
    with pytest.raises(TypeError, match="compression"):
        fastring.allreduce(np.ones(3, np.float32), compression="fp16")
    with pytest.raises(ValueError, match="name"):
        fastring.allreduce(np.ones(3, np.float32), compression=Compression.fp16_ef)
    assert fastring.allreduce(np.ones(3), compression=None).tolist() == [1.0] * 3


