"""How the state of a user's `Metric` subclass combines: what its code does with rows of
sample weight 0, and whether two replicas' states summed are one device's state.

Keras's own metrics keep sums over rows (totals, counts, confusion counts) and weigh each
row by its sample weight. A subclass's `update_state` is the user's code, and two habits
in it break what the engines do with a metric's state:

* it ignores `sample_weight` (or takes none): the padding rows of a batch that does not
  divide, weighted 0, count in it;
* its state is not a sum over rows (a running maximum, a value per batch): where each
  replica runs its own step the engines sum the replicas' states (TensorFlow's
  sync-on-read variables, the torch engine's all-reduce), which is then not one device's
  state - a maximum summed over 3 replicas read 2.5x one device's.

Neither can be read from the code, so each is tried, once per metric object, before any
step, on a few rows of made-up targets and outputs shaped like the model's: on Keras 3
with its public stateless API (`stateless_reset_state`, `stateless_update_state`,
`stateless_result`, 3.0 - 3.15), nothing assigned to the metric; on tf.keras / tf_keras
(no stateless API) eagerly on a fresh object of its class, made on a thread outside any
strategy's scope (public `from_config`, `reset_state`, `update_state`, `result`,
`assign`; a class that cannot be made from its config is not tried). The state of the whole
rows is compared with two halves' states summed, and rows with two padding copies of
weight 0 with the rows alone. Where the metric cannot be run on such rows (it wants
integer labels, it raises) or gives no finite value, nothing is told and the metric is
updated as before.
"""

from __future__ import annotations

import inspect
from typing import Any, List, Optional, Sequence, Tuple

from kerasmgpu.adapters.aside import outside_scopes
from kerasmgpu.adapters.metric_values import Spec, leaves
from kerasmgpu.env.versions import frameworks_own

ROWS = 6  # two halves of 3; padded with copies of its first 2 rows, as batching pads
PADDING = 2
_ATTR = "_kerasmgpu_state_rules"
_TIMEOUT_S = 60.0


def user_metrics(adapter: Any, compile_args: Any) -> List[Any]:
    """The compile metrics that are objects of the user's own `Metric` subclasses."""
    keras_metric = adapter.keras.metrics.Metric
    return [m for m in leaves([compile_args.get("metrics"), compile_args.get("weighted_metrics")])
            if isinstance(m, keras_metric) and not frameworks_own(type(m))]


def takes_sample_weight(metric: Any) -> bool:
    """Whether the metric's class declares `sample_weight` in update_state, as the step
    reads it to weigh padding rows 0 (`steps.masked_update`; tf.keras wraps the bound
    method on each instance, hiding its signature)."""
    try:
        params = inspect.signature(type(metric).update_state).parameters
    except (TypeError, ValueError):
        return True
    return "sample_weight" in params


def rules(adapter: Any, compile_args: Any, specs: Sequence[Spec]
          ) -> Tuple[List[str], List[str]]:
    """The user's compile metrics that count rows of sample weight 0 (`blind`) and those
    whose state is not a sum over rows (`unsummed`), each in words."""
    blind: List[str] = []
    unsummed: List[str] = []
    for metric in user_metrics(adapter, compile_args):
        name = getattr(metric, "name", None) or type(metric).__name__
        told = metric.__dict__.get(_ATTR)
        if told is None:
            told = _tried(adapter, metric, specs)
            if specs:  # (none: a model without declared outputs, tried at its feed)
                metric.__dict__[_ATTR] = told
        counts_padding, not_summed = told
        if not takes_sample_weight(metric):
            blind.append(f"metric {name!r} takes no sample_weight")
        elif counts_padding:
            blind.append(f"metric {name!r} counts rows whose sample_weight is 0")
        if not_summed:
            unsummed.append(f"metric {name!r} (its state is not a sum over rows)")
    return blind, unsummed


def _tried(adapter: Any, metric: Any, specs: Sequence[Spec]) -> Tuple[bool, bool]:
    """(counts rows of weight 0, state not a sum) for the first spec the metric runs on;
    (False, False) where it runs on none."""
    if adapter.keras3:
        return _tried_with(adapter, metric, _Stateless(adapter, metric), specs)
    # tf.keras: outside any strategy's scope (`aside`): the fresh object's variables are
    # then plain ones, which take eager updates.
    return outside_scopes(lambda: _tried_with(adapter, metric, _Assigning(metric), specs),
                          _TIMEOUT_S, "metric", lambda: (False, False))


def _tried_with(adapter: Any, metric: Any, runner: Any, specs: Sequence[Spec]
                ) -> Tuple[bool, bool]:
    if not runner.usable():
        return False, False
    for spec in specs:
        found = _try(adapter, metric, runner, spec)
        if found is not None:
            return found
    return False, False


