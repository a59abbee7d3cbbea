"""Step hooks that make padded batches give single-device results, whatever the step.

Every batch kerasmgpu hands Keras is `(x, bundle)`. The bundle is a dict holding the
*packing* of the batch - per fed row, the batch's scale `padded / real` and a mask (1
real, 0 padding), see `kerasmgpu.batching` - and, when the user gave them, the targets
and sample weights (gathered like the rows). Then:

* **the step** - the model's own `train_step` / `test_step` / `predict_step`, Keras's
  or the user's override - is called with the data as the user gave it (`x`, `(x, y)`
  or `(x, y, sample_weight)`, as `keras.utils.pack_x_y_sample_weight` forms it; JAX's
  stateless `(state, data)` form included). While it runs, the bundle's packing is this
  thread's *active packing* (`active()`);
* **losses** - Keras's compiled loss (what `compute_loss` and `compiled_loss` call)
  multiplies each row's sample weight by `scale * mask` (mean reductions) or `mask`
  (sums) while a packing is active: the exact single-device value and gradient;
* **metrics** - every metric updated during the step with batch-shaped values gets the
  mask as (part of) its sample weight, so padding rows count for nothing;
* **loss trackers** - Keras weights each step's loss by the fed row count; while a
  packing is active that weight is divided by `scale`, i.e. counted by real rows;
* **predict** - the step returns the mask beside the outputs; padding rows are dropped.

A step that computes its loss outside Keras's compiled loss (a GAN, a VAE trained by
`add_loss`, a hand-written loss) or adds terms computed from the batch (`add_loss`, an
activity regularizer) cannot be told about padding rows: no per-row weight reaches a
function of the whole batch. Such a model's batches that do not divide go whole to every
replica (`terms.batch_terms`, `kerasmgpu.batching.BatchPlan.whole`): a copy each where
each replica runs its own step (TensorFlow, torch), laid out replicated under JAX's one
program. Each replica computes one device's terms. Where that cannot be done (an input
JAX reads outside kerasmgpu's PyDatasets, a term found only when the step is traced)
and for a metric that takes no sample weight, kerasmgpu warns once when a batch may be
padded (`StepReport`).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional

from kerasmgpu.adapters import Adapter, metric_values
from kerasmgpu.batching import MASK, SCALE
from kerasmgpu.data.bundle import (
    ORDER_KEY,
    PACKING_KEY,
    SAMPLE_WEIGHT_KEY,
    Y_KEY,
    is_bundle,
    on_batch,
    split,
)
from kerasmgpu.data.structure import map_structure, nested, same_structure, zip_map
from kerasmgpu.training.refusals import one_value_refused

PRED_KEY = "kerasmgpu_outputs"
MASK_KEY = "kerasmgpu_mask"
ORDER_OUT_KEY = "kerasmgpu_order"

# Reductions whose value is a mean over rows: they need the padded/real scale.
MEAN_REDUCTIONS = frozenset({"sum_over_batch_size", "mean", "auto", "mean_with_sample_weight"})


# --- the active packing ------------------------------------------------------------------


@dataclass
class Frame:
    """One step's packing, and what the step did with it (read when it returns)."""

    packed: Any
    loss_weighted: bool = False  # Keras's compiled loss applied the padding weights
    unweightable_metric: Optional[str] = None  # a metric updated without sample_weight
    # Losses already reading as one device's (a user's step's compute_loss), told by
    # identity: an id kept after its tensor is freed can be another tensor's (Keras 3's
    # `_loss_ids` bug: keras3_jax)
    one_device_losses: list = field(default_factory=list)
    # The step kind ("train", "test") where a step of the model's runs; None in Keras's
    # symbolic build of the metrics and in the self-check's computations.
    kind: Optional[str] = None


_local = threading.local()


def current() -> Optional[Frame]:
    """This thread's active packing (steps of different replicas run on their own
    threads under tf.distribute, each with its own)."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def active(packed: Any, kind: Optional[str] = None) -> Iterator[Frame]:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    # An empty packing (a batch without padding, `bundle.unpadded`) is no packing.
    frame = Frame(None if packed is None or unpadded(packed) else packed, kind=kind)
    stack.append(frame)
    try:
        yield frame
    finally:
        stack.pop()


# --- losses ---------------------------------------------------------------------------------


def _times(adapter: Adapter, weight: Any, sample_weight: Any) -> Any:
    """`sample_weight * weight`, broadcast over the sample weight's extra axes."""
    if sample_weight is None:
        return weight
    rank = adapter.rank(sample_weight) or 1
    return adapter.multiply(sample_weight,
                            adapter.expand_to_rank(adapter.to_float(weight, like=sample_weight),
                                                   rank))


