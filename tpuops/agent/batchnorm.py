"""Batch normalization's moving statistics under gradient accumulation: one update per step, as a larger slice makes.

On a slice that takes the global batch at once, each replica's ``BatchNormalization`` normalizes with its
own batch's statistics and moves its copy of ``moving_mean`` / ``moving_variance`` once per step; the
copies are one variable synchronized on read with aggregation MEAN, so what a checkpoint holds (and
what ``CentralStorageStrategy`` assigns, through a merge) is ``momentum x m + (1 - momentum) x`` the mean
of the replicas' statistics. A smaller slice that cuts its share into ``k`` micro-batches normalizes each
micro-batch with its own statistics (the same rows a larger slice's replica would see), but left alone,
the layer would also move its statistics ``k`` times a step, decaying them by ``momentum ** k`` and
weighting the last micro-batch most; under ``CentralStorageStrategy`` the move is a merge, which
TensorFlow refuses inside the accumulation's ``tf.while_loop`` (the run crashed).

``MovingStatistics`` defers the moves instead: while a micro-batch is traced, each layer's two update
hooks (``_assign_moving_average`` with the batch's statistics, ``_assign_new_value`` with the fused
kernel's new average) record their value and update nothing; the step sums the values over the
micro-batches in the loop and, after it, makes one update per variable with their mean, through the
same hook. A mean of ``momentum x m + (1 - momentum) x s_i`` over the micro-batches is
``momentum x m + (1 - momentum) x mean(s_i)``: what the larger slice's replicas average to, up to the
order of float sums. Batch renormalization (``renorm=True``) corrects each batch by the moving
statistics it moves, which has no per-step equivalent: a model using it cannot accumulate (``refusal``).
"""

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import tensorflow as tf


def _normalizations(model: Any) -> List[Any]:
    """The model's Keras batch normalization layers (any layer with the moving statistics and both hooks)."""
    return [layer for layer in model.submodules
            if all(hasattr(layer, name) for name in ("moving_mean", "moving_variance", "_assign_moving_average",
                                                     "_assign_new_value"))]


def refusal(model: Any, entry_point: str, accumulation: int) -> Optional[str]:
    """Why ``model`` cannot accumulate ``accumulation`` micro-batches (one line), or None when it can."""
    renormalized = [layer.name for layer in _normalizations(model) if getattr(layer, "renorm", False)]
    if accumulation == 1 or not renormalized:
        return None
    return (f"the model from {entry_point} uses batch renormalization (renorm=True in {', '.join(renormalized)}), "
            f"which corrects every batch by the statistics it moves, so it cannot accumulate {accumulation} "
            "micro-batches into one step; use renorm=False, or run on a slice that takes the global batch at once")


class MovingStatistics:
    """The moving statistics of a model's batch normalizations, updated once per accumulated step (module docstring).

    Used while ``Steps._accumulated`` is traced: ``zeros`` are the loop's initial sums, ``deferred`` wraps a
    micro-batch's forward pass, ``add`` adds what it recorded to the sums, ``update`` makes the step's one update.
    """

    def __init__(self, model: Any) -> None:
        self._layers = _normalizations(model)
        self._variables = [(layer, variable) for layer in self._layers
                           for variable in (layer.moving_mean, layer.moving_variance)]
        self._recorded: Dict[int, Tuple[str, tf.Tensor]] = {}  # id(variable) -> (hook, value), during one trace

    def zeros(self) -> List[tf.Tensor]:
        return [tf.zeros(variable.shape, variable.dtype) for _, variable in self._variables]

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """While inside: the layers' updates are recorded, not applied."""
        def record(hook: str) -> Any:
            def hooked(variable: Any, value: Any, *_: Any) -> Any:
                self._recorded[id(variable)] = (hook, tf.cast(value, variable.dtype))
                return variable
            return hooked

        self._recorded = {}
        for layer in self._layers:
            layer._assign_moving_average = record("_assign_moving_average")
            layer._assign_new_value = record("_assign_new_value")
        try:
            yield
        finally:
            for layer in self._layers:
                del layer._assign_moving_average, layer._assign_new_value  # the class's own methods again

    def add(self, sums: List[tf.Tensor]) -> List[tf.Tensor]:
        """``sums`` plus the values the last ``deferred`` pass recorded (a variable it did not move adds 0)."""
        return [total + self._recorded[id(variable)][1] if id(variable) in self._recorded else total
                for total, (_, variable) in zip(sums, self._variables)]

    def update(self, sums: List[tf.Tensor], count: int) -> None:
        """One update of each moved variable with the mean of its ``count`` micro-batches' values."""
        for total, (layer, variable) in zip(sums, self._variables):
            if id(variable) not in self._recorded:
                continue
            hook, _ = self._recorded[id(variable)]
            mean = total / count
            if hook == "_assign_new_value":
                layer._assign_new_value(variable, mean)
            else:
                layer._assign_moving_average(variable, mean, layer.momentum, None)
