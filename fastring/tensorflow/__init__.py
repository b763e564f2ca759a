"""fastring.tensorflow: a drop-in replacement for `horovod.tensorflow`, with no compiled code
against TensorFlow (nothing to rebuild when TensorFlow updates).

Change `import horovod.tensorflow as hvd` into `import fastring.tensorflow as hvd`. Collectives
take tf tensors and variables, eagerly and inside `tf.function` (one ordered graph op per
collective; not under XLA, see tensors.py); tensors cross through DLPack.

Example:
    >>> import tensorflow as tf
    >>> import fastring.tensorflow as hvd
    >>> hvd.init()
    >>> w = tf.Variable([0.5, -0.5])
    >>> hvd.broadcast_variables([w], root_rank=0)
    >>> with tf.GradientTape() as tape:
    ...     loss = tf.reduce_sum(w ** 2)
    >>> grads = hvd.DistributedGradientTape(tape).gradient(loss, [w])
    >>> float(hvd.allreduce(tf.constant(2.0), name="metric"))   # Average over ranks
    2.0
"""
from . import functions, gradient_tape, mpi_ops
from .functions import *  # noqa: F401,F403 - the names of their __all__
from .gradient_tape import *  # noqa: F401,F403
from .mpi_ops import *  # noqa: F401,F403

__all__ = [*mpi_ops.__all__, *functions.__all__, *gradient_tape.__all__]