def loss_hook(adapter: Adapter, scaled: bool, on_call: Callable[[], None]
              ) -> Callable[[Any, Any, Any], Any]:
    """What Keras's compiled loss calls for its sample weight while a packing is active.

    `scaled`: the compiled losses reduce by a mean (weight rows by `scale * mask`) rather
    than a sum (`mask` alone).
    """

    def hook(y_true: Any, y_pred: Any, sample_weight: Any) -> Any:
        frame = current()
        if frame is None:
            return sample_weight
        frame.loss_weighted = True
        if frame.packed is None:  # the fast path: no padding, the user's weights alone
            return sample_weight
        on_call()
        if adapter.weights_in_loss_values:  # each loss weighs its own values (loss_values)
            return sample_weight
        mask = adapter.column(frame.packed, MASK)
        weight = adapter.multiply(mask, adapter.column(frame.packed, SCALE)) if scaled else mask
        if not adapter.weights_follow_output_rank:
            if nested(sample_weight):
                return map_structure(lambda w: _times(adapter, weight, w), sample_weight)
            return _times(adapter, weight, sample_weight)
        return _per_output(adapter, weight, sample_weight, y_pred)

    return hook


def loss_values(adapter: Adapter, values: Any, mask: Any, reduction: Any) -> Any:
    """One compiled loss's values, before Keras weighs and reduces them, made such that
    the replicas' losses sum to one device's loss over the real rows.

    A mean reduction divides by a count: every element (then the padding weight
    `scale * mask`, shaped like `values` - the loss's own rows, not the output's - makes
    it the real rows' mean), or, with a Keras mask (`ignore_class`, `mask_zero`), the
    `V` valid entries the replica holds, padding copies included. One device divides by
    the valid entries of the real rows of the whole batch, `Vg`: the values are scaled by
    `V / Vg` (Keras's own `total / V` and sum then leave `sum / Vg`), `Vg` taken over all
    replicas (`adapter.replica_mean`, times the replica count Keras divides by).

    Where the compiled loss's sample weight carries the padding weight already
    (`weights_in_loss_values` False: the tf.keras lines), only a masked mean is changed
    here: its count made global, and the `scale` of that weight taken back out (a count
    divides, not the rows).
    """
    frame = current()
    if frame is None or not adapter.rank(values):
        return values
    packed = frame.packed
    if packed is not None and not _same_rows(adapter, values, packed):
        return values  # not one value per fed row: not ours to weigh
    mean = str(reduction or "").lower() in ("sum_over_batch_size", "mean", "auto")
    in_values = adapter.weights_in_loss_values
    if not in_values and (mask is None or not mean):
        return values  # the sample weight weighs it (loss_hook)
    if mask is None or not mean:
        if packed is None:
            return values
        weight = adapter.column(packed, MASK)
        if mean:
            weight = adapter.multiply(weight, adapter.column(packed, SCALE))
        weight = adapter.to_float(weight, like=values)
        return adapter.multiply(values, adapter.expand_to_rank(weight, adapter.rank(values) or 1))
    if packed is None and not adapter.counts_per_replica:
        return values  # one program over the global batch: Keras's count is global
    valid = adapter.to_float(mask, like=values)
    real = valid
    if packed is not None:
        rows = adapter.to_float(adapter.column(packed, MASK), like=values)
        real = adapter.multiply(valid, adapter.expand_to_rank(rows, adapter.rank(valid) or 1))
    factor = adapter.count_ratio(adapter.total(valid), adapter.replica_mean(adapter.total(real)))
    if packed is not None:
        weight = adapter.to_float(adapter.column(packed, MASK), like=values)
        if not in_values:  # the sample weight holds `scale * mask`: the scale comes out
            weight = adapter.count_ratio(
                weight, adapter.to_float(adapter.column(packed, SCALE), like=values))
        values = adapter.multiply(values, adapter.expand_to_rank(weight, adapter.rank(values) or 1))
    return adapter.multiply(values, factor)


