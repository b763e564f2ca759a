"""Case lists, operand generators and NumPy references shared by the CPU and CUDA
kernel tests (tests/test_kernels.py, tests/test_kernels_cuda.py).

Everything here is plain NumPy / ml_dtypes; nothing imports a kernel.
"""
from __future__ import annotations

import numpy as np
import ml_dtypes

from fastring.kernels import KernelOp

BF16 = np.dtype(ml_dtypes.bfloat16)
F32 = np.dtype(np.float32)

DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64",
          "bool"]
FLOAT_DTYPES = ["float16", "bfloat16", "float32", "float64"]
INT_DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
OPS = list(KernelOp)
LENGTHS = [0, 1, 7, 1000, 10**5 + 3]
WIRES = ["fp16", "bf16"]
ACC_DTYPES = ["float32", "float64"]
SCALE_FACTORS = [0.5, -1.5, 3.0, 1e-3]
DIVISORS = [1, 2, 3, 7, -2]
UNSUPPORTED_DTYPES = ["complex64", "complex128", "float128" if hasattr(np, "float128") else "U3"]

# Values every float case should meet: signed zeros, infinities, NaN, subnormals of
# every format involved, and numbers that overflow fp16 / bf16 when combined.
_FLOAT_SPECIALS = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0, 2.0 ** -24,
                   -(2.0 ** -24), 3 * 2.0 ** -25, 6.0e-8, 65504.0, -65504.0, 60000.0,
                   2.0 ** -130, 1e38, -3e38, 0.5]


def dtype_of(name: str) -> np.dtype:
    return BF16 if name == "bfloat16" else np.dtype(name)


