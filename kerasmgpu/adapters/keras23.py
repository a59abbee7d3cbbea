"""Standalone Keras <= 2.3 (and tf.keras on TF < 2.4): the internals kerasmgpu touches.

Verified on keras 2.3.1 over TensorFlow 2.15.1 with the runtime patches of
`keras23_runtime` (`import kerasmgpu.keras23`).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from kerasmgpu.adapters import keras23_slicing, keras23_template
from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.adapters.base import Adapter, StateReader
from kerasmgpu.adapters.keras23_names import (  # noqa: F401 - re-exported
    GONE_MODULES,
    KERAS_PACKAGE_ALIASES,
    MULTI_GPU_MODEL_MODULES,
    TF_ROOTS,
)
from kerasmgpu.env.versions import LEGACY_KERAS_MIN, LEGACY_KERAS_VERIFIED_BELOW

# Where `kerasmgpu.legacy.install()` keeps Keras's own `multi_gpu_model` once the
# drop-in stands in its place, so that the multi_gpu_model engine still calls Keras's.
KERAS_OWN = "_kerasmgpu_keras_multi_gpu_model"
# The name scope of the graph ops that read the change tokens of a model's variables
# (placed where those variables live).
TOKENS_SCOPE = "kerasmgpu_change_tokens"


class Keras23(Adapter):
    """What the multi_gpu_model engine needs of Keras 2.3: its own multi_gpu_model.

    Read here: `keras.utils.multi_gpu_utils` and its `_get_available_devices` (its
    device check, shown GPU names while virtual CPU devices stand in), the compile
    arguments Keras 2.3 keeps on the model (`_is_compiled`, `_compile_metrics`,
    `_compile_weighted_metrics`), and the session of `tensorflow.python.keras.backend`
    (where Keras 2.3 runs on TensorFlow 2) to read the change tokens.
    """

    VERIFIED = (LEGACY_KERAS_MIN, LEGACY_KERAS_VERIFIED_BELOW)
    LABEL = "Keras"
    DIST = "keras"

    def is_compiled(self, model: Any) -> bool:
        return bool(getattr(model, "_is_compiled", False) or getattr(model, "optimizer", None))

    def multi_gpu_utils(self) -> Any:
        root = self.keras.__name__  # "keras", or "tensorflow.keras" on TF < 2.4
        return importlib.import_module(f"{root}.utils.multi_gpu_utils")

    def keras_multi_gpu_model(self) -> Any:
        """Keras's own function, also after `kerasmgpu.legacy.install()` replaced it."""
        utils = self.multi_gpu_utils()
        return getattr(utils, KERAS_OWN, utils.multi_gpu_model)

    @contextlib.contextmanager
    def shown_gpu_names(self, names: List[str]) -> Iterator[None]:
        """Keras 2.3's device check only accepts "/gpu:N": show it these names."""
        utils = self.multi_gpu_utils()
        original = getattr(utils, "_get_available_devices", None)
        if original is None:
            raise self.fail("`multi_gpu_utils._get_available_devices` is missing",
                            "the device check multi_gpu_model runs")
        utils._get_available_devices = lambda: names
        try:
            yield
        finally:
            utils._get_available_devices = original

    @contextlib.contextmanager
    def padded_short_batches(self, model: Any) -> Iterator[None]:
        """While Keras's `multi_gpu_model(model)` builds: a batch with fewer rows than
        replicas is sliced as if its rows were repeated up to one per replica (Keras's
        own slicing left the first replicas an empty slice, on which oneDNN's Conv2D
        fails), and each merged output is cut back to the batch's rows before the loss
        and metrics, so the repeats weigh nothing. Other batches are sliced as Keras
        slices them. Reads `multi_gpu_utils.Lambda` and `concatenate` (the names its
        `multi_gpu_model` builds the slices and the merge with, 2.3.1)."""
        utils = self.multi_gpu_utils()
        lambda_layer, concatenate = (getattr(utils, "Lambda", None),
                                     getattr(utils, "concatenate", None))
        if lambda_layer is None or concatenate is None:
            raise self.fail("`multi_gpu_utils.Lambda` or `concatenate` is missing",
                            "where multi_gpu_model slices the batch and merges the outputs")
        sliced: List[bool] = []
        rows_of = model.inputs[0]

        def slicing(function: Any, *args: Any, **kwargs: Any) -> Any:
            if (getattr(function, "__name__", "") == "get_slice"
                    and set(kwargs.get("arguments") or {}) == {"i", "parts"}):
                function = keras23_slicing.padded_slice
                sliced.append(True)
            return lambda_layer(function, *args, **kwargs)

        def merging(outputs: Any, axis: int = -1, name: Any = None, **kwargs: Any) -> Any:
            merged = concatenate(outputs, axis=axis, name=f"{name}_replicas", **kwargs)
            return lambda_layer(keras23_slicing.real_rows,
                                output_shape=keras23_slicing.first_shape, name=name)(
                [merged, rows_of])

        utils.Lambda, utils.concatenate = slicing, merging
        try:
            yield
        finally:
            utils.Lambda, utils.concatenate = lambda_layer, concatenate
        if not sliced:
            raise self.fail("multi_gpu_model built no `get_slice` Lambda",
                            "how it slices the batch over the replicas")

    @contextlib.contextmanager
    def one_device_losses(self, model: Any) -> Iterator[List[Any]]:
        """While Keras's `multi_gpu_model(model)` builds: the layers' added losses (activity
        regularizers, `add_loss` in `call`) stay as the template had them, and the list
        yielded is filled with the template's own loss terms for the parallel model.

        Each replica calling the template adds its slice's terms: an activity
        regularizer's per slice (keyed by the slice), an `add_loss` in `call` unconditional
        (so the template's own list grew by one copy per replica). Summed by the parallel
        model's compile, a mean counted N+1 times and a short batch's repeated rows
        counted. The template's own terms read the template's inputs, which are the
        parallel model's (Keras slices `model.inputs`): the whole batch as one device
        computes them. Reads `Layer._losses` and `_per_input_losses` (2.3.1)."""
        layers = self.layers_of(model)
        if not all(isinstance(getattr(layer, "_per_input_losses", None), dict)
                   and isinstance(getattr(layer, "_losses", None), list) for layer in layers):
            raise self.fail("`Layer._losses` or `_per_input_losses` is missing",
                            "where Keras 2.3 keeps the losses each call of a layer adds")
        kept = [(layer, list(layer._losses),
                 {key: list(terms) for key, terms in layer._per_input_losses.items()})
                for layer in layers]
        terms = list(model.losses)
        yield terms
        for layer, losses, per_input in kept:
            layer._losses = losses
            layer._per_input_losses = per_input

    def add_one_device_losses(self, parallel: Any, terms: List[Any]) -> None:
        """The template's own loss terms (`one_device_losses`) that the parallel model
        does not collect itself (an activity regularizer's: keyed by the template's own
        call, which is no node of the parallel model), added to it once."""
        have = {id(term) for term in parallel.losses}
        missing = [term for term in terms if id(term) not in have]
        if missing:
            parallel.add_loss(missing)

    def name_nested_metrics(self, parallel: Any) -> None:
        """Keras 2.3 computes a model's metrics all the way down its layers (`metrics`,
        through a nested model's layers: the template's, in the parallel model) but names
        them one level deep (`metrics_names`: its direct layers' `_metrics`), and the logs
        zip the two: a template layer's `add_metric` value - which the parallel model
        computes on the whole batch, from the template's own inputs, as one device does -
        was dropped from History and evaluate (a Keras 2.3 bug for any nested model).
        Where the template has such metrics the parallel model's class names what it
        computes: 'loss', then each of `_get_training_eval_metrics()` with a result, as
        the train and test functions output them. Reads `_get_training_eval_metrics` and
        `_call_result` (2.3.1)."""
        klass = type(parallel)
        if not callable(getattr(parallel, "_get_training_eval_metrics", None)):
            raise self.fail("`Model._get_training_eval_metrics` is missing",
                            "the metrics the train function outputs")
        direct = {id(m) for layer in parallel.layers for m in getattr(layer, "_metrics", [])}
        direct |= {id(m) for m in getattr(parallel, "_metrics", [])}
        if all(id(m) in direct for m in self._nested_metrics(parallel)):
            return  # nothing nested: Keras's own names are right

        def metrics_names(model: Any) -> List[str]:
            return ["loss"] + [m.name for m in model._get_training_eval_metrics()
                               if hasattr(m, "_call_result")]

        parallel.__class__ = type(klass.__name__, (klass,), {
            "metrics_names": property(metrics_names), "__module__": klass.__module__})

    def _nested_metrics(self, parallel: Any) -> List[Any]:
        return [m for layer in self.layers_of(parallel)[1:]
                for m in getattr(layer, "_metrics", [])]

    def compile_args(self, model: Any) -> Dict[str, Any]:
        """Keras 2.3 keeps its compile arguments on the model. The optimizer is the
        model's own object: the parallel model shares it (`keras23_template`)."""
        return {
            "optimizer": model.optimizer,
            "loss": model.loss,
            # A dict (per-output metrics) stays a dict: list() would keep only its keys.
            "metrics": _fresh(_as_given(getattr(model, "_compile_metrics", None))),
            "loss_weights": model.loss_weights,
            "sample_weight_mode": model.sample_weight_mode,
            "weighted_metrics": _fresh(getattr(model, "_compile_weighted_metrics", None)),
        }

    def compile_token(self, model: Any) -> Tuple[Any, ...]:
        return keras23_template.compile_token(model)

    # --- the template's optimizer and flags are the parallel model's (`keras23_template`) --

    def share_optimizer(self, template: Any) -> None:
        """The template's optimizer keeps one set of slots for every train function built
        for one compile of the template (its own, the parallel model's, a copy's)."""
        optimizer = getattr(template, "optimizer", None)
        if optimizer is not None and not callable(getattr(optimizer, "get_updates", None)):
            raise self.fail("`Optimizer.get_updates` is missing", "where the optimizer's slots "
                            "are made, which the template and the parallel model share")
        keras23_template.share_slots(self.keras, optimizer, template)

    def collect_trainable_as(self, parallel: Any, template: Any, inner: Any) -> None:
        """Right after `parallel.compile()`: it trains the weights that the template's own
        compile collected (`_collected_trainable_weights`, which `_make_train_function`
        trains whatever the flags are by then), as one device does - a GAN's
        discriminator compiled, then frozen to build the combined model, trains in its
        own calls. `inner`: the model `parallel` runs (the template, or its copy), whose
        weights match the template's by position."""
        collected = getattr(template, "_collected_trainable_weights", None)
        ours, theirs = template.weights, inner.weights
        if collected is None or len(ours) != len(theirs):
            return
        held = {id(v) for v in theirs}
        if not all(id(v) in held for v in getattr(parallel, "_collected_trainable_weights", [None])):
            return  # weights of the parallel model's own: nothing to map onto
        index = {id(v): i for i, v in enumerate(ours)}
        parallel._collected_trainable_weights = [
            theirs[index[id(v)]] for v in collected if id(v) in index]

    def nested_updaters(self, model: Any) -> List[str]:
        """Layers of yours making update ops inside a nested model (`keras23_template`),
        in words: each replica runs them on its slice."""
        return keras23_template.nested_updaters(self.keras, model)

    def replica_updates(self, model: Any) -> keras23_template.ReplicaUpdates:
        """Before `multi_gpu_model(model)`: what regathers its replicas' update ops by the
        trainable flags when the parallel model's train function is made."""
        missing = keras23_template.missing_lists(model)
        if missing or not hasattr(model, "_inbound_nodes") or not hasattr(
                self.keras.Model, "_make_train_function"):
            raise self.fail(f"`Layer.{keras23_template.UPDATES}`, `_inbound_nodes` or "
                            f"`Model._make_train_function` is missing "
                            f"({', '.join(missing) or model.name})",
                            "the update ops Keras 2.3 keeps per input, and where it makes "
                            "the train function")
        return keras23_template.ReplicaUpdates(self.keras, model)

    # --- the training state: graph mode, read through Keras's session ---------------------

    def state_reader(self, variables: List[Any]) -> StateReader:
        """The variables' hashes, from ops added once to Keras's graph."""
        import tensorflow as tf

        if not variables:
            return lambda: []
        # The session Keras 2.3 runs in on TensorFlow 2: TensorFlow's internal Keras
        # backend's (Keras 2.3's own get_session refuses to run on TensorFlow 2).
        session = importlib.import_module("tensorflow.python.keras.backend").get_session
        with session().graph.as_default(), tf.name_scope(TOKENS_SCOPE):
            hashes = tf.stack([tf_internals.bits_hash(tf, tf.convert_to_tensor(v))
                               for v in variables])
        return lambda: [int(h) for h in session().run(hashes)]

    def read_values(self, variables: List[Any]) -> List[Any]:
        return list(self.keras.backend.batch_get_value(list(variables)))

    def numpy(self, value: Any) -> Any:
        """A tensor of Keras's graph (made from constants: `training.tried_layers`)
        evaluated in its session; a value as a NumPy array."""
        import numpy as np

        if hasattr(value, "op") and hasattr(value, "graph"):
            return np.asarray(self.keras.backend.eval(value))
        return np.asarray(value)

    def write_values(self, variables: List[Any], values: List[Any]) -> None:
        self.keras.backend.batch_set_value(list(zip(variables, values)))

    # --- parallelize(verify=True): Keras's graph, run by backend functions ----------------
    # Read on 2.3.1: `_standardize_user_data`, `_feed_inputs` / `_feed_targets` /
    # `_feed_sample_weights`, `_collected_trainable_weights`, `total_loss` and
    # `_uses_dynamic_learning_phase` - what `fit` and `predict` feed their functions.

    def _function(self, model: Any, key: str, of: Any, make: Callable[[], Any]) -> Any:
        """A backend function made once per model and graph tensor `of` (a recompile
        makes a new loss): the check adds ops to Keras's graph only the first time."""
        held = model.__dict__.get("_kerasmgpu_verify_" + key)
        if held is None or held[0] is not of:
            held = (of, make())
            model.__dict__["_kerasmgpu_verify_" + key] = held
        return held[1]

    def _phase(self, model: Any, training: bool) -> List[float]:
        return [1.0 if training else 0.0] if model._uses_dynamic_learning_phase() else []

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        """The compiled total loss and its gradients by a backend function with no
        updates: nothing is assigned (no optimizer step, moving statistic or metric)."""
        backend = self.keras.backend
        loss = getattr(model, "total_loss", None)
        if loss is None:
            return None

        def make() -> Any:
            params = list(model._collected_trainable_weights)
            grads = [backend.zeros_like(p) if g is None else g
                     for g, p in zip(backend.gradients(loss, params), params)]
            return backend.function(model._feed_inputs + model._feed_targets
                                    + model._feed_sample_weights + self._learning_phase(model),
                                    [loss] + grads)

        import numpy as np

        ins, targets, weights = model._standardize_user_data(
            x, y, sample_weight=sample_weight, class_weight=class_weight)
        values = self._function(model, "loss", loss, make)(
            ins + targets + weights + self._phase(model, training))
        return float(values[0]), [np.asarray(v) for v in values[1:]]

    def _learning_phase(self, model: Any) -> List[Any]:
        phase = self.keras.backend.learning_phase()
        return [phase] if model._uses_dynamic_learning_phase() else []

    def outputs_of(self, model: Any, x: Any) -> Optional[List[Any]]:
        import numpy as np

        outputs = list(model.outputs)
        function = self._function(model, "outputs", outputs[0], lambda: self.keras.backend.function(
            model._feed_inputs + self._learning_phase(model), outputs))
        return [np.asarray(v) for v in function(model._standardize_user_data(x)[0]
                                                + self._phase(model, False))]

    def layer_outputs(self, model: Any, x: Any) -> Optional[Tuple[List[Any], List[Any]]]:
        return self._layer_outputs(model, model._standardize_user_data(x)[0])

    def _layer_outputs(self, model: Any, ins: List[Any]) -> Tuple[List[Any], List[Any]]:
        import numpy as np

        # Output 0 of each layer: the model's own graph (a template inside a
        # multi_gpu_model has one more node per replica).
        layers = [layer for layer in model.layers if type(layer).__name__ != "InputLayer"]
        tensors = [layer.get_output_at(0) for layer in layers]
        function = self._function(model, "layers", tensors[0] if tensors else None,
                                  lambda: self.keras.backend.function(
                                      model._feed_inputs + self._learning_phase(model),
                                      tensors))
        return layers, [np.asarray(v) for v in function(ins + self._phase(model, False))]

    def replica_layer_outputs(self, parallel: Any, x: Any, replicas: int) -> List[Any]:
        """The layers of the model a multi_gpu_model runs, on each replica's slice by
        Keras's own rule (`multi_gpu_utils.get_slice`: `rows // replicas` each, the
        last one the remainder), concatenated - what its replicas compute."""
        import numpy as np

        inner = [layer for layer in parallel.layers if isinstance(layer, self.keras.Model)]
        if replicas == 1 or len(inner) != 1:  # a one-device copy: a model as it is
            return self._layer_outputs(parallel, parallel._standardize_user_data(x)[0])[1]
        ins = inner[0]._standardize_user_data(x)[0]
        rows = int(ins[0].shape[0])
        step = rows // replicas
        cuts = [slice(i * step, rows if i == replicas - 1 else (i + 1) * step)
                for i in range(replicas)]
        parts = [self._layer_outputs(inner[0], [a[cut] for a in ins])[1] for cut in cuts]
        return [np.concatenate([part[i] for part in parts]) for i in range(len(parts[0]))]

    # --- sync_batchnorm: the replicas built layer by layer (`keras23_batchnorm`) -----------

    def synchronized_multi_gpu_model(self, model: Any, gpus: Sequence[int],
                                     cpu_merge: bool) -> Any:
        """multi_gpu_model(model, gpus) whose BatchNormalization layers normalize over
        the whole global batch and update their moving statistics once with it."""
        from kerasmgpu.adapters import keras23_batchnorm

        return keras23_batchnorm.synchronized_multi_gpu_model(self.keras, model, gpus,
                                                              cpu_merge)

    # --- accumulate_steps: two train functions, chosen per batch by the host ---------------

    def accumulation_problem(self) -> Optional[str]:
        return None  # 2.3.1: `accumulate_train_calls` below

    def accumulate_train_calls(self, model: Any, steps: int) -> GroupPlan:
        """`model`'s train function made to accumulate `steps` micro-batches per
        optimizer step; returns the plan the host sets before each batch.

        Keras 2.3's own `_make_train_function` (wrapped on the instance, so a later
        `compile` keeps it) builds two functions over the same forward graph: one adds
        the micro-batch's gradient, weighted by its share of the group's rows, to sums
        kept in variables (`optimizer.get_updates` stood in for while it builds: no
        update, no step counted); the other hands the optimizer, through its own
        `get_updates`, the group's gradient (`get_gradients` of a loss whose gradient
        is the sums plus this micro-batch's share), so clipping sees the whole group's
        gradient and `iterations` counts optimizer steps, as on one device.
        """
        own = getattr(model, "_make_train_function", None)
        if own is None or not hasattr(model, "train_function"):
            raise self.fail("`Model._make_train_function` is missing",
                            "the train function accumulate_steps builds twice")
        plan = GroupPlan(self.keras.backend, steps)

        def make_train_function() -> None:
            if model.train_function is None and getattr(model, "optimizer", None) is not None:
                model.train_function = plan.switching(*self._two_train_functions(model, own, plan))
            own()

        model.__dict__["_make_train_function"] = make_train_function
        return plan

    def _two_train_functions(self, model: Any, own: Callable[[], None],
                             plan: GroupPlan) -> List[Any]:
        """Keras's train function built twice: accumulating, then applying."""
        backend, optimizer = self.keras.backend, model.optimizer
        own_get_gradients = optimizer.get_gradients
        asked: List[bool] = []

        def accumulating(loss: Any, params: Sequence[Any]) -> List[Any]:
            grads = backend.gradients(loss, list(params))
            return [backend.update(total, plan.keep * total + plan.scale * g)
                    for total, g in zip(plan.sums(params), grads) if g is not None]

        def group_gradients(loss: Any, params: Sequence[Any]) -> List[Any]:
            asked.append(True)
            # d/dp of (scale * loss + sum(keep * sums * p)) = scale * dloss/dp + keep * sums
            carried = [backend.sum(backend.stop_gradient(plan.keep * total) * p)
                       for total, p in zip(plan.sums(params), params)]
            return list(own_get_gradients(plan.scale * loss + sum(carried), params))

        functions = []
        for name, replacement in (("get_updates", accumulating),
                                  ("get_gradients", group_gradients)):
            # Put back what stood there: the shared slots' get_updates (keras23_template).
            before = optimizer.__dict__.get(name)
            optimizer.__dict__[name] = replacement
            try:
                own()
            finally:
                if before is None:
                    del optimizer.__dict__[name]
                else:
                    optimizer.__dict__[name] = before
            functions.append(model.train_function)
            model.train_function = None
        if not asked:
            raise self.fail(f"{type(optimizer).__name__}.get_updates does not call "
                            "get_gradients", "where accumulate_steps hands the optimizer "
                            "the group's gradient; use a Keras optimizer")
        return functions


