"""Algorithms: how the bytes of one collective move, over the transport and the kernels.

`registry.choose` picks the algorithm for every collective; `allreduce` holds the host
allreduce algorithms, `device` the device ring, `hierarchical` the allreduce across hosts of several ranks, `collectives` the data movement of allgather,
broadcast, alltoall and reducescatter, `base` what they share.
"""
from .allreduce import CompressedRing, InCycle, MpiNative, RecursiveDoubling, Ring
from .hierarchical import Hierarchical
from .base import Finalize, Message, Phase, Reduction, chunk_offsets, no_phase
from .registry import REGISTRY, SELECTABLE, broadcast_bytes, check_setting, choose

__all__ = ["REGISTRY", "SELECTABLE", "CompressedRing", "Hierarchical", "InCycle", "MpiNative", "RecursiveDoubling", "Ring",
           "Finalize", "Message", "Phase", "Reduction", "broadcast_bytes", "check_setting",
           "choose", "chunk_offsets", "no_phase"]
