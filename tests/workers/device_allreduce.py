"""allreduce of device arrays (Numba's CUDA simulator, or a GPU) on N ranks.

usage: device_allreduce.py staged|aware [full|quick]

staged: MPI is told it is not CUDA-aware (segments staged through pinned host buffers);
aware: FASTRING_CUDA_AWARE_MPI=1 (device pointers handed to MPI: in the simulator, device
memory is host memory, so this runs too). The ring segment is shrunk to 64 bytes so that a
few hundred elements already take many pipelined segments.

Every result is checked against NumPy and for identity across ranks. Against the host path
on the same inputs it must agree bit for bit wherever both sum in the same order: always
under compression (both take the compressed ring), and on up to 2 ranks (a op b == b op a);
on 3 ranks small host messages take the negotiation cycle's own reduction instead.
"""
import os
import sys

import numpy as np
from numba import cuda

import _common as c

mode, scope = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else "full")
os.environ["FASTRING_CUDA_AWARE_MPI"] = "1" if mode == "aware" else "0"

import fastring  # noqa: E402
from fastring import Compression, FastringError  # noqa: E402
from fastring._core import device  # noqa: E402
from fastring.algorithms import device as device_ring  # noqa: E402

device_ring.DEVICE_SEGMENT_BYTES = 128
fastring.init()
N, R = c.SIZE, c.RANK
SAME_ORDER = N <= 2  # host and device reductions associate identically
F32, F16, I32 = np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.int32)


def to_dev(a):
    return device.to_device(a)


def from_dev(d, name):
    if not getattr(d, "__cuda_ndarray__", False):
        c.fail(f"{name}: result is {type(d).__name__}, not a device array")
    return device.to_host(d)


def check(name, got_dev, inputs, op, *, shape=None, host=None):
    """NumPy reference, identity across ranks, bitwise equality with the host result."""
    got = from_dev(got_dev, name)
    dt = inputs[R].dtype
    want_shape = inputs[R].shape if shape is None else shape
    if got.dtype != dt or got.shape != want_shape:
        c.fail(f"{name}: result {got.dtype}{got.shape}, expected {dt}{want_shape}")
    expected, bound = c.reference(inputs, op, N)
    c.check_close(name, got, expected, bound)
    c.check_identical(name, got)
    if host is not None and not np.array_equal(got.view(np.uint8), np.asarray(host).view(np.uint8)):
        c.fail(f"{name}: device result differs bitwise from the host ring's: {got[:4]} vs {host[:4]}")


OPS = [fastring.Sum, fastring.Average, fastring.Min, fastring.Max, fastring.Product]
LENGTHS = sorted({0, 1, N + 1, 37, 301})
matrix = [(dt, op, n) for dt in (F32, F16, I32) for op in OPS for n in LENGTHS]
if scope == "quick":
    matrix = [(dt, op, n) for dt, op, n in matrix if op in (fastring.Sum, fastring.Average) and n != 37]

# ---- every op x dtype x length, synchronous
for dt, op, n in matrix:
    seed = n * 7 + int(op)
    inputs = [c.rank_input(dt, n, r, seed) for r in range(N)]
    name = f"{mode} {dt} {op.name} n={n}"
    d = to_dev(inputs[R])
    got = fastring.allreduce(d, op=op)
    c.check_close(name + " input untouched", d.copy_to_host(), inputs[R], 0)
    host = fastring.allreduce(inputs[R].copy(), op=op)
    check(name, got, inputs, op, host=host if SAME_ORDER else None)

# ---- asynchronous: several requests (and a grouped one) fuse into one device buffer
shapes = [(5,), (0,), (3, 4), (N + 2,), (1,)]
inputs = {k: [c.rank_input(F32, s, r, 40 + k) for r in range(N)] for k, s in enumerate(shapes)}
handles = [fastring.allreduce_async(to_dev(inputs[k][R]), op=fastring.Sum, name=f"fused.{k}")
           for k in range(len(shapes))]
g_inputs = [[c.rank_input(F32, 6, r, 60 + j) for r in range(N)] for j in range(3)]
grouped = fastring.grouped_allreduce_async([to_dev(g[R]) for g in g_inputs], op=fastring.Sum,
                                           name="fused.grouped")
for k, h in enumerate(handles):
    check(f"fused.{k}", h.wait(), inputs[k], fastring.Sum)