def _per_output(adapter: Adapter, weight: Any, sample_weight: Any, y_pred: Any) -> Any:
    """The padding weight times the sample weight, shaped for each output's rank."""

    def one(w: Any, output: Any) -> Any:
        combined = _times(adapter, weight, w)
        return adapter.expand_to_rank(combined, max(adapter.rank(output) or 1,
                                                    adapter.rank(combined) or 1))

    if nested(y_pred):
        if nested(sample_weight) and same_structure(sample_weight, y_pred):
            return zip_map(one, sample_weight, y_pred)
        if nested(sample_weight):
            return map_structure(lambda w: _times(adapter, weight, w), sample_weight)
        return map_structure(lambda output: one(sample_weight, output), y_pred)
    if nested(sample_weight):
        return map_structure(lambda w: one(w, y_pred), sample_weight)
    return one(sample_weight, y_pred)


def unreduced_losses(loss: Any) -> List[str]:
    """The losses of a compile `loss=` argument with reduction "none", in words: Keras's
    own step differentiates the per-row values as their sum, and its loss tracker
    averages them with each batch's size as every value's weight - a figure no
    combination of the replicas' shares gives."""
    found: List[str] = []

    def visit(leaf: Any) -> None:
        reduction = getattr(leaf, "reduction", None)
        if reduction is not None and str(reduction).lower().rsplit(".", 1)[-1] == "none":
            found.append(f"{type(leaf).__name__}(reduction='none')")

    map_structure(visit, loss)
    return found


def reduction_is_mean(adapter: Adapter, loss: Any) -> Optional[bool]:
    """Whether every loss of a compile `loss=` argument reduces by a mean (True), by a
    sum (False), or both kinds occur (None)."""
    kinds = set()

    def visit(leaf: Any) -> None:
        if leaf is None:
            return
        reduction = getattr(leaf, "reduction", None)
        if reduction is None and not isinstance(leaf, str) and not callable(leaf):
            return
        name = str(reduction or "sum_over_batch_size").lower().rsplit(".", 1)[-1]
        kinds.add(name in MEAN_REDUCTIONS)

    map_structure(visit, loss)
    if len(kinds) > 1:
        return None
    return kinds.pop() if kinds else True


# --- metrics ----------------------------------------------------------------------------------


def masked_update(adapter: Adapter, metric: Any, one_program: bool = True,
                  whole: Callable[[str], bool] = lambda kind: False) -> Callable[..., Any]:
    """A metric's update_state that weights padding rows 0 while a packing is active.

    A metric of one value per batch (`metric_values.one_value`) takes no padding weight:
    it is computed as Keras computes it where one program runs the batch and no padding
    row is in it (a batch that divides, or - `whole(kind)`: the step kind's feed gives
    short batches whole - one that does not), and refused elsewhere (found up front
    where the model's outputs or its targets tell them: `ParallelState.
    tell_batch_metrics`; here at its first step where they do not)."""

    def make(original: Callable[..., Any], params: List[str]) -> Callable[..., Any]:
        where = params.index("sample_weight") if "sample_weight" in params else None

        def update_state(*args: Any, **kwargs: Any) -> Any:
            frame = current()
            if frame is not None and metric_values.one_value(adapter, metric, args[:2]):
                # (No step kind: Keras's symbolic build or the self-check, which count
                # nothing.)
                if frame.kind is not None and (not one_program or (
                        frame.packed is not None and not whole(frame.kind))):
                    name = getattr(metric, "name", type(metric).__name__)
                    raise one_value_refused([f"metric {name!r} (one value per batch)"],
                                            one_program)
                return original(*args, **kwargs)
            if frame is None or frame.packed is None:
                return original(*args, **kwargs)
            if where is None:
                frame.unweightable_metric = getattr(metric, "name", type(metric).__name__)
                return original(*args, **kwargs)
            positional = list(args)
            weight = kwargs.pop("sample_weight",
                                positional.pop(where) if len(positional) > where else None)
            values = positional[where - 1] if 0 < where <= len(positional) else None
            if values is None or not adapter.rank(values) or not _same_rows(
                    adapter, values, frame.packed):
                # Not one value per row (a scalar, another length): not ours to mask.
                return original(*positional, sample_weight=weight, **kwargs)
            mask = adapter.column(frame.packed, MASK)
            if weight is None:
                # Unweighted, Keras may ignore the values' Keras mask (Keras 3 before
                # 3.12): so must the padding weight, or the padded batch alone counts
                # only the valid timesteps.
                positional[where - 1] = adapter.unmasked_for_metric(metric, values)
                values = positional[where - 1]
                weight = mask
            else:
                weight = _times(adapter, mask, weight)
            if adapter.weights_follow_output_rank:
                rank = adapter.rank(values) or 1
                # A sequence output: Keras multiplies its mask (batch, time) into the
                # weight in place on torch, so the weight must have the mask's shape.
                weight = (adapter.broadcast_like(weight, values, rank - 1) if rank > 2
                          else adapter.expand_to_rank(weight, rank))
            return original(*positional, sample_weight=weight, **kwargs)

        return update_state

    return make


