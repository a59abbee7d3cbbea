"""A parallel model's state: what `kerasmgpu.training.model` attaches to the replica
(`ParallelState`, read back with `state_of`), and the feeds it builds for each call."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from kerasmgpu.adapters import Adapter, metric_states, metric_values
from kerasmgpu.batching import Planner
from kerasmgpu.data import feeds, structure
from kerasmgpu.training import refusals, resume, sync
from kerasmgpu.training import steps as step_hooks
from kerasmgpu.training.ops import EngineOps

STATE_ATTR = "_kerasmgpu"


@dataclass
class ParallelState:
    template: Any
    engine: EngineOps
    adapter: Adapter
    # None on the multi_gpu_model route, where Keras's own multi_gpu_model feeds itself.
    report: Optional[step_hooks.StepReport] = None
    has_compiled_loss: bool = False
    originals: Dict[str, Callable[..., Any]] = field(default_factory=dict)
    # Keeps the template and the replica equal (set once the replica is compiled).
    mirror: Optional[sync.Mirror] = None
    # Step kinds whose step is the user's own ("train", "test"), not Keras's.
    custom_steps: set = field(default_factory=set)
    # The train metrics' results, read before fit's validation pass resets them.
    train_results: Optional[Dict[str, Any]] = None
    # parallelize(accumulate_steps=k): training batches per optimizer step.
    accumulate_steps: int = 1
    # parallelize(verify=True): the self-check (`kerasmgpu.training.verify`) runs.
    verify: bool = False
    # The *_on_batch calls whose first call the job compared (`training.agree`).
    described_calls: set = field(default_factory=set)
    sync_batchnorm: bool = False
    # What the model's step computes from the whole batch beyond the compiled loss
    # (`terms.batch_terms`), and whether batches that do not divide go whole to every
    # replica for it.
    batch_terms: List[str] = field(default_factory=list)
    # What the user's layers compute from the rows they are given beyond the loss - values
    # added with `add_metric`, variables assigned in `call` (`training.tried_layers`):
    # short batches go whole for them too.
    layer_terms: List[str] = field(default_factory=list)
    # Compile metrics and losses of one value per batch (`adapters.metric_values`): short
    # batches go whole for them too (one program over the global batch; refused
    # elsewhere); so they do for the user's metrics that count rows of sample weight 0
    # (`adapters.metric_states`) where one program runs the batch.
    batch_values: List[str] = field(default_factory=list)
    # Whether the model's outputs told them (declared outputs); else each call's targets
    # are probed (`tell_batch_metrics`).
    batch_metrics_told: bool = True
    whole_batches: bool = False
    # The self-check's per-replica computations, kept while what they read stays (an
    # engine that traces them - TensorFlow - then traces each once, not once a fit).
    checks: Dict[Any, Any] = field(default_factory=dict)

    @property
    def planner(self) -> Planner:
        """How this model's batches are planned: the engine's way, whole where the
        model's step needs it."""
        planner = self.engine.planner
        if not self.whole_batches:
            return planner
        # One program over the global batch lays the batch out replicated; a replica
        # that runs its own step gets a copy.
        return dataclasses.replace(planner, whole=True, copies=not self.engine.one_program)

    def tell_batch_metrics(self, model: Any, specs: Optional[List[Any]] = None) -> None:
        """Find the compile metrics of one value per batch (`metric_values`) - from the
        model's declared outputs, or `specs` (its targets' shapes) - before a step runs:
        short batches go whole for them where one program runs the batch; elsewhere they
        are refused."""
        engine = self.engine
        self.batch_values = []
        if engine.slices_in_graph or engine.planner.replicas < 2:
            return  # Keras 2.3 computes them over the merged outputs; one replica is one
        specs = specs if specs is not None else metric_values.output_specs(model)
        self.batch_metrics_told = bool(specs)
        args = self.adapter.compile_args(model)
        losses = metric_values.batch_losses(self.adapter, args, specs)
        metrics = metric_values.batch_metrics(self.adapter, args, specs)
        if losses and not engine.one_program:
            raise refusals.one_value_refused(losses, engine.one_program, "loss")
        if metrics and not engine.one_program:
            raise refusals.one_value_refused(metrics, engine.one_program)
        # The user's Metric subclasses, tried on made-up rows: one whose state is not a
        # sum over rows cannot be summed over replicas; one that counts rows of weight
        # 0 counts the padding rows, unless short batches go whole on one program.
        blind, unsummed = metric_states.rules(self.adapter, args, specs)
        if unsummed and not engine.one_program:
            raise refusals.unsummed_refused(unsummed)
        self.batch_values = metrics + losses
        self.whole_batches = bool(self.batch_terms or self.layer_terms or self.batch_values
                                  or (blind and engine.one_program))
        if self.report is not None:
            self.report.batch_values = self.batch_values
            self.report.blind_metrics = blind

    def feed(self, x: Any, *, kind: str, training: bool = True, model: Any = None,
             position: Optional[resume.Plan] = None, **kwargs: Any) -> feeds.Feed:
        """A feed for one step kind ("train", "test", "predict"); `training`: read epoch
        after epoch by fit()."""
        if kwargs.get("shuffle"):
            # Every process must shuffle alike, or their shares would overlap.
            kwargs.setdefault("seed", self.engine.shuffle_seed())
        inputs = self.adapter.model_inputs(model) if model is not None else None
        if model is not None and kind != "predict" and not self.batch_metrics_told and \
                self.adapter.is_compiled(model):
            # Outputs not declared (a subclassed model): the targets' shapes stand in.
            targets = kwargs.get("y")
            if targets is not None and structure.is_array_like(targets):
                self.tell_batch_metrics(model, [
                    ((None,) + tuple(leaf.shape[1:]), "float32")
                    for leaf in structure.leaves(structure.to_numpy(targets))])
        if kind == "train":
            kwargs["accumulate_steps"] = self.accumulate_steps
        # A feed in parts needs a step function that runs one step per call.
        parts = model is not None and self.adapter.steps_per_call(model) == 1
        feed = feeds.build(self.adapter, self.engine.feed_kind, self.planner, x,
                           inputs=inputs, predict=kind == "predict", parts=parts, **kwargs)
        if kind != "predict" and self.report is not None:
            self.report.feeding(kind, feed.pads, feed.padding_example, feed.whole)
        if training or feed.tail is not None:
            # Keras re-creates a dataset's iterator every epoch unless it is told the
            # steps (for a distributed dataset that costs as much as half an epoch of a
            # small model); one repeated iterator reads the epochs of kerasmgpu's own
            # pipelines back to back. A user's tf.data pipeline is read as Keras reads
            # it on one device (`Feed.per_epoch_iterators`). A feed in parts is read so
            # always: its step function counts the steps (`training.parts`).
            feed = feeds.repeated(feed)
        if position is not None:
            feed = _skip_trained(feed, position)
        return self.engine.distribute_feed(feed)


def _skip_trained(feed: feeds.Feed, position: resume.Plan) -> feeds.Feed:
    """A resumed fit's feed without the batches its restored epoch already trained."""
    skip = position.skip_steps(feed.steps)
    if not skip:
        return feed
    skipped = feeds.skipped(feed, skip)
    if skipped is None:
        position.cannot_skip()
        return feed
    return skipped


def state_of(model: Any) -> Optional[ParallelState]:
    return getattr(model, "__dict__", {}).get(STATE_ATTR)


def is_parallel(model: Any) -> bool:
    return state_of(model) is not None
