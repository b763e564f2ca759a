"""Gradients of fastring.torch's differentiable collectives on N ranks, checked against the
math (and Horovod's conventions): rank r feeds upstream gradient (r + 1) * ones unless said
otherwise, so every expected value below is a closed form in N and r."""
import torch

import _common as c
import fastring.torch as hvd
from torch_common import N, R, close

TRI = N * (N + 1) / 2  # sum over ranks of (r + 1)
F64 = torch.float64


def leaf(*shape, dtype=F64, value=None):
    t = torch.arange(torch.Size(shape).numel(), dtype=dtype).reshape(shape) + 100 * R
    return (t if value is None else torch.full(shape, value, dtype=dtype)).requires_grad_()


def upstream(t):
    return torch.full_like(t, R + 1.0)


# allreduce: y = post * op_r(pre * x_r); the gradient is the same allreduce of the upstream one
for dtype in (torch.float32, F64):
    for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 0.5, 3.0),
                          (hvd.Average, 2.0, 0.25)):
        x = leaf(4, 3, dtype=dtype)
        y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
        y.sum().backward()  # Horovod's test: d(sum(allreduce(x)))/dx
        expected = pre * post * (N if op == hvd.Sum else 1.0)
        close(f"allreduce grad of sum {op.name} {pre} {post} {dtype}", x.grad, torch.full((4, 3), expected), 1e-6)
        x.grad = None
        hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post).backward(upstream(x))
        expected = pre * post * TRI / (N if op == hvd.Average else 1)
        close(f"allreduce grad {op.name} {pre} {post} {dtype}", x.grad, torch.full((4, 3), expected), 1e-5)
    # through the core's compression the gradient is still the same allreduce
    x = leaf(5, dtype=dtype)
    hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16, name="cg").backward(upstream(x))
    close(f"allreduce fp16 grad {dtype}", x.grad, torch.full((5,), TRI), 1e-6)

# grouped allreduce
xs = [leaf(3 + i) for i in range(3)]
ys = hvd.grouped_allreduce(xs, op=hvd.Average)
torch.autograd.backward(ys, [upstream(y) * (i + 1) for i, y in enumerate(ys)])
for i, x in enumerate(xs):
    close(f"grouped_allreduce grad {i}", x.grad, torch.full_like(x, (i + 1) * TRI / N), 1e-12)

# allgather: the output gradient averaged over ranks, then this rank's rows
x = leaf(R + 1, 2)
y = hvd.allgather(x)
rows = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(N)]).to(F64)
y.backward(rows * (R + 1))
close("allgather grad", x.grad, torch.full((R + 1, 2), R * TRI / N), 1e-12)

# broadcast: the averaged gradient on the root, zeros elsewhere
for root in range(N):
    x = leaf(3, 2)
    hvd.broadcast(x, root).backward(upstream(x))
    close(f"broadcast grad root {root}", x.grad, torch.full((3, 2), TRI / N if R == root else 0.0), 1e-12)

# alltoall: an upstream gradient equal to what was received sends it back where it came from,
# so the input's gradient is the input itself on the rows sent and zero on the rows kept
splits = [(k + R) % 3 for k in range(N)]
x = leaf(sum(splits) + 1, 2)
y, received = hvd.alltoall(x, splits=splits)
y.backward(y.detach().clone())
expected = x.detach().clone()
expected[sum(splits):] = 0
close("alltoall grad", x.grad, expected, 0)
x = leaf(2 * N)
hvd.alltoall(x).backward(torch.arange(2 * N, dtype=F64) + 10 * R)  # rows 2r, 2r+1 came from rank r
close("alltoall grad (equal splits)", x.grad,
      torch.tensor([10 * (i // 2) + 2 * R + i % 2 for i in range(2 * N)], dtype=F64), 0)

# reducescatter (Horovod's definition): the rows rank k received carry k's upstream gradient
# back, times the scale factors, times N for Sum; that is N times the gradient of the summed
# losses, checked against autograd of the single-process equivalent below
for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5), (hvd.Average, 3.0, 1.0)):
    x = leaf(2 * N, 3)
    y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
    y.backward(upstream(y))
    scale = pre * post * (N if op == hvd.Sum else 1)
    expected = torch.cat([torch.full((2, 3), (k + 1) * scale, dtype=F64) for k in range(N)])
    close(f"reducescatter grad {op.name} {pre} {post}", x.grad, expected, 1e-12)
    # the single-process equivalent: every rank's input stacked, reduced, sliced; the loss is
    # the sum over ranks k of (k + 1) * sum(slice k)
    xs = torch.stack([leaf(2 * N, 3).detach() for _ in range(N)]).requires_grad_()
    reduced = pre * post * xs.sum(0) / (N if op == hvd.Average else 1)
    sum(((k + 1) * reduced[2 * k:2 * k + 2]).sum() for k in range(N)).backward()
    close(f"reducescatter grad {op.name} {pre} {post} = N x single-process", x.grad, N * xs.grad[R], 1e-12)

# a small network through allgather and allreduce: autograd matches the local computation
torch.manual_seed(0)
w = torch.randn(3, 3, dtype=F64, requires_grad=True)
x = torch.randn(2, 3, dtype=F64, generator=torch.Generator().manual_seed(R))
loss = hvd.allreduce((hvd.allgather(x @ w) ** 2).sum(), op=hvd.Sum)
loss.backward()
all_x = torch.cat([torch.randn(2, 3, dtype=F64, generator=torch.Generator().manual_seed(r)) for r in range(N)])
w_local = w.detach().clone().requires_grad_()
(N * ((all_x @ w_local) ** 2).sum()).backward()
# each rank's w.grad is its rows' share: summed over ranks, the gradient of the local loss
close("network grad", hvd.allreduce(w.grad, op=hvd.Sum), w_local.grad, 1e-9)
c.done("fastring.torch autograd")