def _same_rows(adapter: Adapter, values: Any, packed: Any) -> bool:
    a, b = adapter.static_rows(values), adapter.static_rows(packed)
    return a is None or b is None or a == b


def tracker_update(adapter: Adapter, total: bool = True
                   ) -> Callable[[Callable[..., Any], List[str]], Callable[..., Any]]:
    """A loss tracker's update_state that counts a padded step by its real rows.

    `total`: the model's loss tracker (not a per-output one, which Keras's compiled
    loss updates itself with a value it already unscaled).
    """

    def make(original: Callable[..., Any], params: List[str]) -> Callable[..., Any]:
        def update_state(values: Any, sample_weight: Any = None, **kwargs: Any) -> Any:
            frame = current()
            if frame is None:
                return original(values, sample_weight=sample_weight, **kwargs)
            if not total and adapter.output_losses_weigh_steps:
                # Every replica's value weighs 1, as one device's step does (a padded
                # replica's is 0 and the real one's carries the scale: their mean is the
                # step's value).
                sample_weight = None
            if sample_weight is None:
                # A step of the user's own tracks the loss itself (the Keras guides:
                # `metric.update_state(loss)`). What it got from Keras's compiled loss
                # is divided by the replica count where Keras scales losses for
                # tf.distribute; one device tracks the whole value.
                if total and frame.loss_weighted and not any(
                        values is loss for loss in frame.one_device_losses):
                    values = adapter.unscale_for_replicas(values)
                return original(values, **kwargs)
            if frame.packed is None:  # the fast path: Keras's own row count is right
                return original(values, sample_weight=sample_weight, **kwargs)
            scale = adapter.column(frame.packed, SCALE)[0]
            rows = adapter.to_float(sample_weight, like=scale)
            return original(values, sample_weight=rows / scale, **kwargs)

        return update_state

    return make


# --- what a step did: the one-time warning --------------------------------------------------


