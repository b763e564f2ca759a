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


def test_segment_chooser_tries_both_then_keeps_the_faster():
    from fastring.algorithms import SegmentChooser
    from fastring._core.config import (WIRE_SEGMENT_ELEMENTS as SMALL, WIRE_SEGMENT_RETRY_CALLS as RETRY,
                                  WIRE_STREAM_SEGMENT_ELEMENTS as LARGE)
    c, nbytes, chunk = SegmentChooser(), 64 << 20, 8 << 20
    assert not c.learns(SMALL) and c.segment(SMALL, 1 << 20) == SMALL  # one segment either way
    times = {SMALL: 2.0, LARGE: 1.0}
    used = []
    for _ in range(3 * RETRY):
        s = c.segment(chunk, nbytes)
        used.append(s)
        c.record(nbytes, s, times[s])
    assert used[:2] == [SMALL, LARGE]  # each timed once, then the faster, retrying the other
    assert [i for i, s in enumerate(used) if s == SMALL] == [0, RETRY - 1, 2 * RETRY - 1, 3 * RETRY - 1]
    # the small segment becomes faster: each retry pulls its smoothed time down, until it wins
    times = {SMALL: 0.1, LARGE: 1.0}
    for _ in range(3 * RETRY):
        c.record(nbytes, s := c.segment(chunk, nbytes), times[s])
    assert c.segment(chunk, nbytes) == SMALL
    assert c.segment(chunk, nbytes << 1) == SMALL  # another size learns on its own
