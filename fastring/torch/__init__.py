"""fastring.torch: a drop-in replacement for `horovod.torch`.

Change `import horovod.torch as hvd` into `import fastring.torch as hvd`; the script runs and
trains the same, over fastring's collectives.

Example:
    >>> import torch
    >>> import fastring.torch as hvd
    >>> hvd.init()
    >>> model = torch.nn.Linear(4, 2)
    >>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size())
    >>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    >>> hvd.allreduce(torch.tensor(2.0), name="metric")   # Average over ranks
    tensor(2.)
"""
from . import functions, mpi_ops, optimizer, sync_batch_norm
from .functions import *  # noqa: F401,F403 - the names of their __all__
from .mpi_ops import *  # noqa: F401,F403
from .optimizer import *  # noqa: F401,F403
from .sync_batch_norm import *  # noqa: F401,F403

__all__ = [*mpi_ops.__all__, *functions.__all__, *optimizer.__all__, *sync_batch_norm.__all__]
