"""Device (CUDA) tensors: detection, requests and their reduction. Placeholder until the GPU
path lands: host tensors never reach it."""
from __future__ import annotations


def is_device_tensor(tensor) -> bool:
    """True for a tensor that lives in GPU memory (torch.cuda, CuPy, Numba device arrays)."""
    is_cuda = getattr(tensor, "is_cuda", None)
    return bool(is_cuda) if is_cuda is not None else hasattr(tensor, "__cuda_array_interface__")


def allreduce_request(rt, kind, tensors, outs, op, name, compressor, prescale, postscale, grouped):
    raise NotImplementedError("allreduce of device (CUDA) tensors is not implemented yet; "
                              "move the tensor to the host first")


def reduce_batch(engine, batch) -> None:
    raise NotImplementedError("device batches are not implemented yet")
