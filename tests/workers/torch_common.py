"""Helpers shared by the fastring.torch workers (not a worker itself): conversions between
torch and NumPy, exact and approximate checks, expected errors, and small float64 models whose
full-batch reference every rank can compute locally."""
from __future__ import annotations

import numpy as np
import torch

import _common as c
import fastring.torch as hvd

N, R = c.SIZE, c.RANK
to_t, from_t = c.converters("torch")
TORCH_DTYPES = {np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
                np.dtype(np.int32): torch.int32, np.dtype(np.int64): torch.int64,
                np.dtype(np.float16): torch.float16, c.BF16: torch.bfloat16,
                np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64,
                np.dtype(np.bool_): torch.bool}


def same(name: str, got: torch.Tensor, expected) -> None:
    """`got` is a torch tensor with exactly the values, dtype and shape of `expected` (numpy
    array or torch tensor)."""
    if not isinstance(got, torch.Tensor):
        c.fail(f"{name}: result is a {type(got).__name__}, not a torch.Tensor")
    expected = from_t(expected) if isinstance(expected, torch.Tensor) else np.asarray(expected)
    got_np = from_t(got)
    if got_np.dtype != expected.dtype or got_np.shape != expected.shape:
        c.fail(f"{name}: result {got_np.dtype}{got_np.shape}, expected {expected.dtype}{expected.shape}")
    c.check_close(name, got_np, expected, 0)


def close(name: str, got: torch.Tensor, expected, tol: float) -> None:
    err = (got.detach().double() - torch.as_tensor(expected).double()).abs().max().item() if got.numel() else 0.0
    if not err <= tol:
        c.fail(f"{name}: max error {err} > {tol}\ngot {got}\nexpected {expected}")


def identical(name: str, t: torch.Tensor) -> None:
    c.check_identical(name, from_t(t.detach().contiguous()))


def expect_error(name: str, call, error, *words) -> None:
    try:
        call()
    except error as e:
        missing = [w for w in words if w not in str(e)]
        if missing:
            c.fail(f"{name}: {error.__name__} does not mention {missing}: {e}")
        return
    except Exception as e:  # noqa: BLE001
        c.fail(f"{name}: expected {error.__name__}, got {type(e).__name__}: {e}")
    c.fail(f"{name}: no {error.__name__}")


def regression_data(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 6, generator=g, dtype=torch.float64)
    return x, torch.randn(rows, 3, generator=g, dtype=torch.float64)


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in params])


class HalfCompressor:
    """A user-written compressor in Horovod's shape (a class with static compress/decompress),
    counting its calls."""
    calls = 0

    @staticmethod
    def compress(tensor):
        HalfCompressor.calls += 1
        return tensor.to(torch.float16), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor.to(ctx)


hvd.init()
