"""allreduce over every dtype x op x length x algorithm, for numpy or torch tensors.
usage: allreduce.py numpy|torch [algorithm ...]"""
import sys

import numpy as np

import _common as c
import fastring

framework = sys.argv[1]
algorithms = sys.argv[2:] or ["auto"]
to_fw, from_fw = c.converters(framework)

OPS = [fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product]
N = c.SIZE
LENGTHS = sorted({0, 1, max(N - 1, 0), N + 1, 10**6 + 3})

fastring.init()
for algorithm in algorithms:
    c.reinit(algorithm)
    for dt in c.DTYPES:
        for op in OPS:
            if dt == np.bool_ and op == fastring.Average:
                continue
            for length in LENGTHS:
                seed = length * 7 + int(op)
                inputs = [c.rank_input(dt, length, r, seed) for r in range(N)]
                tensor = to_fw(inputs[c.RANK])
                name = f"{framework} {algorithm} {dt} {op.name} n={length}"
                expected, bound = c.reference(inputs, op, N)
                got = from_fw(fastring.allreduce(tensor, op=op))
                if got.dtype != dt or got.shape != (length,):
                    c.fail(f"{name}: result {got.dtype}{got.shape}")
                # the input is left untouched
                c.check_close(name + " input", from_fw(tensor), inputs[c.RANK], 0)
                c.check_close(name, got, expected, bound)
                c.check_identical(name, got)
    # out= in place, into another tensor, and through a strided view; pre/postscale
    for dt in (np.dtype(np.float32), np.dtype(np.int32), c.BF16):
        inputs = [c.rank_input(dt, (6, 5), r, 99) for r in range(N)]
        expected, bound = c.reference(inputs, fastring.Sum, N)
        t = to_fw(inputs[c.RANK])
        r = fastring.allreduce(t, op=fastring.Sum, out=t)
        if r is not t:
            c.fail(f"{algorithm} {dt} out=t returned another object")
        c.check_close(f"{algorithm} {dt} in place", from_fw(t), expected, bound)
        o = to_fw(np.zeros((6, 5), dt))
        r = fastring.allreduce(to_fw(inputs[c.RANK]), op=fastring.Sum, out=o)
        c.check_close(f"{algorithm} {dt} out=other", from_fw(o), expected, bound)
        big = to_fw(np.zeros((6, 10), dt))
        view = big[:, ::2]
        fastring.allreduce(to_fw(inputs[c.RANK]), op=fastring.Sum, out=view)
        c.check_close(f"{algorithm} {dt} strided out", from_fw(big)[:, ::2], expected, bound)
        c.check_close(f"{algorithm} {dt} strided gaps", from_fw(big)[:, 1::2], np.zeros((6, 5)), 0)
        strided_in = to_fw(np.repeat(inputs[c.RANK], 2, axis=1))[:, ::2]
        got = from_fw(fastring.allreduce(strided_in, op=fastring.Sum))
        c.check_close(f"{algorithm} {dt} strided in", got, expected, bound)
    x = [c.rank_input(np.dtype(np.float64), 1000, r, 5) for r in range(N)]
    exp, bound = c.reference(x, fastring.Sum, N)
    got = from_fw(fastring.allreduce(to_fw(x[c.RANK]), op=fastring.Sum, prescale_factor=0.5, postscale_factor=3.0))
    c.check_close(f"{algorithm} scaled", got, exp * 1.5, bound * 1.5 + 1e-12)
    xi = [c.rank_input(np.dtype(np.int64), 1000, r, 6) for r in range(N)]
    expi, _ = c.reference(xi, fastring.Sum, N)
    got = from_fw(fastring.allreduce(to_fw(xi[c.RANK]), op=fastring.Sum, postscale_factor=2.0))
    c.check_close(f"{algorithm} int postscale", got, expi * 2, 0)
    # 0-d tensors are legal for allreduce
    got = from_fw(fastring.allreduce(to_fw(np.array(c.RANK + 1.0)), op=fastring.Sum))
    c.check_close(f"{algorithm} 0-d", got.reshape(1), np.array([N * (N + 1) / 2]), 0)
    if got.shape != ():
        c.fail(f"0-d result has shape {got.shape}")
c.done(f"allreduce {framework} {algorithms}")
