"""Algorithms: how the bytes of one collective move, each over the transport and the kernels.

`choose` picks an allreduce algorithm; `device.reduce_batch` runs the device ring.
"""
from . import device
from .allreduce import ALGORITHMS, CompressedRing, MpiNative, RecursiveDoubling, Ring, SegmentChooser, choose
from .base import Finalize, Phase, chunk_offsets, no_phase

__all__ = ["ALGORITHMS", "CompressedRing", "MpiNative", "RecursiveDoubling", "Ring", "SegmentChooser",
           "choose", "chunk_offsets", "device", "Finalize", "Phase", "no_phase"]
