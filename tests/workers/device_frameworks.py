"""torch.cuda (and CuPy, when installed) tensors on a real GPU, N ranks sharing the GPUs
round-robin (on a one-GPU machine every rank uses device 0). Needs a GPU; skipped otherwise.

Checks: results are the caller's framework type on the same device, dtype and shape kept,
values equal to NumPy's, identical across ranks; out= in place; a tensor produced on a side
stream is read only after the producer finished (the producer's event is waited for)."""
import numpy as np
import torch

import _common as c
import fastring

fastring.init()
N, R = c.SIZE, c.RANK
dev = torch.device("cuda", fastring.local_rank() % torch.cuda.device_count())
torch.cuda.set_device(dev)
TORCH = {np.dtype(np.float32): torch.float32, np.dtype(np.float16): torch.float16,
         c.BF16: torch.bfloat16, np.dtype(np.int32): torch.int32}


def to_torch(a):
    if a.dtype == c.BF16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).to(dev)
    return torch.from_numpy(a.copy()).to(dev)


def to_numpy(t, name):
    if not isinstance(t, torch.Tensor) or t.device != dev:
        c.fail(f"{name}: result is {type(t).__name__} on {getattr(t, 'device', None)}, expected {dev}")
    t = t.cpu()
    return t.view(torch.int16).numpy().view(c.BF16) if t.dtype == torch.bfloat16 else t.numpy()


for dt in TORCH:
    for op in (fastring.Sum, fastring.Average, fastring.Max):
        for n in (0, 1, N + 1, 1000, 300001):
            inputs = [c.rank_input(dt, n, r, n + int(op)) for r in range(N)]
            name = f"torch {dt} {op.name} n={n}"
            got = to_numpy(fastring.allreduce(to_torch(inputs[R]), op=op), name)
            expected, bound = c.reference(inputs, op, N)
            if got.dtype != dt or got.shape != (n,):
                c.fail(f"{name}: {got.dtype}{got.shape}")
            c.check_close(name, got, expected, bound)
            c.check_identical(name, got)

# in place, and compressed
x = [c.rank_input(np.dtype(np.float32), (64, 3), r, 1) for r in range(N)]
t = to_torch(x[R])
if fastring.allreduce(t, op=fastring.Sum, out=t) is not t:
    c.fail("out=t returned another tensor")
c.check_close("in place", to_numpy(t, "in place"), *c.reference(x, fastring.Sum, N))
got = to_numpy(fastring.allreduce(to_torch(x[R]), op=fastring.Sum,
                                  compression=fastring.Compression.fp16), "fp16")
c.check_identical("fp16 wire", got)

# produced on a side stream: a slow kernel writes the tensor right before allreduce_async
side = torch.cuda.Stream(device=dev)
handles, expected = [], []
with torch.cuda.stream(side):
    for k in range(4):
        a = torch.zeros(1 << 20, device=dev)
        for _ in range(20):
            a.add_(1.0)  # queued work the allreduce must wait for
        handles.append(fastring.allreduce_async(a, op=fastring.Sum, name=f"side.{k}"))
for k, h in enumerate(handles):
    got = to_numpy(h.wait(), f"side.{k}")
    if not np.all(got == 20.0 * N):
        c.fail(f"side stream {k}: read before the producer finished: {got[:3]}")

try:
    import cupy
except ImportError:
    cupy = None
if cupy is not None:
    with cupy.cuda.Device(dev.index):
        y = [c.rank_input(np.dtype(np.float32), 1001, r, 2) for r in range(N)]
        got = fastring.allreduce(cupy.asarray(y[R]), op=fastring.Sum)
        if not isinstance(got, cupy.ndarray):
            c.fail(f"CuPy in, {type(got).__name__} out")
        c.check_close("cupy", cupy.asnumpy(got), *c.reference(y, fastring.Sum, N))
c.done(f"device frameworks (torch{', cupy' if cupy is not None else ''})")
