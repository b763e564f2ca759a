"""The shared segment when the ranks' own affinity masks disagree about whether ranks outnumber
the cores: the last rank pins itself to one core before init, so that it alone counts two
ranks on one core. Whether a large allreduce is pipelined depends on that, and must be the
same on every rank, or the ranks would run different protocols on the same segment; a
pipeline-sized allreduce must then come out right on every rank."""
import os

import numpy as np
from mpi4py import MPI

import _common as c

if MPI.COMM_WORLD.Get_rank() == MPI.COMM_WORLD.Get_size() - 1:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})

import fastring  # noqa: E402 - after the affinity is set
from fastring._core.config import SHM_TILE_BYTES  # noqa: E402
from fastring._core.runtime import runtime  # noqa: E402

fastring.init()
shm = runtime().shm
c.CHECKS.check(shm is not None, "the segment is mapped")
c.CHECKS.check(not shm.pipelined, f"rank {c.RANK}: pipelined although a rank counts more ranks than cores")
inputs = [c.rank_input(np.dtype(np.int64), (2 * SHM_TILE_BYTES // 8 + 333,), r, 70) for r in range(c.SIZE)]
c.check_close("pipeline-sized allreduce", fastring.allreduce(inputs[c.RANK], op=fastring.Sum, name="big"),
              np.sum(inputs, axis=0), 0)
c.done("shm affinity")
