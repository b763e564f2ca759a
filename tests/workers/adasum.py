"""Adasum on N ranks (a power of two): fastring.adasum_allreduce and fastring.torch's
op=hvd.Adasum against a NumPy reference of the paper's formula applied pairwise up a binary
tree (ranks 2i and 2i+1, then pairs of pairs, ...), on odd lengths, a single element,
orthogonal and parallel vectors; and the errors: a process set of a size that is not a power
of two, integer tensors."""
import numpy as np
import torch

import _common as c
import fastring
import fastring.torch as hvd
from torch_common import close, expect_error

N, R = c.SIZE, c.RANK
fastring.init()


def pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The formula, in float64: (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    dot, aa, bb = a @ b, a @ a, b @ b
    return (1 - dot / (2 * aa) if aa >= 1e-8 else 1.0) * a + (1 - dot / (2 * bb) if bb >= 1e-8 else 1.0) * b


def reference(vectors: list[np.ndarray]) -> np.ndarray:
    while len(vectors) > 1:
        vectors = [pairwise(vectors[i], vectors[i + 1]) for i in range(0, len(vectors), 2)]
    return vectors[0]


for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
    for count in (1, 2, 7, 1000, 40001):
        vectors = [np.random.default_rng([r, count]).standard_normal(count).astype(dtype) for r in range(N)]
        got = fastring.adasum_allreduce(vectors[R])
        if got.dtype != dtype or got.shape != (count,):
            c.fail(f"adasum {dtype} x{count}: result {got.dtype}{got.shape}")
        want = reference(vectors)
        c.check_close(f"adasum {np.dtype(dtype)} x{count}", got, want, tol * (1 + np.abs(want)))
        c.check_identical(f"adasum {np.dtype(dtype)} x{count} bitwise on every rank", got)
# the two limits of the formula: orthogonal vectors add, equal vectors average
basis = np.eye(N)[R] * (R + 1)
c.check_close("adasum of orthogonal vectors is their sum", fastring.adasum_allreduce(basis), np.arange(1.0, N + 1), 1e-12)
c.check_close("adasum of equal vectors is the vector", fastring.adasum_allreduce(np.full(5, 3.0)), np.full(5, 3.0), 1e-12)
c.check_close("adasum of a zero vector and others", fastring.adasum_allreduce(np.zeros(3) if R == 0 else np.ones(3)),
              reference([np.zeros(3)] + [np.ones(3)] * (N - 1)), 1e-12)
c.check_close("adasum of a 2-D tensor", fastring.adasum_allreduce(np.full((2, 3), R + 1.0)),
              reference([np.full(6, r + 1.0) for r in range(N)]).reshape(2, 3), 1e-12)

# fastring.torch: every allreduce form with op=hvd.Adasum, and its gradient (the Adasum of the
# gradients, as Horovod's allreduce defines its gradient)
vectors = [torch.from_numpy(np.random.default_rng([r, 3]).standard_normal(6)) for r in range(N)]
want = torch.from_numpy(reference([v.numpy() for v in vectors]))
close("hvd.allreduce(op=Adasum)", hvd.allreduce(vectors[R], op=hvd.Adasum), want, 1e-12)
close("hvd.allreduce_async(op=Adasum)", hvd.synchronize(hvd.allreduce_async(vectors[R], op=hvd.Adasum)), want, 1e-12)
t = vectors[R].clone()
hvd.allreduce_(t, op=hvd.Adasum)
close("hvd.allreduce_(op=Adasum)", t, want, 1e-12)
got = hvd.grouped_allreduce([vectors[R], 2 * vectors[R]], op=hvd.Adasum)
close("hvd.grouped_allreduce(op=Adasum)", torch.cat(got), torch.cat([want, 2 * want]), 1e-12)
close("Adasum with scale factors", hvd.allreduce(vectors[R], op=hvd.Adasum, prescale_factor=2.0, postscale_factor=0.25),
      torch.from_numpy(reference([2 * v.numpy() for v in vectors])) * 0.25, 1e-12)
x = vectors[R].clone().requires_grad_()
hvd.allreduce(x, op=hvd.Adasum).backward(vectors[(R + 1) % N])
close("Adasum gradient", x.grad, torch.from_numpy(reference([vectors[(r + 1) % N].numpy() for r in range(N)])), 1e-12)

# errors
expect_error("Adasum of integers", lambda: fastring.adasum_allreduce(np.ones(3, np.int32)), TypeError, "float32")
expect_error("Adasum in the optimizer", lambda: hvd.DistributedOptimizer(torch.optim.SGD([x], lr=0.1), op=hvd.Adasum),
             NotImplementedError, "Adasum")
if N >= 4:
    three = fastring.add_process_set([0, 1, 2])
    if R < 3:
        expect_error("Adasum on 3 ranks", lambda: fastring.adasum_allreduce(np.ones(2), process_set=three),
                     ValueError, "power-of-two", "3")
    odd = fastring.add_process_set([1, 3])  # a power-of-two set inside the job
    if R in (1, 3):
        c.check_close("Adasum in a process set", fastring.adasum_allreduce(vectors[R].numpy(), process_set=odd),
                      reference([vectors[1].numpy(), vectors[3].numpy()]), 1e-12)
c.done("Adasum")
