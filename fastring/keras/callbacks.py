"""horovod.tensorflow.keras.callbacks for Keras 3 (`keras.callbacks.Callback` subclasses):
BroadcastGlobalVariablesCallback, MetricAverageCallback, LearningRateScheduleCallback and
LearningRateWarmupCallback, with Horovod's arguments and schedule."""
from __future__ import annotations

import warnings
from typing import Callable

import keras
import numpy as np

import fastring
from fastring._horovod import allgather_object

from .backend import broadcast_values, to_numpy

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback"]


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of training, overwrite every rank's model variables and optimizer state
    with `root_rank`'s, so that all ranks start from the same weights (random initialisation
    or a checkpoint restored on the root only).

    Horovod broadcasts after the first batch, when Keras 2 had created the optimizer's slots;
    Keras 3 builds the optimizer (public `optimizer.build`) before training, so this callback
    broadcasts before the first step and the first update is already identical on every rank.
    `device` is accepted for Horovod compatibility.

    Example:
        >>> import fastring.keras as hvd
        >>> callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]
    """

    def __init__(self, root_rank: int, device: str = ""):
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs=None):
        if self.broadcast_done:
            return
        optimizer = self.model.optimizer
        variables = list(self.model.variables)
        if optimizer is not None:
            if not optimizer.built:
                optimizer.build(self.model.trainable_variables)
            variables += list(optimizer.variables)
        broadcast_values(variables, self.root_rank, "BroadcastGlobalVariablesCallback")
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """At the end of every epoch, replace each numeric metric of the epoch's logs by its
    average over all ranks (float64), in place, for the callbacks after it in the list (put it
    before checkpointing or early stopping). Every rank must log the same metric names
    (ValueError on every rank naming the difference otherwise). `device` is accepted for
    Horovod compatibility.

    Example:
        >>> import fastring.keras as hvd
        >>> callbacks = [hvd.callbacks.MetricAverageCallback()]
    """

    def __init__(self, device: str = ""):
        super().__init__()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or fastring.size() == 1:
            return
        names = sorted(k for k, v in logs.items() if isinstance(v, (int, float, np.number)))
        everyone = allgather_object(names, name="MetricAverageCallback.names")
        if any(theirs != names for theirs in everyone):
            raise ValueError("MetricAverageCallback: the ranks log different metrics: "
                             + "; ".join(f"rank {r}: {n}" for r, n in enumerate(everyone)))
        if not names:
            return
        values = np.array([logs[k] for k in names], np.float64)
        averaged = fastring.allreduce(values, fastring.Average, name="MetricAverageCallback.values")
        for k, v in zip(names, averaged.tolist()):
            logs[k] = v


def _learning_rate(optimizer) -> float:
    return float(to_numpy(optimizer.learning_rate))


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's learning-rate schedule: from `start_epoch` until `end_epoch` (exclusive), the
    optimizer's learning rate is `initial_lr * multiplier(epoch)`, set at the first batch of
    each epoch (`staircase=True`) or before every batch with a fractional epoch
    (epoch + batch / steps_per_epoch). `initial_lr` None means the optimizer's rate at the
    start of training; `steps_per_epoch` None means Keras' count for the epoch. The current
    rate is logged as "lr" at the end of every epoch.

    `momentum_correction` (scaling momentum by new_lr/old_lr for the batch after a change) is
    applied where the optimizer's momentum can change between steps: Keras 3 optimizers keep
    momentum as a Python float, which a compiled (TensorFlow graph) train step has captured
    as a constant, so there it is not applied, with a warning.

    Example:
        >>> import fastring.keras as hvd
        >>> cb = hvd.callbacks.LearningRateScheduleCallback(0.1, lambda epoch: 0.5 ** epoch)
    """

    def __init__(self, initial_lr: float | None, multiplier: Callable[[float], float] | float,
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None):
        super().__init__()
        self.initial_lr = initial_lr
        self.multiplier = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0
        self.restore_momentum = None

    def on_train_begin(self, logs=None):
        optimizer = self.model.optimizer
        if not isinstance(optimizer.get_config().get("learning_rate"), (int, float)):
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, which must be "
                             "a number, not a LearningRateSchedule or a callable")
        if self.initial_lr is None:
            self.initial_lr = _learning_rate(optimizer)
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = (self.params or {}).get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} could not find the number of steps per "
                                 "epoch: pass steps_per_epoch=")
        self._momentum_adjustable = self.momentum_correction and self._can_adjust_momentum(optimizer)

    def _can_adjust_momentum(self, optimizer) -> bool:
        if not getattr(optimizer, "momentum", 0):
            return False
        if keras.backend.backend() == "tensorflow" and not self.model.run_eagerly:
            warnings.warn(f"{type(self).__name__}: momentum_correction is not applied: a compiled "
                          "TensorFlow train step holds the Keras 3 optimizer's momentum as a constant "
                          "(compile with run_eagerly=True to apply it)", stacklevel=2)
            return False
        return True

    def on_epoch_begin(self, epoch, logs=None):
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if self.current_epoch < self.start_epoch or (
                self.end_epoch is not None and self.current_epoch >= self.end_epoch):
            return
        if self.staircase:
            if batch == 0:
                self._adjust(self.current_epoch)
        else:
            self._adjust(self.current_epoch + float(batch) / self.steps_per_epoch)

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        old_lr = _learning_rate(optimizer)
        new_lr = self.initial_lr * self.multiplier(epoch)
        optimizer.learning_rate = new_lr
        if self._momentum_adjustable and old_lr:
            self.restore_momentum = optimizer.momentum
            optimizer.momentum = self.restore_momentum * new_lr / old_lr

    def on_train_batch_end(self, batch, logs=None):
        if self.restore_momentum is not None:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = _learning_rate(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Horovod's gradual warmup (Goyal et al., 2017): over the first `warmup_epochs` epochs the
    learning rate grows linearly, batch by batch, from initial_lr / size to initial_lr (the
    rate scaled for `size` ranks), reaching it at the end of the last warmup epoch.

    Example:
        >>> import fastring.keras as hvd
        >>> hvd.init()
        >>> cb = hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=2)
    """

    def __init__(self, initial_lr: float | None, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0):
        def multiplier(epoch: float) -> float:
            # Shifted by one batch so that the last batch of an epoch ends on a round value.
            epoch += 1.0 / self.steps_per_epoch
            n = fastring.size()
            return 1.0 / n * (epoch * (n - 1) / warmup_epochs + 1)
        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, logs)
        if epoch == self.end_epoch - 1 and self.verbose > 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{_learning_rate(self.model.optimizer):g}.")
