"""TensorFlow tensors in and out of fastring's core, eagerly and inside `tf.function`.

Eager tensors and variables cross through DLPack capsules (`tf.experimental.dlpack`): TF's
eager tensors have no `__dlpack__` method, so the adapter registered here for module
"tensorflow" turns a capsule into a numpy view, and a numpy result back into a tensor, with no
copy on either side (bfloat16, which numpy's DLPack importer does not know, crosses as int16
bits and is relabelled: `tf.bitcast` shares the buffer).

Inside a graph (`tf.function`, Keras' compiled train step) a collective becomes one
`tf.numpy_function` op: its callback receives numpy views of the op's input tensors and hands
numpy results back, which is exactly what the core takes and gives, so no conversion runs on
the way. (`tf.py_function` would wrap every input in an EagerTensor and need the eager
machinery inside the callback, for nothing here; neither is differentiable by TF, so the
gradients come from `tf.custom_gradient` in mpi_ops.)

Every rank must run the same collectives in the same order. TF runs independent ops of a graph
in parallel and prunes ops whose results nobody uses; so each collective op is stateful (never
pruned: tf.function runs every stateful op) and carries a control dependency on the previous
collective op of its graph, which makes a graph's collectives run one after another in program
order. XLA cannot compile a Python callback: a collective in an XLA-compiled function
(`tf.function(jit_compile=True)`, Keras' `jit_compile=True`) is refused while tracing, with the
setting to change, rather than failing later inside the compiler.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

import fastring

BFLOAT16 = np.dtype(tf.bfloat16.as_numpy_dtype)
_to_dlpack = tf.experimental.dlpack.to_dlpack
_from_dlpack = tf.experimental.dlpack.from_dlpack

XLA_UNSUPPORTED = ("fastring's TensorFlow collectives run as Python callbacks, which XLA cannot "
                   "compile: call them from a tf.function without jit_compile=True, and compile "
                   "Keras models with model.compile(..., jit_compile=False) (Keras' default "
                   "jit_compile='auto' picks XLA when a GPU is visible)")


class _Capsule:
    """numpy.from_dlpack takes an exporter, not a capsule: this one hands over TF's capsule of
    host memory."""

    __slots__ = ("capsule",)

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, stream=None, **unused):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def as_tensor(value) -> tf.Tensor:
    """A variable's value, or the value itself as a tensor (numpy, Python numbers)."""
    if isinstance(value, tf.Variable):
        return value.read_value()
    return value if isinstance(value, tf.Tensor) else tf.convert_to_tensor(value)


def to_array(tensor, what: str) -> np.ndarray:
    """A numpy view of an eager tensor's (or a variable's) host memory."""
    if not tf.executing_eagerly() and tf.is_symbolic_tensor(as_tensor(tensor)):
        raise TypeError(f"{what} is a symbolic tensor of a tf.function graph: call the "
                        "collective through fastring.tensorflow, which runs it inside the graph")
    tensor = as_tensor(tensor)
    if "CPU" not in (tensor.device or "CPU").upper():
        # A tensor on an accelerator: TF copies it to the host (no device collectives here yet).
        with tf.device("CPU:0"):
            tensor = tf.identity(tensor)
    if tensor.dtype == tf.bfloat16:
        return np.from_dlpack(_Capsule(_to_dlpack(tf.bitcast(tensor, tf.int16)))).view(BFLOAT16)
    try:
        return np.from_dlpack(_Capsule(_to_dlpack(tensor)))
    except (BufferError, TypeError, RuntimeError, ValueError, tf.errors.InvalidArgumentError) as e:
        raise TypeError(f"{what} of TensorFlow dtype {tensor.dtype.name} cannot be read as an "
                        f"array: {e}") from None


# TensorFlow's kernels assume buffers aligned for Eigen's widest vectors (EIGEN_MAX_ALIGN_BYTES,
# 64 on AVX-512 builds) and abort the process on a misaligned one, which from_dlpack accepts.
TF_ALIGNMENT = 64


def to_tensor(array: np.ndarray) -> tf.Tensor:
    """`array` as an eager tensor sharing its memory, or a copy where TensorFlow cannot use the
    memory: a misaligned buffer, a read-only array (DLPack cannot mark it)."""
    if array.ctypes.data % TF_ALIGNMENT == 0:
        try:
            if array.dtype == BFLOAT16:
                return tf.bitcast(_from_dlpack(array.view(np.int16).__dlpack__()), tf.bfloat16)
            return _from_dlpack(array.__dlpack__())
        except (BufferError, TypeError, tf.errors.InvalidArgumentError):
            pass
    return tf.convert_to_tensor(array)


fastring.register_tensor_adapter("tensorflow", fastring.TensorAdapter(
    to_array, lambda template, array: to_tensor(array)))


# ----------------------------------------------------------------- graph mode
# graph -> the output of its last collective op, which the next one waits for
_LAST_COLLECTIVE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


try:  # TF's own test for "this graph is being traced for XLA" (tf.function(jit_compile=True)
    # enters an XLA context while it traces); without it, XLA's compile error names PyFunc.
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - a TensorFlow that moved it
    def _in_xla(graph) -> bool:
        return False


def graph_call(fn: Callable[..., list], inputs: Sequence[tf.Tensor], dtypes: Sequence[tf.DType],
               shapes: Sequence, op_name: str) -> list[tf.Tensor]:
    """The outputs of one stateful `tf.numpy_function(fn)` op of the current graph, ordered
    after the graph's previous collective and given the static `shapes` (None: unknown
    dimension), so that the graph's shape inference goes on past it."""
    graph = tf.compat.v1.get_default_graph()
    if _in_xla(graph):
        raise NotImplementedError(XLA_UNSUPPORTED)
    previous = _LAST_COLLECTIVE.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        outputs = tf.numpy_function(lambda *arrays: list(fn(*arrays)), list(inputs), list(dtypes),
                                    stateful=True, name=op_name)
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    for output, shape in zip(outputs, shapes):
        output.set_shape(shape)
    if outputs:
        _LAST_COLLECTIVE[graph] = outputs[0].op
    return outputs


# Unnamed collectives of graph ops, numbered in the order they run. The core numbers unnamed
# calls per thread, and TF runs graph ops on whichever thread of its pool is free, which differs
# between ranks; graph ops run one at a time in program order (graph_call), so one sequence
# for all of them pairs them up on every rank.
_graph_numbers = itertools.count()


def run(fn: Callable[..., list], inputs: Sequence, dtypes: Sequence[tf.DType], shapes: Sequence,
        kind: str, name: str | None) -> list[tf.Tensor]:
    """fn(name, *arrays) -> list of arrays, run on `inputs` eagerly (views through DLPack,
    results as tensors) or as one graph op (graph_call), whichever the caller is in. `name`
    is the collective's name, None for the core's numbering of unnamed calls (eager) or this
    module's (graph)."""
    if tf.executing_eagerly():
        return [to_tensor(np.asarray(r)) for r in fn(name, *[to_array(t, "tensor") for t in inputs])]

    def op(*arrays):
        return fn(name if name is not None else f"{kind}.graph.{next(_graph_numbers)}", *arrays)
    op_name = "Fastring" + "".join(w.capitalize() for w in kind.split("_"))
    return graph_call(op, [as_tensor(t) for t in inputs], dtypes, shapes, op_name)