results = grouped.wait()
if not isinstance(results, list) or len(results) != 3:
    c.fail(f"grouped returned {type(results).__name__}")
for j, res in enumerate(results):
    check(f"grouped.{j}", res, g_inputs[j], fastring.Sum)
# and the same fused on the host, bitwise
hosts = [fastring.allreduce_async(inputs[k][R].copy(), op=fastring.Sum, name=f"h.{k}")
         for k in range(len(shapes))]
again = [fastring.allreduce_async(to_dev(inputs[k][R]), op=fastring.Sum, name=f"d.{k}")
         for k in range(len(shapes))]
for k, (h, d) in enumerate(zip(hosts, again)):
    check(f"fused-vs-host.{k}", d.wait(), inputs[k], fastring.Sum, host=h.wait())

# ---- scaling, Average of large fp16 values, out=, 0-d, bfloat16
x = [c.rank_input(F32, 50, r, 5) for r in range(N)]
exp, bound = c.reference(x, fastring.Sum, N)
got = from_dev(fastring.allreduce(to_dev(x[R]), op=fastring.Sum, prescale_factor=0.5,
                                  postscale_factor=3.0), "scaled")
c.check_close("scaled", got, exp * 1.5, bound * 1.5 + 1e-6)
host = fastring.allreduce(x[R].copy(), op=fastring.Average, prescale_factor=0.5, postscale_factor=3.0)
got = from_dev(fastring.allreduce(to_dev(x[R]), op=fastring.Average, prescale_factor=0.5,
                                  postscale_factor=3.0), "avg scaled")
if SAME_ORDER and not np.array_equal(got, host):
    c.fail(f"Average with scales differs from host: {got[:3]} vs {host[:3]}")
big = np.full(20, 60000.0, np.float16)
got = from_dev(fastring.allreduce(to_dev(big), op=fastring.Average), "fp16 60000")
if not np.all(got == np.float16(60000.0)):
    c.fail(f"Average of 60000 in fp16 gave {got[:3]}")
xi = [c.rank_input(I32, 30, r, 6) for r in range(N)]
check("int Average", fastring.allreduce(to_dev(xi[R]), op=fastring.Average), xi, fastring.Average)
# integer Average at the limits of each dtype: the exact mean, never a wrapped sum, and the
# host path's bits; then a grouped one (one fused batch) with a postscale
for dt in (np.uint8, np.int8, np.int32, np.int64):
    info = np.iinfo(dt)
    for value in (info.max, info.min):
        check(f"int Average of {np.dtype(dt).name} {value}",
              fastring.allreduce(to_dev(np.full(9, value, dt)), op=fastring.Average),
              [np.full(9, value, dt)] * N, fastring.Average)
    rng = np.random.default_rng([8, np.dtype(dt).itemsize])
    mixed = [rng.integers(info.min, info.max, 40, dtype=dt, endpoint=True) for _ in range(N)]
    check(f"int Average of mixed {np.dtype(dt).name}", fastring.allreduce(to_dev(mixed[R]), op=fastring.Average),
          mixed, fastring.Average, host=fastring.allreduce(mixed[R].copy(), op=fastring.Average))