def operands(name: str, n: int, seed: int = 0, *, int_range: tuple[int, int] | None = None):
    """Two arrays of dtype ``name`` and length ``n`` (full-range integers, so sums and
    products wrap; floats mixed with special values)."""
    rng = np.random.default_rng([seed, n, DTYPES.index(name) if name in DTYPES else 99])
    dt = dtype_of(name)
    out = []
    for _ in range(2):
        if name == "bool":
            x = rng.random(n) < 0.5
        elif name in INT_DTYPES:
            info = np.iinfo(dt)
            lo, hi = int_range if int_range else (info.min, info.max)
            x = rng.integers(lo, hi, size=n, endpoint=True, dtype=dt)
        else:
            base = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 300.0, 3e4], size=n)
            if n:
                k = min(n, max(1, n // 8))
                pos = rng.choice(n, size=k, replace=False)
                base[pos] = rng.choice(_FLOAT_SPECIALS, size=k)
            with np.errstate(over="ignore"):
                x = base.astype(np.float64).astype(np.float32 if dt == BF16 else dt)
                if dt == BF16:
                    x = x.astype(BF16)
        out.append(np.ascontiguousarray(x))
    return out[0], out[1]


def reference_reduce(a: np.ndarray, b: np.ndarray, op: KernelOp) -> np.ndarray:
    """NumPy result of ``a op b`` as the kernels define it."""
    if a.dtype == np.bool_:
        return (a | b) if op in (KernelOp.SUM, KernelOp.MAX) else (a & b)
    narrow = a.dtype in (np.dtype(np.float16), BF16)
    x, y = (a.astype(F32), b.astype(F32)) if narrow else (a, b)
    fn = {KernelOp.SUM: np.add, KernelOp.MIN: np.minimum, KernelOp.MAX: np.maximum,
          KernelOp.PRODUCT: np.multiply}[op]
    with np.errstate(all="ignore"):
        r = fn(x, y)
        return r.astype(a.dtype) if narrow else r


def reference_scale(a: np.ndarray, factor: float) -> np.ndarray:
    with np.errstate(all="ignore"):
        if a.dtype.kind in "iu":
            # trunc(a * factor) in float64, wrapped modulo 2**64 with Python's exact integers
            # where NumPy's float->int64 conversion is undefined; not finite: 0
            p = (a.astype(np.float64) * factor).reshape(-1)
            out = np.zeros(p.shape, np.int64)
            inside = (p >= -2.0 ** 63) & (p < 2.0 ** 63)
            out[inside] = p[inside].astype(np.int64)
            for k in np.flatnonzero(~inside & np.isfinite(p)):
                w = int(p[k]) % 2 ** 64
                out[k] = w - 2 ** 64 if w >= 2 ** 63 else w
            return out.astype(a.dtype).reshape(a.shape)
        if a.dtype == np.float64:
            return a * factor
        r = a.astype(F32) * np.float32(factor)
        return r.astype(a.dtype)


def reference_divide(a: np.ndarray, n: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        if a.dtype.kind in "iu":
            x = a.astype(np.int64)
            if n == -1:
                return (-x).astype(a.dtype)
            q = x // n
            q += (q < 0) & (q * n != x)  # floor -> truncation toward zero
            return q.astype(a.dtype)
        if a.dtype == np.float64:
            return a / np.float64(n)
        return (a.astype(F32) / np.float32(n)).astype(a.dtype)


def wire_dtype(wire: str) -> np.dtype:
    return np.dtype(np.float16) if wire == "fp16" else BF16


def reference_encode(x: np.ndarray, wire: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        return x.astype(F32).astype(wire_dtype(wire)).view(np.uint16)


def reference_decode(bits: np.ndarray, wire: str, out_dtype=F32) -> np.ndarray:
    return bits.view(wire_dtype(wire)).astype(F32).astype(out_dtype)


def reference_accumulate(acc: np.ndarray, recv_bits: np.ndarray, wire: str, op: KernelOp):
    """(new acc, bits sent) for one fused ring step."""
    fn = {KernelOp.SUM: np.add, KernelOp.MIN: np.minimum, KernelOp.MAX: np.maximum,
          KernelOp.PRODUCT: np.multiply}[op]
    with np.errstate(all="ignore"):
        new = fn(acc, reference_decode(recv_bits, wire, acc.dtype))
    return new, reference_encode(new, wire)


def wire_inputs(n: int, seed: int = 0) -> np.ndarray:
    """float32 values that stress 16-bit rounding: exact ties, +-1 ulp around them,
    every fp16 subnormal region, overflow boundaries, NaN payloads, random bits."""
    rng = np.random.default_rng([seed, n, 7])
    halves = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(F32)
    mids = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(F32)  # exact ties
    mids_bits = mids.view(np.uint32)
    bf = np.arange(0, 0x7F80, 0x1F, dtype=np.uint32) << 16
    special_bits = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7FA12345,
                             0x7F800001, 0x477FEFFF, 0x477FF000, 0x477FFFFF, 0x47800000,
                             0x387FFFFF, 0x38800000, 0x33000000, 0x33000001, 0x32FFFFFF,
                             0x00000001, 0x80000000, 0x7F7FFFFF, 0x7F7F8000, 0x00018000,
                             0x00008000], dtype=np.uint32)
    pool = np.concatenate([halves.view(np.uint32), mids_bits, mids_bits + 1, mids_bits - 1,
                           bf, bf | 0x8000, bf | 0x8001, bf | 0x7FFF, special_bits,
                           rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)])
    pool = np.concatenate([pool, pool | 0x80000000])
    return pool[rng.integers(0, len(pool), size=n)].view(F32) if n else np.empty(0, F32)


def assert_same(got: np.ndarray, want: np.ndarray, op: KernelOp | None = None) -> None:
    """Exact comparison: integers/bools by value, floats by bit pattern with NaN
    treated as equal to NaN (any payload); MIN/MAX may differ in the sign of zero."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if got.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
        return
    with np.errstate(invalid="ignore"):  # signalling NaNs warn when widened
        g32, w32 = got.astype(np.float64), want.astype(np.float64)
    nan_g, nan_w = np.isnan(g32), np.isnan(w32)
    bad = np.flatnonzero(nan_g != nan_w)
    assert bad.size == 0, f"NaN mismatch at {bad[:5]}: got {got[bad[:5]]}, want {want[bad[:5]]}"
    keep = ~nan_g
    if op in (KernelOp.MIN, KernelOp.MAX):
        bad = np.flatnonzero(keep & (g32 != w32))
    else:
        ubits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
        bad = np.flatnonzero(keep & (got.view(ubits) != want.view(ubits)))
    assert bad.size == 0, (f"{bad.size} mismatches, first at {bad[:5]}: "
                           f"got {got[bad[:5]]}, want {want[bad[:5]]}")


# ===================================================================== the contract
# Test bodies shared by the CPU and CUDA test modules: each module subclasses
# KernelContract with a Backend, so both run exactly the same parametrised cases.

import pytest  # noqa: E402
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402


class Backend:
    """How a test module hands arrays to one kernel implementation."""

    name = "cpu"
    #: lengths above this are replaced by ``long_length`` (the CUDA simulator is slow)
    max_length: int | None = None
    long_length = 4099

    def __init__(self, kernels):
        self.k = kernels

    def length(self, n: int) -> int:
        return n if self.max_length is None or n <= self.max_length else self.long_length

    def put(self, host: np.ndarray):
        return host.copy()

    def get(self, arr) -> np.ndarray:
        return arr

    def empty(self, n: int, dtype) -> object:
        return self.put(np.zeros(n, dtype))


_SIGNED = ["int8", "int32", "int64"]
_NON_BOOL = [d for d in DTYPES if d != "bool"]
_NAN_A = [np.nan, 1.0, np.nan, np.inf, -np.inf, 0.0, -0.0, 5.0, -np.inf]
_NAN_B = [1.0, np.nan, np.nan, -np.inf, np.inf, -0.0, 0.0, np.nan, 7.0]
_PACK_LAYOUTS = {
    "none": ([], 16),
    "empty-part": ([(0, 0), (5, 3)], 8),
    "gaps": ([(0, 5), (9, 1), (12, 20), (40, 4)], 50),
    "many": ([(k * 20, k) for k in range(19)], 19 * 20),
    "long": ([(3, 1500), (1503, 2600)], 4103),
}


def _scale_operand(dtype: str, n: int) -> np.ndarray:
    # int64 inputs stay within 2**40 so trunc(x * factor) is representable.
    return operands(dtype, n, seed=1, int_range=(-2**40, 2**40) if dtype == "int64" else None)[0]


class KernelContract:
    backend: Backend

    # ----------------------------------------------------------------- reduce
    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_reduce_matches_numpy(self, dtype, op, n):
        B = self.backend
        a, b = operands(dtype, B.length(n))
        d = B.put(a)
        B.k.reduce_into(d, B.put(b), op)
        assert_same(B.get(d), reference_reduce(a, b, op), op)

    @pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
    @pytest.mark.parametrize("dtype", FLOAT_DTYPES)
    def test_reduce_nan_and_inf(self, dtype, op):
        B = self.backend
        dt = dtype_of(dtype)
        a = np.array(_NAN_A, np.float32).astype(dt)
        b = np.array(_NAN_B, np.float32).astype(dt)
        d = B.put(a)
        B.k.reduce_into(d, B.put(b), op)
        got = B.get(d)
        assert_same(got, reference_reduce(a, b, op), op)
        if op in (KernelOp.MIN, KernelOp.MAX):  # NaN on either side wins
            assert np.isnan(got.astype(np.float64)[[0, 1, 2, 7]]).all()
            assert got.astype(np.float64)[3] == (-np.inf if op == KernelOp.MIN else np.inf)

    @pytest.mark.parametrize("dtype", INT_DTYPES)
    def test_integer_sum_and_product_wrap(self, dtype):
        B = self.backend
        info = np.iinfo(dtype)
        a = np.array([info.max, info.min, info.max], dtype)
        b = np.array([1, -1 if info.min < 0 else 0, 2], dtype)
        d = B.put(a)
        B.k.reduce_into(d, B.put(b), KernelOp.SUM)
        np.testing.assert_array_equal(B.get(d), a + b)
        assert B.get(d)[0] == info.min
        d = B.put(a)
        B.k.reduce_into(d, B.put(np.array([2, 2, 3], dtype)), KernelOp.PRODUCT)
        np.testing.assert_array_equal(B.get(d), a * np.array([2, 2, 3], dtype))

    @pytest.mark.parametrize("op,expected", [
        (KernelOp.SUM, [0, 1, 1, 1]), (KernelOp.PRODUCT, [0, 0, 0, 1]),
        (KernelOp.MIN, [0, 0, 0, 1]), (KernelOp.MAX, [0, 1, 1, 1])], ids=lambda x: str(x))
    def test_bool_truth_table(self, op, expected):
        B = self.backend
        d = B.put(np.array([False, False, True, True]))
        B.k.reduce_into(d, B.put(np.array([False, True, False, True])), op)
        np.testing.assert_array_equal(B.get(d), np.array(expected, bool))

    @pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
    def test_dtype_override_reads_uint16_as_bfloat16(self, op):
        B = self.backend
        a, b = operands("bfloat16", 300, seed=3)
        d = B.put(a.view(np.uint16))
        B.k.reduce_into(d, B.put(b.view(np.uint16)), op, dtype="bfloat16")
        assert_same(B.get(d).view(BF16), reference_reduce(a, b, op), op)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def test_reduce_property_random_bits(self, data):
        """Any bit patterns (NaN payloads, subnormals, non-0/1 bools excluded)."""
        B = self.backend
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        op = data.draw(st.sampled_from(OPS), label="op")
        n = data.draw(st.integers(0, 300 if B.max_length is None else 40), label="n")
        dt = dtype_of(dtype)
        raw = data.draw(st.binary(min_size=2 * n * dt.itemsize, max_size=2 * n * dt.itemsize))
        buf = np.frombuffer(raw, np.uint8).copy()
        if dtype == "bool":
            buf &= 1
        a, b = buf.view(dt)[:n].copy(), buf.view(dt)[n:].copy()
        d = B.put(a)
        B.k.reduce_into(d, B.put(b), op)
        assert_same(B.get(d), reference_reduce(a, b, op), op)

    # ---------------------------------------------------------- scale / divide
    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("factor", SCALE_FACTORS)
    @pytest.mark.parametrize("dtype", _NON_BOOL)
    def test_scale_matches_numpy(self, dtype, factor, n):
        B = self.backend
        a = _scale_operand(dtype, B.length(n))
        d = B.put(a)
        B.k.scale_into(d, factor)
        assert_same(B.get(d), reference_scale(a, factor))

    @pytest.mark.parametrize("dtype, values, factor, expected", [
        # a float->int64 conversion of these products is undefined: x86 and GPUs differ
        ("uint64", [2**63, 2**64 - 2048, 2**63 + 4096], 1.0, [2**63, 2**64 - 2048, 2**63 + 4096]),
        ("uint64", [2**63, 2**62 + 2**61], 3.0, [2**63, 2**61]),
        ("int64", [2**40, -2**40, 3, -3], 2.0**30, [0, 0, 3 * 2**30, -3 * 2**30]),
        ("int64", [3, -3, 2**40], 2.0**62, [-2**62, 2**62, 0]),
        ("int8", [100, -100, 127], 3.0, [44, -44, 125]),
        ("int32", [5, 0, -7], float("inf"), [0, 0, 0]),
    ])
    def test_scale_wraps_out_of_range_products(self, dtype, values, factor, expected):
        B = self.backend
        d = B.put(np.array(values, dtype))
        B.k.scale_into(d, factor)
        np.testing.assert_array_equal(B.get(d), np.array(expected, dtype))

    @pytest.mark.parametrize("dtype", _SIGNED)
    def test_scale_truncates_toward_zero(self, dtype):
        B = self.backend
        d = B.put(np.array([-3, 3, -5, 5, -1, 1], dtype))
        B.k.scale_into(d, 0.5)
        np.testing.assert_array_equal(B.get(d), np.array([-1, 1, -2, 2, 0, 0], dtype))

    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("divisor", DIVISORS)
    @pytest.mark.parametrize("dtype", _NON_BOOL)
    def test_divide_matches_numpy(self, dtype, divisor, n):
        B = self.backend
        a = operands(dtype, B.length(n), seed=2)[0]
        d = B.put(a)
        B.k.divide_into(d, divisor)
        assert_same(B.get(d), reference_divide(a, divisor))

    @pytest.mark.parametrize("dtype", _SIGNED)
    def test_divide_truncates_toward_zero(self, dtype):
        B = self.backend
        lo = np.iinfo(dtype).min
        d = B.put(np.array([-7, 7, -1, 1, -8, lo], dtype))
        B.k.divide_into(d, 2)
        np.testing.assert_array_equal(B.get(d), np.array([-3, 3, 0, 0, -4, lo // 2], dtype))
        d = B.put(np.array([-7, 7, lo], dtype))
        B.k.divide_into(d, -2)
        np.testing.assert_array_equal(B.get(d), np.array([3, -3, -(lo // 2)], dtype))
        d = B.put(np.array([lo, 5], dtype))
        B.k.divide_into(d, -1)  # the one quotient that does not fit wraps instead of trapping
        np.testing.assert_array_equal(B.get(d), np.array([lo, -5], dtype))

    @pytest.mark.parametrize("dtype", ["float32", "float64"])
    def test_divide_is_true_division(self, dtype):
        B = self.backend
        a = np.random.default_rng(5).random(4000).astype(dtype) * 100
        d = B.put(a)
        B.k.divide_into(d, 3)
        got = B.get(d)
        np.testing.assert_array_equal(got, a / np.dtype(dtype).type(3))
        # The reference tells the two apart, so the check above can fail.
        assert (got != a * (np.dtype(dtype).type(1) / np.dtype(dtype).type(3))).any()

    # ------------------------------------------------------------- 16-bit wire
    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("wire", WIRES)
    def test_encode_matches_casts(self, wire, n):
        B = self.backend
        x = wire_inputs(B.length(n))
        out = B.empty(len(x), np.uint16)
        B.k.encode16(B.put(x), out, wire)
        np.testing.assert_array_equal(B.get(out), reference_encode(x, wire))

    @pytest.mark.parametrize("wire", WIRES)
    def test_decode_every_bit_pattern(self, wire):
        B = self.backend
        bits = np.arange(2**16, dtype=np.uint32).astype(np.uint16)
        out = B.empty(len(bits), np.float32)
        B.k.decode16(B.put(bits), out, wire)
        np.testing.assert_array_equal(B.get(out).view(np.uint32),
                                      reference_decode(bits, wire).view(np.uint32))

    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("wire", WIRES)
    def test_round_trip(self, wire, n):
        B = self.backend
        x = wire_inputs(B.length(n), seed=4)
        bits, back = B.empty(len(x), np.uint16), B.empty(len(x), np.float32)
        B.k.encode16(B.put(x), bits, wire)
        B.k.decode16(bits, back, wire)
        with np.errstate(all="ignore"):
            want = x.astype(wire_dtype(wire)).astype(np.float32)
        assert_same(B.get(back), want)

    @pytest.mark.parametrize("wire", WIRES)
    def test_float64_source_and_destination(self, wire):
        B = self.backend
        x64 = wire_inputs(5000, seed=6).astype(np.float64)
        x64[::7] += 1e-12  # bits below float32 precision: float64 input is rounded via float32
        bits = B.empty(len(x64), np.uint16)
        B.k.encode16(B.put(x64), bits, wire)
        np.testing.assert_array_equal(B.get(bits), reference_encode(x64, wire))
        out = B.empty(len(x64), np.float64)
        B.k.decode16(bits, out, wire)
        assert_same(B.get(out), reference_decode(B.get(bits), wire, np.float64))

    @pytest.mark.parametrize("wire", WIRES)
    def test_typed_16bit_arrays_accepted(self, wire):
        B = self.backend
        x = wire_inputs(500, seed=8)
        out = B.empty(len(x), wire_dtype(wire))
        B.k.encode16(B.put(x), out, wire)
        np.testing.assert_array_equal(B.get(out).view(np.uint16), reference_encode(x, wire))
        back = B.empty(len(x), np.float32)
        B.k.decode16(out, back, wire)
        assert_same(B.get(back), reference_decode(reference_encode(x, wire), wire))

    @pytest.mark.parametrize("n", LENGTHS)
    @pytest.mark.parametrize("with_send", [True, False], ids=["send", "last-hop"])
    @pytest.mark.parametrize("acc_dtype", ACC_DTYPES)
    @pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
    @pytest.mark.parametrize("wire", WIRES)
    def test_accumulate_matches_reference(self, wire, op, acc_dtype, with_send, n):
        B = self.backend
        n = B.length(n)
        acc = operands(acc_dtype, n, seed=9)[0]
        recv = reference_encode(operands("float32", n, seed=10)[0], wire)
        want_acc, want_send = reference_accumulate(acc, recv, wire, op)
        d_acc = B.put(acc)
        send = B.empty(n, np.uint16) if with_send else None
        if with_send:
            B.k.accumulate16(d_acc, B.put(recv), send, wire, op)
            assert_same(B.get(send).view(wire_dtype(wire)), want_send.view(wire_dtype(wire)), op)
        else:
            B.k.accumulate16(d_acc, B.put(recv), None, wire, op)
        assert_same(B.get(d_acc), want_acc, op)

    # -------------------------------------------------------------- pack/unpack
    @pytest.mark.parametrize("layout", list(_PACK_LAYOUTS))
    def test_pack_unpack_round_trip(self, layout):
        B = self.backend
        spec, size = _PACK_LAYOUTS[layout]
        rng = np.random.default_rng(11)
        parts = [rng.integers(0, 256, n, dtype=np.uint8) for _, n in spec]
        offsets = [off for off, _ in spec]
        buf = B.put(np.full(size, 0xEE, np.uint8))
        B.k.pack(buf, [B.put(p) for p in parts], offsets)
        want = np.full(size, 0xEE, np.uint8)
        for p, off in zip(parts, offsets):
            want[off:off + len(p)] = p
        np.testing.assert_array_equal(B.get(buf), want)
        outs = [B.empty(len(p), np.uint8) for p in parts]
        B.k.unpack(buf, outs, offsets)
        for p, o in zip(parts, outs):
            np.testing.assert_array_equal(B.get(o), p)

    def test_pack_unpack_parts_at_odd_addresses(self):
        """Aligned offsets and lengths, parts that start one byte into an allocation."""
        B = self.backend
        src = np.arange(1, 17, dtype=np.uint8)
        whole = B.put(np.concatenate([np.zeros(1, np.uint8), src]))
        buf = B.put(np.zeros(24, np.uint8))
        B.k.pack(buf, [whole[1:9], whole[9:17]], [0, 16])
        np.testing.assert_array_equal(B.get(buf), np.concatenate([src[:8], np.zeros(8, np.uint8), src[8:]]))
        out = B.put(np.zeros(17, np.uint8))
        B.k.unpack(buf, [out[1:9]], [16])
        np.testing.assert_array_equal(B.get(out)[1:9], src[8:])

    # ------------------------------------------------------------------- errors
    @pytest.mark.parametrize("func", ["reduce_into", "scale_into", "divide_into"])
    @pytest.mark.parametrize("dtype", UNSUPPORTED_DTYPES)
    def test_unsupported_dtype_is_type_error_naming_it(self, dtype, func):
        B = self.backend
        a = B.put(np.zeros(4, dtype))
        call = {"reduce_into": lambda: B.k.reduce_into(a, B.put(np.zeros(4, dtype)),
                                                       KernelOp.SUM),
                "scale_into": lambda: B.k.scale_into(a, 2.0),
                "divide_into": lambda: B.k.divide_into(a, 2)}[func]
        with pytest.raises(TypeError, match=np.dtype(dtype).name):
            call()

    def test_length_mismatch_is_value_error(self):
        B = self.backend
        f, h = B.put(np.zeros(5, np.float32)), B.put(np.zeros(4, np.uint16))
        with pytest.raises(ValueError, match="length"):
            B.k.reduce_into(f, B.put(np.zeros(4, np.float32)), KernelOp.SUM)
        with pytest.raises(ValueError, match="length"):
            B.k.encode16(f, h, "fp16")
        with pytest.raises(ValueError, match="length"):
            B.k.decode16(h, f, "bf16")
        with pytest.raises(ValueError, match="length"):
            B.k.accumulate16(f, h, None, "fp16", KernelOp.SUM)
        with pytest.raises(ValueError, match="length"):
            B.k.accumulate16(f, B.put(np.zeros(5, np.uint16)), h, "fp16", KernelOp.SUM)

    @pytest.mark.parametrize("pair", [("float32", "float64"), ("float16", "bfloat16"),
                                      ("bfloat16", "uint16"), ("bool", "uint8")])
    def test_dtype_mismatch_is_value_error(self, pair):
        B = self.backend
        a, b = (B.put(np.zeros(4, dtype_of(p))) for p in pair)
        with pytest.raises(ValueError, match="dtype mismatch"):
            B.k.reduce_into(a, b, KernelOp.SUM)

    @pytest.mark.parametrize("op", [4, -1, "sum", None, 1.5])
    def test_unknown_op_is_value_error(self, op):
        B = self.backend
        a = B.put(np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="op"):
            B.k.reduce_into(a, B.put(np.zeros(3, np.float32)), op)
        with pytest.raises(ValueError, match="op"):
            B.k.accumulate16(a, B.put(np.zeros(3, np.uint16)), None, "fp16", op)

    def test_shape_and_layout_are_value_errors(self):
        B = self.backend
        two_d = B.put(np.zeros((2, 3), np.float32))
        with pytest.raises(ValueError, match="1-D"):
            B.k.reduce_into(two_d, B.put(np.zeros((2, 3), np.float32)), KernelOp.SUM)
        strided = B.put(np.zeros(8, np.float32))[::2]
        with pytest.raises(ValueError, match="contiguous"):
            B.k.reduce_into(strided, B.put(np.zeros(4, np.float32)), KernelOp.SUM)
        with pytest.raises(ValueError, match="contiguous"):
            B.k.scale_into(strided, 2.0)

    def test_scale_and_divide_reject_bool_and_bad_divisors(self):
        B = self.backend
        with pytest.raises(TypeError, match="bool"):
            B.k.scale_into(B.put(np.zeros(3, bool)), 2.0)
        with pytest.raises(TypeError, match="bool"):
            B.k.divide_into(B.put(np.zeros(3, bool)), 2)
        with pytest.raises(ZeroDivisionError):
            B.k.divide_into(B.put(np.ones(3, np.int32)), 0)
        with pytest.raises(TypeError, match="integer"):
            B.k.divide_into(B.put(np.ones(3, np.float32)), 2.5)

    def test_wire_argument_errors(self):
        B = self.backend
        f = B.put(np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="wire"):
            B.k.encode16(f, B.put(np.zeros(3, np.uint16)), "fp8")
        with pytest.raises(TypeError, match="float32"):
            B.k.encode16(f, B.put(np.zeros(3, np.float32)), "fp16")
        with pytest.raises(TypeError, match="bfloat16"):
            B.k.encode16(f, B.put(np.zeros(3, np.float16)), "bf16")
        with pytest.raises(TypeError, match="int32"):
            B.k.accumulate16(B.put(np.zeros(3, np.int32)), B.put(np.zeros(3, np.uint16)),
                             None, "fp16", KernelOp.SUM)
        with pytest.raises(TypeError, match="int32"):
            B.k.decode16(B.put(np.zeros(3, np.uint16)), B.put(np.zeros(3, np.int32)), "bf16")

    def test_dtype_override_checks_itemsize(self):
        B = self.backend
        a = B.put(np.zeros(3, np.float32))
        with pytest.raises(ValueError, match="bfloat16"):
            B.k.reduce_into(a, B.put(np.zeros(3, np.float32)), KernelOp.SUM, dtype="bfloat16")

    def test_pack_argument_errors(self):
        B = self.backend
        buf = B.put(np.zeros(8, np.uint8))
        part = B.put(np.ones(4, np.uint8))
        with pytest.raises(ValueError, match="does not fit"):
            B.k.pack(buf, [part], [5])
        with pytest.raises(ValueError, match="does not fit"):
            B.k.unpack(buf, [part], [-1])
        with pytest.raises(TypeError, match="uint8"):
            B.k.pack(buf, [B.put(np.ones(4, np.float32))], [0])
        with pytest.raises(ValueError, match="offsets"):
            B.k.pack(buf, [part, part], [0])