class GroupPlan:
    """Where a micro-batch stands in its optimizer step: its share of the group's real
    rows (`scale`), whether the sums carry over (`keep`: not on a group's first), and
    whether the optimizer applies after it (a group's last, or the epoch's last batch,
    so an incomplete group is applied over the rows it has)."""

    def __init__(self, backend: Any, steps: int) -> None:
        self.backend, self.steps = backend, steps
        self.apply = True
        self._totals: Dict[int, Any] = {}
        self._scale: Any = None
        self._keep: Any = None
        self._rows = (1, 1)  # (the current group's rows, its rows seen so far)
        self._functions: Tuple[Any, ...] = ()
        self._last: Any = None  # the inputs of a micro-batch that did not apply

    @property
    def scale(self) -> Any:
        if self._scale is None:
            self._scale = self.backend.variable(1.0, name="kerasmgpu_group_share")
        return self._scale

    @property
    def keep(self) -> Any:
        if self._keep is None:
            self._keep = self.backend.variable(0.0, name="kerasmgpu_group_keep")
        return self._keep

    def sums(self, params: Sequence[Any]) -> List[Any]:
        """The gradient sums of `params`, one zero variable each, made once."""
        backend = self.backend
        for p in params:
            if id(p) not in self._totals:
                self._totals[id(p)] = backend.zeros(
                    backend.int_shape(p), dtype=p.dtype.base_dtype.name,
                    name="kerasmgpu_gradient_sum")
        return [self._totals[id(p)] for p in params]

    def at(self, batch: int, sizes: Sequence[int]) -> None:
        """Before batch `batch` of an epoch whose batches have `sizes` rows."""
        first = batch - batch % self.steps
        group = list(sizes[first:first + self.steps])
        self.backend.batch_set_value([(self.scale, sizes[batch] / sum(group)),
                                      (self.keep, 0.0 if batch == first else 1.0)])
        self.apply = batch == first + len(group) - 1
        self._rows = (sum(group), sum(sizes[first:batch + 1]))

    def finish(self) -> None:
        """A fit stopped after a micro-batch that did not end its group: the group is
        applied now over the rows it has, as one device's short last batch. The applying
        function runs once more on the last inputs with their share set to 0, so its
        gradient is the sums alone, rescaled from the planned group's rows to those seen
        (Keras's optimizer, its slots and clipping are the same; a BatchNormalization's
        moving statistics see that forward pass once more)."""
        if self.apply or self._last is None:
            return
        planned, seen = self._rows
        self.backend.batch_set_value([(self.scale, 0.0), (self.keep, planned / seen)])
        self._functions[1](self._last)
        self.apply, self._last = True, None

    def switching(self, accumulate: Any, apply: Any) -> Callable[[Any], Any]:
        self._functions, self._last = (accumulate, apply), None

        def train_function(inputs: Any) -> Any:
            self._last = None if self.apply else inputs
            return (apply if self.apply else accumulate)(inputs)

        return train_function


def _as_given(metrics: Any) -> Any:
    """Keras 2.3's compile metrics as the user gave them: a dict per output, else a list."""
    if isinstance(metrics, dict):
        return dict(metrics)
    return list(metrics or [])


def _fresh(metrics: Any) -> Any:
    """A new object for each `Metric` instance: the template's is built on the template's
    graph tensors (its sample-weight placeholder), which the parallel model never feeds."""
    if isinstance(metrics, dict):
        return {key: _fresh(value) for key, value in metrics.items()}
    if isinstance(metrics, (list, tuple)):
        return [_fresh(value) for value in metrics]
    if hasattr(metrics, "get_config") and hasattr(metrics, "update_state"):
        return type(metrics).from_config(metrics.get_config())
    return metrics