big8 = [np.full(5, 120, np.int8), np.arange(7, dtype=np.int8) * 18]
got = fastring.grouped_allreduce([to_dev(b) for b in big8], op=fastring.Average, postscale_factor=0.5)
for k, (g, b) in enumerate(zip(got, big8)):
    c.check_close(f"grouped int Average {k}", from_dev(g, "grouped int Average"),
                  (b.astype(np.int64) // 2).astype(np.int8), 0)
got = from_dev(fastring.allreduce(to_dev(xi[R]), op=fastring.Sum, postscale_factor=2.0), "int post")
c.check_close("int post", got, c.reference(xi, fastring.Sum, N)[0] * 2, 0)

m = [c.rank_input(F32, (4, 5), r, 7) for r in range(N)]
d = to_dev(m[R])
r = fastring.allreduce(d, op=fastring.Sum, out=d)
if r is not d:
    c.fail("out=tensor returned another object")
check("in place", d, m, fastring.Sum)
o = cuda.to_device(np.zeros((4, 5), np.float32))
fastring.allreduce(to_dev(m[R]), op=fastring.Sum, out=o)
check("out=other", o, m, fastring.Sum)
got = from_dev(fastring.allreduce(cuda.to_device(np.array(R + 1.0)), op=fastring.Sum), "0-d")
if got.shape != () or got != N * (N + 1) / 2:
    c.fail(f"0-d: {got!r}")

b = [c.rank_input(c.BF16, 40, r, 8) for r in range(N)]
for op in (fastring.Sum, fastring.Average, fastring.Max):
    check(f"bf16 {op.name}", fastring.allreduce(to_dev(b[R]), op=op), b, op,
          host=fastring.allreduce(b[R].copy(), op=op) if SAME_ORDER else None)

# ---- compression on the device: the host's compressed ring, bit for bit
COMPRESSED = [(dt, op, n) for dt in (F32, F16, c.BF16, np.dtype(np.float64))
              for op, n in ((fastring.Average, 45), (fastring.Sum, 1 + 44 * (dt == F32)))] + \
             [(F32, fastring.Max, 45), (F16, fastring.Sum, 0)]
for comp in (Compression.fp16, Compression.bf16):
    for dt, op, n in COMPRESSED:
        xs = [(np.random.default_rng([n, r]).standard_normal(n) * 100).astype(dt) for r in range(N)]
        name = f"{comp} {dt} {op.name} n={n}"
        got = from_dev(fastring.allreduce(to_dev(xs[R]), op=op, compression=comp, prescale_factor=0.5), name)
        host = fastring.allreduce(xs[R].copy(), op=op, compression=comp, prescale_factor=0.5)
        same_bits = np.array_equal(got.view(np.uint8), host.view(np.uint8))
        if got.dtype != dt or got.shape != (n,) or not same_bits:
            c.fail(f"{name}: device {got[:3]} != host {host[:3]}")
        c.check_identical(name, got)
for comp in (Compression.fp16_ef, Compression.bf16_ef):  # residuals kept per name, on the device
    xs = [(np.random.default_rng([3, r]).standard_normal(33) / 3).astype(np.float32) for r in range(N)]
    for step in range(3):
        got = from_dev(fastring.allreduce(to_dev(xs[R]), op=fastring.Sum, compression=comp,
                                          name=f"ef.{comp}"), "ef")
        host = fastring.allreduce(xs[R].copy(), op=fastring.Sum, compression=comp, name=f"efh.{comp}")
        if not np.array_equal(got, host):
            c.fail(f"{comp} step {step}: device {got[:3]} != host {host[:3]}")
ints = fastring.allreduce(to_dev(xi[R]), op=fastring.Sum, compression=Compression.fp16)
check("int compressed stays exact", ints, xi, fastring.Sum)


# ---- a foreign __cuda_array_interface__ exporter (stand-in for CuPy and the like)
class Foreign:
    """Exports device memory only through __cuda_array_interface__ (in the simulator the
    "device" memory is the NumPy array's)."""

    def __init__(self, dev):
        self.dev = dev

    @property
    def __cuda_array_interface__(self):
        a = self.dev._ary if hasattr(self.dev, "_ary") else None
        if a is None:
            return self.dev.__cuda_array_interface__
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                "version": 3, "strides": None, "stream": None}


f = [c.rank_input(F32, 9, r, 9) for r in range(N)]
fd = Foreign(to_dev(f[R]))
if not device.is_device_tensor(fd):
    c.fail("a __cuda_array_interface__ exporter is not detected as a device tensor")
check("foreign", fastring.allreduce(fd, op=fastring.Sum), f, fastring.Sum)
fastring.allreduce(fd, op=fastring.Sum, out=fd)
check("foreign in place", fd.dev, f, fastring.Sum)

# ---- a device/host mismatch under one name is an error on every rank, and the next works
try:
    t = to_dev(np.ones(4, np.float32)) if R == 0 else np.ones(4, np.float32)
    fastring.allreduce(t, name="mixed")
    if N > 1:
        c.fail("device on rank 0, host elsewhere: no error")
except FastringError as e:
    if "device" not in str(e):
        c.fail(f"mismatch message does not name the device: {e}")
check("after mismatch", fastring.allreduce(to_dev(f[R]), op=fastring.Sum), f, fastring.Sum)
c.done(f"device allreduce {mode} {scope}")
