"""horovod.tensorflow.DistributedGradientTape on fastring: a tf.GradientTape whose `gradient()`
returns the gradients averaged (by `op`) over all ranks.

The wrapper delegates every method to the tape it wraps (TF's public GradientTape API only,
no private attributes), so it may wrap a tape after recording, as Horovod scripts do, or be
entered itself. All dense gradients of one `gradient()` call are reduced together: one fused
allreduce per dtype, started at once and waited for together, in one Python call eagerly or one
graph op inside `tf.function`. `tf.IndexedSlices` gradients are gathered as Horovod does
(values and indices from every rank), or reduced as dense tensors with `sparse_as_dense=True`.
"""
from __future__ import annotations

import tensorflow as tf

from fastring import Compression, ReduceOp
from fastring._horovod import compressed_all, global_process_set, gradient_scaling, member_set

from .mpi_ops import Average, _reduce_graph, _sparse_allreduce

__all__ = ["DistributedGradientTape", "allreduce_gradients"]

_NAME = "DistributedGradientTape"


class _DistributedGradientTape(tf.GradientTape):
    """A tf.GradientTape (isinstance holds) that forwards to the wrapped tape and reduces the
    gradients it returns."""

    def __init__(self, tape: tf.GradientTape, compression, sparse_as_dense: bool, process_set,
                 op: ReduceOp, prescale_factor: float, postscale_factor: float):
        # GradientTape.__init__ is not run: every method is forwarded to `tape`, which holds the
        # recording.
        self._wrapped = tape
        self._compression = compression
        self._sparse_as_dense = sparse_as_dense
        self._process_set = process_set
        self._op = op
        self._scales = (prescale_factor, postscale_factor)

    def __enter__(self):
        self._wrapped.__enter__()
        return self

    def __exit__(self, *exc):
        return self._wrapped.__exit__(*exc)

    def watch(self, tensor) -> None:
        self._wrapped.watch(tensor)

    def stop_recording(self):
        return self._wrapped.stop_recording()

    def reset(self) -> None:
        self._wrapped.reset()

    def watched_variables(self):
        return self._wrapped.watched_variables()

    def jacobian(self, *args, **kwargs):
        """The wrapped tape's jacobian, this rank's only (Horovod reduces gradients only)."""
        return self._wrapped.jacobian(*args, **kwargs)

    def batch_jacobian(self, *args, **kwargs):
        """The wrapped tape's batch_jacobian, this rank's only."""
        return self._wrapped.batch_jacobian(*args, **kwargs)

    def gradient(self, target, sources, output_gradients=None,
                 unconnected_gradients=tf.UnconnectedGradients.NONE, use_generic_names: bool = False):
        """The wrapped tape's gradients, reduced over all ranks (same structure as `sources`;
        a None gradient stays None, and must be None on every rank)."""
        grads = self._wrapped.gradient(target, sources, output_gradients, unconnected_gradients)
        return tf.nest.pack_sequence_as(grads, self._reduce(tf.nest.flatten(grads, expand_composites=False)))

    def _reduce(self, grads: list) -> list:
        return allreduce_gradients(grads, self._op, self._compression, self._sparse_as_dense, *self._scales,
                                   process_set=self._process_set)


def allreduce_gradients(grads: list, op: ReduceOp = Average, compression=Compression.none,
                        sparse_as_dense: bool = False, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0, process_set=global_process_set) -> list:
    """A list of gradients reduced over the ranks of `process_set`: the dense ones together (one fused
    allreduce per dtype, in one call or graph op), `tf.IndexedSlices` gathered (or densified
    with `sparse_as_dense`), None left None. What DistributedGradientTape and
    fastring.keras' DistributedOptimizer (TensorFlow backend) run.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> [g.numpy() for g in hvd.allreduce_gradients([tf.ones(2), tf.ones(1, tf.float64)])]
        [array([1., 1.], dtype=float32), array([1.])]
    """
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    process_set = member_set(process_set)
    if process_set.size() == 1:  # nothing to reduce
        return list(grads)
    dense = [i for i, g in enumerate(grads) if g is not None and not isinstance(g, tf.IndexedSlices)]
    out = list(grads)
    if dense:
        reduced = compressed_all([grads[i] for i in dense], compression, lambda ts, c: _reduce_graph(
            ts, op, _NAME, c, prescale_factor, postscale_factor, process_set))
        for i, r in zip(dense, reduced):
            out[i] = r
    for i, g in enumerate(grads):
        if isinstance(g, tf.IndexedSlices):
            out[i] = _sparse_allreduce(g, op, f"{_NAME}.sparse.{i}", prescale_factor, postscale_factor,
                                       process_set)
    return out


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression=Compression.none, sparse_as_dense: bool = False, op=Average,
                            gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups=None,
                            process_set=global_process_set, scale_local_gradients: bool = True):
    """Wrap `gradtape` so that `gradient()` returns gradients averaged (by `op`) over the ranks
    of `process_set` (all of them by default).

    With op=Average, gradients are multiplied by 1/gradient_predivide_factor before the sum and
    by gradient_predivide_factor/size after it. `compression=Compression.fp16`/`bf16` sends
    floating gradients as 16 bits (or any Horovod-shaped compressor object). `device_*`,
    `num_groups`, `groups` and `scale_local_gradients` are accepted for Horovod compatibility:
    every gradient of a call is fused by dtype anyway, and there are no local-only variables.
    op=Adasum reduces each gradient by `fastring.adasum_allreduce`. Raises ValueError for
    gradient_predivide_factor with an op other than Average.

    Example:
        >>> import tensorflow as tf, fastring.tensorflow as hvd
        >>> hvd.init()
        >>> w = tf.Variable([1.0, 2.0])
        >>> with tf.GradientTape() as tape:
        ...     loss = tf.reduce_sum(w * w)
        >>> tape = hvd.DistributedGradientTape(tape)
        >>> tape.gradient(loss, [w])[0].numpy()   # averaged over ranks
        array([2., 4.], dtype=float32)
    """
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(f"gradtape must be a tf.GradientTape, got {type(gradtape).__name__}")
    return _DistributedGradientTape(gradtape, compression, bool(sparse_as_dense), member_set(process_set),
                                    *gradient_scaling(op, gradient_predivide_factor))