@dataclass
class StepReport:
    """Warns once per step kind when a step cannot be told about padding rows.

    What a step does is learned when it is traced (`after`); whether a batch will be
    padded when a feed is built (`pads`). Either may come first - a traced step is
    reused by later calls - so each of them checks.
    """

    adapter: Adapter
    replicas: int
    model_name: str
    # Per step kind: its feed gives a batch that does not divide whole to every replica
    # (`batch_terms` found a term, `Feed.whole`): only a metric without sample weights
    # can still count padding rows.
    whole: Dict[str, bool] = field(default_factory=dict)
    # Per step kind ("train", "test"): True (a batch will be padded), None (may be), False.
    pads: Dict[str, Optional[bool]] = field(default_factory=dict)
    padding_example: Dict[str, str] = field(default_factory=dict)
    # Per step kind: why its step cannot be told about padding ([] when it can).
    opaque: Dict[str, List[str]] = field(default_factory=dict)
    # Per step kind: whether the first of its `opaque` reasons is about the loss.
    losses: Dict[str, bool] = field(default_factory=dict)
    warned: set = field(default_factory=set)
    # The compile losses and metrics of one value per batch (`ParallelState.
    # tell_batch_metrics`), in words.
    batch_values: List[str] = field(default_factory=list)
    # The user's metrics that count rows of sample weight 0 (`adapters.metric_states`),
    # in words: padding rows count in them unless a short batch goes whole on one
    # program.
    blind_metrics: List[str] = field(default_factory=list)
    one_program: bool = False
    # What the user's layers compute from the rows beyond the loss (`ParallelState.
    # layer_terms`), in words: padding rows count in them unless a short batch goes whole.
    layer_terms: List[str] = field(default_factory=list)

    def after(self, kind: str, frame: Frame, model: Any, has_compiled_loss: bool) -> None:
        reasons = []
        if not frame.loss_weighted:
            reasons.append(
                f"its {kind}_step computes the loss without Keras's compiled loss "
                "(self.compute_loss / self.compiled_loss)" if has_compiled_loss else
                "it has no compiled loss (its loss comes from add_loss or its own step)")
        elif self.adapter.has_call_time_losses(model):
            reasons.append("it adds loss terms computed from the batch (add_loss)")
        about_loss = bool(reasons)
        if frame.unweightable_metric:
            reasons.append(f"its metric {frame.unweightable_metric!r} takes no sample_weight")
        if reasons or kind not in self.opaque:
            self.opaque[kind], self.losses[kind] = reasons, about_loss
        self.check(kind)

    def feeding(self, kind: str, pads: Optional[bool], example: Optional[str],
                whole: bool = False) -> None:
        self.pads[kind] = pads
        self.whole[kind] = whole
        if example:
            self.padding_example[kind] = example
        self.check(kind)

    def check(self, kind: str) -> None:
        reasons = self.opaque.get(kind)
        if reasons and self.whole.get(kind) and self.losses.get(kind):
            # Every replica computes one device's loss and terms: only a metric's reason
            # is left.
            reasons = reasons[1:]
        if self.batch_values and not self.whole.get(kind):
            # A feed whose short batches cannot go whole (a tf.data pipeline or generator
            # on JAX): a metric of them is refused at its first padded step, a loss not.
            reasons = list(reasons or []) + [
                f"its {', '.join(self.batch_values)} reduce the whole batch to one value"]
        if self.blind_metrics and not (self.whole.get(kind) and self.one_program):
            reasons = list(reasons or []) + [f"its {m}" for m in self.blind_metrics]
        if self.layer_terms and not self.whole.get(kind):
            reasons = list(reasons or []) + [f"its {t}" for t in self.layer_terms]
        # (A metric without sample_weight is found both before and at its step.)
        reasons = list(dict.fromkeys(reasons or []))
        if not reasons or kind in self.warned or self.pads.get(kind, None) is False:
            return
        self.warned.add(kind)
        when = self.padding_example.get(kind) or (
            f"a global batch whose size is not a multiple of {self.replicas}")
        certainty = "will be" if self.pads.get(kind) else "may be"
        warnings.warn(
            f"kerasmgpu: {self.model_name}: {'; '.join(reasons)}, so kerasmgpu cannot keep "
            f"padding rows out of it. {when[0].upper() + when[1:]} {certainty} padded to a "
            f"multiple of the {self.replicas} replicas with copies of its own rows, and "
            "those copies count there: results differ from one device on padded batches "
            "only. Fix: make the batch size and the number of samples multiples of "
            f"{self.replicas} (or drop the remainder), or compute the loss with "
            "self.compute_loss(x, y, y_pred, sample_weight) and metrics that take a "
            "sample_weight.",
            stacklevel=2,
        )


# --- the step overrides -------------------------------------------------------------------


def unpadded(packed: Any) -> bool:
    """Whether a batch's packing is the empty one of a batch without padding rows
    (`bundle.unpadded`), from its static shape: a traced step decides without a value."""
    shape = getattr(packed, "shape", None)
    return shape is not None and len(shape) == 2 and shape[-1] is not None and \
        int(shape[-1]) == 0


def plain_step(data: Any, call: Callable[[Any], Any], kind: Optional[str] = None) -> Any:
    """The fast path: a batch that needs no padding runs the engine's own step on the
    user's data - no packing, so the hooks weight no loss, mask no metric and reweight no
    loss tracker (an even batch of N replicas is already one device's batch). The frame
    without a packing only lets a loss tracker of the user's own step count the whole
    loss where Keras scaled it for tf.distribute (`tracker_update`), and a masked mean
    divide by the global count where each replica counts its own (`loss_values`)."""
    with active(None, kind):
        return call(data)