class _Stateless:
    """Keras 3: the public stateless API; nothing is assigned to the metric."""

    def __init__(self, adapter: Any, metric: Any) -> None:
        self.ops, self.metric = adapter.keras.ops, metric

    def usable(self) -> bool:
        return all(callable(getattr(self.metric, name, None)) for name in (
            "stateless_reset_state", "stateless_update_state", "stateless_result"))

    def _numpy(self, values: Any) -> List[Any]:
        import numpy as np

        return [np.asarray(self.ops.convert_to_numpy(v)) for v in values]

    def start(self) -> List[Any]:
        return self._numpy(self.metric.stateless_reset_state())

    def update(self, state: List[Any], *args: Any, **kwargs: Any) -> List[Any]:
        tensor = self.ops.convert_to_tensor
        return self._numpy(self.metric.stateless_update_state(
            [tensor(v) for v in state], *[tensor(a) for a in args],
            **{k: tensor(v) for k, v in kwargs.items()}))

    def result(self, state: List[Any]) -> Any:
        tensor = self.ops.convert_to_tensor
        return leaves(self.metric.stateless_result([tensor(v) for v in state]))

    def restore(self) -> None:
        pass


class _Assigning:
    """tf.keras / tf_keras (no stateless API): run eagerly on a fresh object of the
    metric's class (`from_config(get_config())`, public) - the parallel model's own
    metrics hold variables laid out for the strategy, which take no eager assign - and
    nothing of the user's metric is touched. A class that cannot be made so is not
    tried."""

    def __init__(self, metric: Any) -> None:
        self.metric: Any = None
        try:
            import tensorflow as tf

            if tf.executing_eagerly():
                self.metric = type(metric).from_config(metric.get_config())
        except Exception:  # a class that takes other arguments than its config's
            self.metric = None

    def usable(self) -> bool:
        variables = list(getattr(self.metric, "variables", None) or [])
        return bool(variables) and all(
            hasattr(v, "assign") and hasattr(v, "numpy") for v in variables)

    def _assign(self, state: List[Any]) -> None:
        for variable, value in zip(self.metric.variables, state):
            variable.assign(value)

    def start(self) -> List[Any]:
        self.metric.reset_state()
        return [v.numpy() for v in self.metric.variables]

    def update(self, state: List[Any], *args: Any, **kwargs: Any) -> List[Any]:
        self._assign(state)
        self.metric.update_state(*args, **kwargs)
        return [v.numpy() for v in self.metric.variables]

    def result(self, state: List[Any]) -> Any:
        self._assign(state)
        return leaves(self.metric.result())

    def restore(self) -> None:
        pass


def _try(adapter: Any, metric: Any, runner: Any, spec: Spec) -> Optional[Tuple[bool, bool]]:
    import numpy as np

    shape, _ = spec
    dims = tuple(2 if d is None else int(d) for d in shape[1:])
    rng = np.random.default_rng(0)
    y_true = rng.uniform(size=(ROWS, *dims)).astype("float32")
    y_pred = rng.uniform(size=(ROWS, *dims)).astype("float32")

    def state(start: List[Any], rows: Sequence[int], weight: Any = None) -> List[Any]:
        index = np.asarray(rows)
        kwargs = {} if weight is None else {"sample_weight": _shaped(
            np.asarray(weight, "float32"), len(dims) + 1, dims,
            adapter.weights_follow_output_rank)}
        return list(runner.update(start, y_true[index], y_pred[index], **kwargs))

    def result(variables: List[Any]) -> Any:
        return np.concatenate([np.ravel(np.asarray(v, "float64"))
                               for v in runner.result(variables)])

    try:
        start = runner.start()
        real = list(range(ROWS))
        whole = result(state(start, real))
        half, rest = state(start, real[:ROWS // 2]), state(start, real[ROWS // 2:])
        summed = result([a + b - s for a, b, s in zip(half, rest, start)])
        padded = plain = whole
        if takes_sample_weight(metric):
            plain = result(state(start, real, [1.0] * ROWS))
            padded = result(state(start, real + real[:PADDING], [1.0] * ROWS + [0.0] * PADDING))
    except Exception:  # not runnable on these rows: nothing to tell
        return None
    finally:
        runner.restore()
    values = [whole, summed, plain, padded]
    if any(v.size == 0 or not np.all(np.isfinite(v)) for v in values) or \
            len({v.size for v in values}) != 1:
        return None
    return (not np.allclose(padded, plain, rtol=1e-4, atol=1e-6),
            not np.allclose(summed, whole, rtol=1e-4, atol=1e-6))


def _shaped(weight: Any, rank: int, dims: Tuple[int, ...], follows_rank: bool) -> Any:
    """A per-row weight as the step gives it to a metric (`steps.masked_update`)."""
    import numpy as np

    if not follows_rank:
        return weight
    if rank > 2:  # broadcast over every axis but the last, as for a sequence output
        return np.broadcast_to(weight.reshape((-1,) + (1,) * (rank - 2)),
                               (len(weight),) + dims[:rank - 2]).copy()
    return weight.reshape((-1,) + (1,) * (rank - 1))
