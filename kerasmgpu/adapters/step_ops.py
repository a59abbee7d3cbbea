"""What the step hooks ask of an adapter inside a step: the few tensor ops (rank, rows,
columns, broadcasting, the loss read as one device's) and the compiled metrics' leaves
and `update_state` wrapping.

A mixin of `adapters.base.Adapter`, in a module of its own for length; each Keras line's
adapter overrides the ops its backend computes otherwise.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, List, Optional

# Hooks are recorded on the objects they wrap under this attribute, so that a second
# install (a recompile, a second fit) never stacks a wrapper on a wrapper.
HOOKED = "_kerasmgpu_hooked"


class StepOps:
    """`Adapter`'s tensor ops and metric hooks (see the module doc)."""

    @functools.cached_property
    def _tf(self) -> Any:
        import tensorflow as tf

        return tf

    def rank(self, x: Any) -> Optional[int]:
        shape = getattr(x, "shape", None)
        if shape is None:
            return 0
        try:
            return len(shape)
        except (TypeError, ValueError):  # a TF shape of unknown rank
            return None

    def static_rows(self, x: Any) -> Optional[int]:
        shape = getattr(x, "shape", None)
        try:
            value = shape[0] if shape is not None and len(shape) else None
        except (TypeError, ValueError, IndexError):
            return None
        return None if value is None else int(value)

    def column(self, packed: Any, index: int) -> Any:
        return packed[:, index]

    def to_float(self, x: Any, like: Any = None) -> Any:
        raise NotImplementedError

    def multiply(self, a: Any, b: Any) -> Any:
        return a * b

    def expand_to_rank(self, w: Any, rank: int) -> Any:
        raise NotImplementedError

    def broadcast_like(self, w: Any, like: Any, rank: int) -> Any:
        """Per-row `w` broadcast to the first `rank` axes of `like`'s shape."""
        raise NotImplementedError

    def unscale_for_replicas(self, loss: Any) -> Any:
        """A loss as one device computes it, from what Keras's compiled loss returned
        inside a replica (identity where Keras does not scale for distribution)."""
        return loss

    def loss_reading_as_one_device(self, loss: Any) -> Any:
        """The loss `compute_loss` returned inside a replica, reading as one device's
        while its gradient stays the replica's own (identity where Keras does not scale
        for distribution): a user's train_step tracks what it reads and differentiates
        what the all-reduce sums."""
        return loss

    def ones_like_rows(self, packed: Any) -> Any:
        raise NotImplementedError

    def unmasked_for_metric(self, metric: Any, values: Any) -> Any:
        """`values` as `metric` sees them when updated without a sample weight: where
        Keras applies their Keras mask only given a weight, a copy without the mask (the
        padding weight must not turn it on). Identity where the mask never depends on it."""
        return values

    # --- the compiled metrics ---------------------------------------------------------

    def metric_leaves(self, model: Any) -> List[Any]:
        """Every Metric object of the model, containers flattened."""
        out: List[Any] = []
        seen: set = set()

        def visit(metric: Any) -> None:
            if id(metric) in seen:
                return
            seen.add(id(metric))
            inner = self.inner_metrics(metric)
            if inner:
                for m in inner:
                    visit(m)
            else:
                out.append(metric)

        for metric in list(getattr(model, "metrics", None) or []):
            visit(metric)
        return out

    def inner_metrics(self, metric: Any) -> List[Any]:
        """The metrics a container metric holds ([] for a plain metric)."""
        return []

    def wrap_update_state(self, metric: Any,
                          make: Callable[[Callable[..., Any], List[str]], Callable[..., Any]]
                          ) -> bool:
        """Replace `metric.update_state` by `make(original, params)`, once.

        `params` names update_state's parameters as the class declares them (tf.keras
        wraps the bound method on each instance, hiding its signature). Returns True if
        the metric was wrapped now.
        """
        if metric.__dict__.get(HOOKED):
            return False
        params = [name for name in inspect.signature(type(metric).update_state).parameters
                  if name != "self"]
        original = metric.update_state
        metric.__dict__["update_state"] = make(original, params)
        metric.__dict__[HOOKED] = True
        return True
