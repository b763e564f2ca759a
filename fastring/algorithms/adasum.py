"""Adasum (Maleki et al., "Scaling Distributed Training with Adaptive Summation", MLSys 2021):
the adaptive sum of the ranks' gradients, reduced by recursive vector halving and distance
doubling on a power-of-two number of ranks.

Two vectors combine as

    adasum(a, b) = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b

(a coefficient is 1 where its vector's squared norm is below 1e-8), which is a + b for
orthogonal vectors and their average for equal ones. At level d = 1, 2, 4, ... each rank pairs
with rank ^ d: the pair splits the index range they both hold in two, each keeps one half of
its own vector and receives the partner's same half, and the dot products a.b, |a|^2, |b|^2
of the whole vectors are the sums of the partial ones over the 2d ranks that hold the
pieces of those two vectors (rank // 2d alike). After log2(N) levels every rank holds 1/N
of the result; an allgather gives every rank all of it. The partial sums travel by the ring,
the halves by pairwise exchange, both through the transport (every wait has its deadline).
"""
from __future__ import annotations

import numpy as np

from .._transport import array_address, pairwise_alltoall
from .collectives import allgather_rows, byte_offsets

NORM_FLOOR = 1e-8  # below this squared norm a vector keeps coefficient 1 (as Horovod)
ADASUM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def combine(a: np.ndarray, b: np.ndarray, dot: float, a_sq: float, b_sq: float) -> np.ndarray:
    """The Adasum combination of `a` and `b`, given the dot products of the whole vectors.

    Example:
        >>> a = np.array([1.0, 0.0]); combine(a, a, 1.0, 1.0, 1.0)   # equal vectors: their mean
        array([1., 0.])
    """
    a_coeff = 1.0 - dot / (2.0 * a_sq) if a_sq >= NORM_FLOOR else 1.0
    b_coeff = 1.0 - dot / (2.0 * b_sq) if b_sq >= NORM_FLOOR else 1.0
    return (a_coeff * a + b_coeff * b).astype(a.dtype, copy=False)


def adasum_allreduce(rt, x: np.ndarray) -> np.ndarray:
    """The Adasum reduction of every rank's flat `x` (float32 or float64; the size of `rt`'s
    communicator a power of two), as a new array on every rank."""
    size, rank = rt.size, rt.rank
    mine = np.array(x, dtype=x.dtype, copy=True).reshape(-1)
    start, stop = 0, mine.size  # the index range this rank holds at the current level
    level = 1
    while level < size:
        partner = rank ^ level
        middle = start + (stop - start) // 2
        keep, give = ((start, middle), (middle, stop)) if rank & level == 0 else ((middle, stop), (start, middle))
        b = np.empty(keep[1] - keep[0], mine.dtype)
        _exchange(rt, partner, mine[give[0]:give[1]], b)
        own = mine[keep[0]:keep[1]]
        # a: the lower rank's vector of the pair, b: the upper's, alike on all 2d ranks
        a, b = (own, b) if rank & level == 0 else (b, own)
        partial = np.array([[np.dot(a, b), np.dot(a, a), np.dot(b, b)]], np.float64)
        every = np.empty((size, 3), np.float64)
        allgather_rows(rt, partial, np.ones(size, np.int64), every)
        group = rank // (2 * level)
        dot, a_sq, b_sq = every[group * 2 * level:(group + 1) * 2 * level].sum(0)
        own[:] = combine(a, b, float(dot), float(a_sq), float(b_sq))
        start, stop = keep
        level *= 2
    # Every rank holds [start, stop) of the result; the ranks' ranges tile the vector.
    bounds = np.empty((size, 2), np.int64)
    allgather_rows(rt, np.array([[start, stop]], np.int64), np.ones(size, np.int64), bounds)
    out = np.empty_like(mine)
    pieces = np.empty(mine.size, mine.dtype)
    allgather_rows(rt, np.ascontiguousarray(mine[start:stop]), bounds[:, 1] - bounds[:, 0], pieces)
    at = byte_offsets(bounds[:, 1] - bounds[:, 0], 1)
    for r in range(size):
        out[bounds[r, 0]:bounds[r, 1]] = pieces[at[r]:at[r + 1]]
    return out.reshape(x.shape)


def _exchange(rt, partner: int, send: np.ndarray, recv: np.ndarray) -> None:
    """Send `send` to `partner` while receiving its block into `recv` (the lengths may
    differ by one element): a pairwise exchange in which every other block is empty."""
    send_offsets = np.zeros(rt.size + 1, np.int64)
    send_offsets[partner + 1:] = send.nbytes
    recv_offsets = np.zeros(rt.size + 1, np.int64)
    recv_offsets[partner + 1:] = recv.nbytes
    send = np.ascontiguousarray(send)
    pairwise_alltoall(rt.transport, array_address(send), send_offsets, array_address(recv), recv_offsets)