def make_step(adapter: Adapter, original: Callable[..., Any], kind: str,
              before: Callable[[Any], None],
              after: Callable[[str, Frame, Any], None]) -> Callable[..., Any]:
    """The model's own `train_step` / `test_step`, fed the user's data (see module doc)."""

    def run(model: Any, data: Any, call: Callable[[Any], Any]) -> Any:
        parts = split(data)
        if parts is None:  # a feed without padding on TensorFlow (`bundle.plain`)
            return plain_step(data, call, kind)
        x, y, sample_weight, packed = parts
        if adapter.whole_batch_on_batch and on_batch(data):
            x, y, sample_weight, packed = adapter.replica_share((x, y, sample_weight, packed))
        if unpadded(packed):
            return plain_step(adapter.pack_data(x, y, sample_weight), call, kind)
        with active(packed, kind) as frame:
            before(model)
            result = call(adapter.pack_data(x, y, sample_weight))
        after(kind, frame, model)
        return result

    if adapter.stateless_steps:

        def stateless_step(self: Any, state: Any, data: Any) -> Any:
            return run(self, data, lambda d: original(self, state, d))

        return _named(stateless_step, original)

    def step(self: Any, data: Any) -> Any:
        return run(self, data, lambda d: original(self, d))

    return _named(step, original)


def _named(step: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    """`step` under the name of the step it runs: JAX names the compiled program after
    it (`jit_train_step`, as on one device), and so do profiles and tracebacks."""
    step.__name__ = getattr(original, "__name__", step.__name__)
    step.__qualname__ = getattr(original, "__qualname__", step.__qualname__)
    return step


def make_predict_step(adapter: Adapter, original: Callable[..., Any],
                      before: Callable[[Any], None]) -> Callable[..., Any]:
    """The model's own `predict_step` on `(x,)`; mask and order travel beside its outputs."""

    def wrap(outputs: Any, data: Any) -> Any:
        b = data[1]
        out = {PRED_KEY: outputs, MASK_KEY: adapter.column(b[PACKING_KEY], MASK)}
        if ORDER_KEY in b:
            out[ORDER_OUT_KEY] = b[ORDER_KEY]
        return out

    if adapter.stateless_steps:

        def stateless_step(self: Any, state: Any, data: Any) -> Any:
            parts = split(data)
            if parts is None:
                return original(self, state, data)
            with active(parts[3]):
                before(self)
                outputs, non_trainable = original(self, state, (parts[0],))
            return wrap(outputs, data), non_trainable

        return stateless_step

    def step(self: Any, data: Any) -> Any:
        parts = split(data)
        if parts is None:
            return original(self, data)
        with active(parts[3]):
            before(self)
            outputs = original(self, (parts[0],))
        return wrap(outputs, data)

    return step


def make_unbundling(original: Callable[..., Any]) -> Callable[..., Any]:
    """`compute_loss` / `compute_metrics` that accept a bundle in the `y` slot.

    Keras 3 builds a model's losses and metrics before fit/evaluate from a raw batch
    (`_symbolic_build`); what it unpacks from `(x, bundle)` puts the bundle where `y`
    goes. Anything else passes through untouched.
    """

    def unbundled(self: Any, x: Any = None, y: Any = None, y_pred: Any = None,
                  sample_weight: Any = None, *args: Any, **kwargs: Any) -> Any:
        if is_bundle(y):
            with active(y[PACKING_KEY]):
                return original(self, x, y.get(Y_KEY), y_pred, y.get(SAMPLE_WEIGHT_KEY),
                                *args, **kwargs)
        return original(self, x, y, y_pred, sample_weight, *args, **kwargs)

    return unbundled


def strip_padding(outputs: Any) -> Any:
    """Drop padding rows from predict's concatenated outputs using the returned mask."""
    import numpy as np

    if not isinstance(outputs, dict) or MASK_KEY not in outputs:
        return outputs
    keep = np.flatnonzero(np.asarray(outputs[MASK_KEY]).reshape(-1) > 0.5)
    if ORDER_OUT_KEY in outputs:
        order = np.asarray(outputs[ORDER_OUT_KEY]).reshape(-1, 2)[keep]
        keep = keep[np.lexsort((order[:, 1], order[:, 0]))]
    return map_structure(lambda leaf: np.asarray(leaf)[keep], outputs[PRED_KEY])
