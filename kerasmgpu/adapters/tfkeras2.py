"""tf.keras 2.x (the `keras` 2.12-2.15 package behind `tf.keras`) and tf_keras 2.16+.

Verified on the releases of `env.versions` (`TF_KERAS_*`, `TF_KERAS_LEGACY_*`; the tox
matrix runs tf.keras 2.12, 2.13, 2.15 and tf_keras 2.16, 2.18, 2.21). What is read or
wrapped here:

* `model.compiled_loss` (a `LossesContainer`) and its losses: see `tfkeras2_losses`.
  Its loss trackers: `_total_loss_mean` (2.13+) or `_loss_metric` (2.12), and
  `_per_output_metrics`.
* `model.compiled_metrics` (a `MetricsContainer`): `update_state` wrapped on the
  instance; `build(y_pred, y_true)`, `built`, `metrics` and `_conform_to_outputs`.
* What a compile records beyond its arguments, and a legacy optimizer's slots:
  `tfkeras2_compiled`.
* `model._is_compiled`, `model._compile_config` (2.13+; earlier the containers'
  `_user_losses` / `_user_metrics` ...), `model._distribution_strategy`,
  `model._build_input_shape` (2.12, for subclassed copies), `layer._losses`.
* `optimizer._distribution_strategy`: the strategy it was created under.
* The learning rate is a variable outside `optimizer.variables` (the public
  `optimizer.learning_rate` returns it; `_current_learning_rate` for a schedule).
* `engine.data_adapter._make_class_weight_map_fn`: Keras's own `class_weight` rule,
  called as Keras's `fit` calls it.
* With accumulate_steps: the optimizer's public `apply_gradients` (its
  `skip_gradients_aggregation=`) and `aggregate_gradients`, `apply_gradients` wrapped on
  the instance; the model's `make_train_function` / `train_function` and
  `_steps_per_execution` (tested on 2.12, 2.15, 2.21), which also tells whether a feed
  may come in parts (`steps_per_call`: one step per call).
* verify=True: the public `compute_loss(x, y, y_pred, sample_weight)` and `metrics`
  (the loss trackers it updates are read and written back per replica copy).
* `BatchNormalization._calculate_mean_and_var(inputs, reduction_axes, keep_dims, mask)`
  (the same in 2.12 - 2.21): replaced on the instance for synchronized BatchNorm, and
  `fused` set False there (the fused kernel ignores masks).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.adapters.base import (
    COMPILE_KEYS,
    StateReader,
    class_weight_error,
    following_save,
)
from kerasmgpu.adapters.step_ops import HOOKED
from kerasmgpu.adapters.tfkeras2_compiled import TfKeras2Compiled
from kerasmgpu.env.versions import (
    TF_KERAS_LEGACY_MIN,
    TF_KERAS_LEGACY_VERIFIED_BELOW,
    TF_KERAS_MIN,
    TF_KERAS_VERIFIED_BELOW,
    KerasLine,
)


def _combines_with_sample_weight(tf: Any, map_fn: Callable[..., Any]) -> bool:
    """Whether Keras's class_weight map function takes sample weights of an unknown
    batch size (what its fit hands it): traced once, as tf.data would."""
    specs = (tf.TensorSpec([None]), tf.TensorSpec([None], tf.int64), tf.TensorSpec([None]))
    try:
        tf.function(map_fn).get_concrete_function(*specs)
    except ValueError:
        return False
    return True


class TfKeras2(TfKeras2Compiled):
    DIST = "tensorflow"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.line is KerasLine.TF_KERAS_LEGACY:
            self.VERIFIED = (TF_KERAS_LEGACY_MIN, TF_KERAS_LEGACY_VERIFIED_BELOW)
            self.LABEL = "tf_keras"
            self.DIST = "tf-keras"
        else:
            self.VERIFIED = (TF_KERAS_MIN, TF_KERAS_VERIFIED_BELOW)
            self.LABEL = "tf.keras"

    def is_compiled(self, model: Any) -> bool:
        return bool(getattr(model, "_is_compiled", False))

    def compile_args(self, model: Any) -> Dict[str, Any]:
        config = getattr(getattr(model, "_compile_config", None), "config", None)
        if isinstance(config, dict):
            args = {k: v for k, v in config.items() if k in COMPILE_KEYS}
        else:  # tf.keras 2.12 keeps them only on the containers
            loss = self._container(model, "compiled_loss")
            metrics = self._container(model, "compiled_metrics")
            if loss is None or not hasattr(loss, "_user_losses"):
                raise self.fail("a compiled model has no `compiled_loss._user_losses`",
                                "the compile arguments")
            args = {
                "loss": loss._user_losses,
                "loss_weights": getattr(loss, "_user_loss_weights", None),
                "metrics": getattr(metrics, "_user_metrics", None),
                "weighted_metrics": getattr(metrics, "_user_weighted_metrics", None),
            }
        args["optimizer"] = getattr(model, "optimizer", None) or args.get("optimizer")
        for key in ("run_eagerly", "jit_compile"):
            private = getattr(model, "_" + key, None)
            if private is not None:
                args.setdefault(key, private)
        return args

    def clone_model(self, model: Any) -> Any:
        clone = super().clone_model(model)
        # BatchNormalization's get_config leaves `synchronized` out (2.12 - 2.21), so a
        # copy would drop a layer's own synchronized=True: carried over by position.
        norm = self.keras.layers.BatchNormalization
        pairs = list(zip(self.layers_of(model), self.layers_of(clone)))
        for layer, copy in pairs:
            if isinstance(layer, norm) and isinstance(copy, norm):
                copy.synchronized = getattr(layer, "synchronized", False)
        return clone

    def build_like(self, clone: Any, model: Any) -> None:
        get_config = getattr(model, "get_build_config", None)
        if get_config is not None and getattr(clone, "build_from_config", None) is not None:
            config = get_config()
            if config:
                clone.build_from_config(config)
                return
        shape = getattr(model, "_build_input_shape", None)
        if shape is None:
            raise ValueError("the model was not built with a known input shape")
        clone.build(shape)

    # --- class_weight ---------------------------------------------------------------------

    def class_weight_map_fn(self, class_weight: Any) -> Optional[Callable[..., Any]]:
        # tf.keras applies `data_adapter._make_class_weight_map_fn` to every input kind
        # (its DataHandler makes a dataset of each): the keys must be 0 .. K-1, a class
        # above them fails in `tf.gather`, sample weights are multiplied in (2.12) or
        # fail (2.13+: it reshapes them to a shape with an unknown batch size).
        if not class_weight:
            return None
        module_name = self.keras.Model.__module__.rsplit(".", 1)[0] + ".data_adapter"
        try:
            make = importlib.import_module(module_name)._make_class_weight_map_fn
        except (ImportError, AttributeError) as exc:
            raise self.fail(f"`{module_name}._make_class_weight_map_fn` is missing",
                            "Keras's class_weight rule") from exc
        map_fn: Callable[..., Any] = make(class_weight)  # Keras's own key check
        return map_fn

    def class_weigher(self, class_weight: Any, kind: str
                      ) -> Optional[Callable[[Any, Any], Any]]:
        map_fn = self.class_weight_map_fn(class_weight)
        if map_fn is None:
            return None
        tf = self._tf
        # train_on_batch maps one batch of known size: there Keras combines them.
        combines = kind == "batch" or _combines_with_sample_weight(tf, map_fn)

        def weigh(y: Any, sample_weight: Any) -> Any:
            if sample_weight is not None and not combines:
                raise class_weight_error(
                    class_weight, f"`class_weight` or `sample_weight`, not both: "
                    f"{self.LABEL} {self.version}'s own fit fails on both (\"Cannot convert "
                    "a partially known TensorShape\")",
                    "fold the class weights into `sample_weight`")
            data = [tf.zeros([0]), tf.nest.map_structure(tf.convert_to_tensor, y)]
            if sample_weight is not None:
                data.append(tf.convert_to_tensor(sample_weight))
            with tf.device("/cpu:0"):  # as in tf.data: a class out of range is an error
                weights = map_fn(*data)[2]
            return weights.numpy().astype("float32")

        return weigh

    # --- ops ------------------------------------------------------------------------------

    def to_float(self, x: Any, like: Any = None) -> Any:
        tf = self._tf
        dtype = getattr(like, "dtype", None)
        # Keras hands a metric compiled unweighted the output's bool Keras mask as its
        # sample weight (`MetricsContainer.update_state`, 2.12 - 2.21): a weight to
        # multiply, not a dtype to take (cast to it, the padding mask crashed in
        # tf.keras 2.15: "Value passed to parameter 'x' has DataType bool").
        if dtype is None or not tf.as_dtype(dtype).is_floating:
            dtype = tf.float32
        return tf.cast(x, dtype)

    def multiply(self, a: Any, b: Any) -> Any:
        tf = self._tf
        if getattr(a, "dtype", None) == tf.bool:  # that bool mask (see to_float)
            a = tf.cast(a, getattr(b, "dtype", None) or tf.float32)
        return a * b

    def expand_to_rank(self, w: Any, rank: int) -> Any:
        tf = self._tf
        while w.shape.rank is not None and w.shape.rank < rank:
            w = tf.expand_dims(w, -1)
        return w

    # --- hooks -----------------------------------------------------------------------------

    def install_metrics_hook(self, model: Any, on_metric: Callable[[Any], None]) -> None:
        container = getattr(model, "compiled_metrics", None)
        if container is None:
            return
        container.__dict__[HOOKED + "_fn"] = on_metric
        if container.__dict__.get(HOOKED):
            return
        original = container.update_state

        def update_state(y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
            if not container.built:
                # As Keras's own update_state does first: targets keyed by output
                # names (a dict for a model whose outputs are a list) take the outputs'
                # structure.
                container.build(y_pred, container._conform_to_outputs(y_pred, y_true))
            for metric in container.metrics:
                container.__dict__[HOOKED + "_fn"](metric)
            return original(y_true, y_pred, sample_weight)

        container.__dict__["update_state"] = update_state
        container.__dict__[HOOKED] = True

    def loss_trackers(self, model: Any) -> List[Any]:
        container = self._container(model, "compiled_loss")
        if container is None:
            return []
        trackers = []
        # 2.13+: `_total_loss_mean`; 2.12: `_loss_metric`.
        total = getattr(container, "_total_loss_mean", None) or getattr(
            container, "_loss_metric", None)
        if total is not None:
            trackers.append(total)
        per_output = getattr(container, "_per_output_metrics", None) or []
        trackers.extend(m for m in per_output if m is not None)
        return trackers

    def has_call_time_losses(self, model: Any) -> bool:
        for layer in [model, *model._flatten_layers(include_self=False)]:
            if getattr(layer, "_losses", None):
                return True
        return False

    def check_internals(self, model: Any) -> None:
        if not self.is_compiled(model):
            return
        loss = self._container(model, "compiled_loss")
        if loss is not None:
            for name in ("build", "built"):
                if not hasattr(loss, name):
                    raise self.fail(f"`compiled_loss.{name}` is missing", type(loss).__name__)
            if getattr(loss, "_total_loss_mean", None) is None and getattr(
                    loss, "_loss_metric", None) is None:
                raise self.fail("`compiled_loss` has no loss tracker",
                                "_total_loss_mean / _loss_metric")
        metrics = getattr(model, "compiled_metrics", None)
        needed = ("build", "built", "metrics", "_conform_to_outputs")
        if metrics is not None and not all(hasattr(metrics, n) for n in needed):
            raise self.fail("`compiled_metrics` lacks build/built/metrics/_conform_to_outputs",
                            type(metrics).__name__)
        if not hasattr(model, "_flatten_layers"):
            raise self.fail("models have no `_flatten_layers`", "layer traversal")

    # --- the training state -------------------------------------------------------------

    def state_reader(self, variables: List[Any]) -> StateReader:
        return tf_internals.value_hasher(list(variables))

    def read_values(self, variables: List[Any]) -> List[Any]:
        return list(self.keras.backend.batch_get_value(list(variables)))

    def write_values(self, variables: List[Any], values: List[Any]) -> None:
        self.keras.backend.batch_set_value(list(zip(variables, values)))

    def learning_rate_variable(self, optimizer: Any) -> Any:
        try:
            rate = optimizer.learning_rate  # a schedule's: the variable of its current value
        except (AttributeError, ValueError):
            return None
        return rate if isinstance(rate, self._tf.Variable) else None

    # --- accumulate_steps (`tensorflow.Accumulation`) ------------------------------------

    def accumulation_problem(self) -> Optional[str]:
        return None  # 2.12 - 2.21: `apply_gradients(skip_gradients_aggregation=)`

    def accumulate_gradients(self, optimizer: Any, steps: int) -> bool:
        """The optimizer's public `apply_gradients`, wrapped on the instance: in the
        accumulating trace it adds the replicas' summed gradient to the group's sums;
        in the applying one it applies the group's mean with
        `skip_gradients_aggregation=True` (summed already), clipped whole."""
        held = optimizer.__dict__.get(HOOKED + "_accumulation")
        if held is not None and held.steps == steps:
            return True
        apply = getattr(optimizer, "apply_gradients", None)
        aggregate = getattr(optimizer, "aggregate_gradients", None)
        if (not callable(apply) or not callable(aggregate) or "skip_gradients_aggregation"
                not in inspect.signature(apply).parameters
                or getattr(optimizer, "inner_optimizer", None) is not None):
            raise bad_value(
                "optimizer", f"{type(optimizer).__name__} with accumulate_steps={steps}",
                f"a {self.LABEL} optimizer of `keras.optimizers` (not `.legacy`, no loss "
                "scaling) when accumulate_steps > 1", "compile with e.g. "
                "keras.optimizers.Adam(), or parallelize() with accumulate_steps=1")
        if getattr(optimizer, "iterations", None) is not None and int(
                optimizer.iterations.numpy()) > 0:
            return False
        group = tf_internals.Accumulation(steps)
        optimizer.__dict__[HOOKED + "_accumulation"] = group
        optimizer.__dict__["apply_gradients"] = tf_internals.accumulating_apply_gradients(
            apply, aggregate, lambda: optimizer.__dict__.get(HOOKED + "_accumulation"))
        return True

    def finish_group(self, model: Any, factor: float) -> None:
        optimizer = model.optimizer
        tf_internals.finish_group(optimizer.__dict__[HOOKED + "_accumulation"], optimizer,
                                  list(model.trainable_variables), factor)

    def steps_per_call(self, model: Any) -> int:
        # `_steps_per_execution`: the variable compile makes (2.12 - 2.21).
        value = getattr(model, "_steps_per_execution", None)
        return 1 if value is None else int(value.numpy())

    def accumulate_by_calls(self, model: Any) -> None:
        """`Model.make_train_function` wrapped on the instance (see
        `tensorflow.switching_train_function`); `_steps_per_execution` is the variable
        compile makes (2.12 - 2.21)."""
        optimizer = getattr(model, "optimizer", None)
        if (model.__dict__.get(HOOKED + "_calls")
                or HOOKED + "_accumulation" not in getattr(optimizer, "__dict__", {})):
            return
        original = getattr(model, "make_train_function", None)
        if not callable(original) or not hasattr(model, "train_function"):
            raise self.fail("`make_train_function` / `train_function` are missing",
                            "accumulate_steps")

        model.__dict__["make_train_function"] = tf_internals.switching_train_function(
            model, original,
            lambda: getattr(model, "optimizer", None).__dict__.get(HOOKED + "_accumulation"),
            lambda: self.steps_per_call(model))
        model.__dict__[HOOKED + "_calls"] = True

    def mask_batch_statistics(self, model: Any, row_mask: Callable[[], Any],
                              every: bool = True) -> bool:
        # `BatchNormalization.call(inputs, training, mask)` (public, 2.12+) takes masked
        # moments; the replica's rows are all-reduced by `_calculate_mean_and_var`, and
        # the moving statistics follow the global moments, equal on every replica.
        import tensorflow as tf

        norm = self.keras.layers.BatchNormalization
        for layer in self.layers_of(model):
            if not isinstance(layer, norm) or layer.__dict__.get(HOOKED + "_moments"):
                continue
            if not every and not getattr(layer, "synchronized", False):
                continue
            if getattr(layer, "virtual_batch_size", None) is not None:
                raise bad_value(
                    "sync_batchnorm", True, f"False while layer {layer.name!r} has "
                    f"virtual_batch_size={layer.virtual_batch_size} (ghost batches "
                    "normalize sub-batches: the opposite of synchronizing)",
                    "leave sync_batchnorm out, or drop virtual_batch_size from that layer")
            original = getattr(layer, "_calculate_mean_and_var", None)
            if not callable(original):
                raise self.fail("`BatchNormalization._calculate_mean_and_var` is missing",
                                "synchronized BatchNorm")

            def call(inputs: Any, training: Any = None, mask: Any = None,
                     _original: Any = layer.call) -> Any:
                # Keras's fit passes training=True (a Python bool) to every layer.
                rows = row_mask() if training is True else None
                if rows is not None:
                    shape = tf.shape(inputs)
                    rows = tf.reshape(tf.cast(rows, inputs.dtype),
                                      tf.concat([[-1], tf.ones_like(shape[1:-1])], 0))
                    rows = tf.broadcast_to(rows, shape[:-1])
                    if mask is not None:
                        rows = rows * tf.cast(mask, inputs.dtype)
                    mask = rows
                return _original(inputs, training=training, mask=mask)

            def mean_and_var(inputs: Any, reduction_axes: Any, keep_dims: Any,
                             mask: Any = None, _original: Any = original,
                             _layer: Any = layer) -> Any:
                context = tf.distribute.get_replica_context()
                if context is None:
                    return _original(inputs, reduction_axes, keep_dims, mask=mask)
                mean, variance = tf_internals.replica_moments(
                    context, inputs, mask, reduction_axes,
                    idle=(_layer.moving_mean, _layer.moving_variance))
                if not keep_dims:
                    mean = tf.squeeze(mean, reduction_axes)
                    variance = tf.squeeze(variance, reduction_axes)
                return mean, variance

            layer.__dict__["call"] = call
            layer.__dict__["_calculate_mean_and_var"] = mean_and_var
            layer.fused = False
            layer.__dict__[HOOKED + "_moments"] = True
        return True

    # --- parallelize(verify=True) -----------------------------------------------------------

    def loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                           training: bool, class_weight: Any = None
                           ) -> Optional[Tuple[Any, List[Any]]]:
        loss, *grads = self.replica_loss_and_gradients(model, x, y, sample_weight, training)
        return float(loss.numpy()), [g.numpy() for g in grads]

    @contextlib.contextmanager
    def _trackers_still(self, model: Any, y_pred: Any) -> Iterator[None]:
        """One device's loss of a model built in kerasmgpu.scope(), computed outside a
        replica: its compiled loss updates its loss trackers, sync-on-read variables that
        take no update there ("SyncOnReadVariable does not support `assign_add` in
        cross-replica context"; `verify=True` failed so on every such model). Their
        `update_state` does nothing for the call (the public method, on the instance;
        what `kept_metrics` would put back anyway). The compiled loss's container
        (`model.compiled_loss`, its public `build(y_pred)` and `metrics`; 2.12 - 2.21) is
        built first: it makes its trackers there."""
        tf = self._tf
        # (Inside a replica - `strategy.run` - they take it; anywhere else their strategy
        # is entered around the update, in its cross-replica context.)
        if self.distribution_strategy_of(model) is None or (
                tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()):
            yield
            return
        container = getattr(model, "compiled_loss", None)
        if container is not None and not getattr(container, "built", True):
            container.build(y_pred)  # its trackers are made here (else at its call)
        metrics = [m for m in model.metrics + list(getattr(container, "metrics", None) or [])
                   if hasattr(m, "update_state")]
        held = [(m, m.__dict__.get("update_state")) for m in metrics]
        for metric in metrics:
            metric.__dict__["update_state"] = lambda *args, **kwargs: None
        try:
            yield
        finally:
            for metric, own in held:
                if own is None:
                    metric.__dict__.pop("update_state", None)
                else:
                    metric.__dict__["update_state"] = own

    def replica_loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                                   training: bool) -> List[Any]:
        """The model's call and its public `compute_loss` (2.12 - 2.21) under a gradient
        tape, as Keras's `train_step` computes them (inside a tf.distribute replica its
        compiled loss divides by the replica count); the loss trackers that compiled loss
        updates are put back by `kept_metrics`."""
        tf = self._tf

        def tensors(value: Any) -> Any:
            return tf.nest.map_structure(
                lambda leaf: leaf if leaf is None else tf.convert_to_tensor(leaf), value)

        x, y, sample_weight = tensors(x), tensors(y), tensors(sample_weight)
        variables = list(model.trainable_variables)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=training)
            with self._trackers_still(model, y_pred):
                loss = model.compute_loss(x, y, y_pred, sample_weight)
        grads = tape.gradient(loss, variables)
        # An Embedding's gradient is IndexedSlices: dense, to be summed and compared.
        return [loss] + [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                         for g, v in zip(grads, variables)]

    @contextlib.contextmanager
    def kept_metrics(self, model: Any) -> Iterator[None]:
        """tf.keras's compiled loss updates its loss trackers at every call (its
        `_total_loss_mean` / `_loss_metric` and per-output means): their values are read
        per replica copy before and written back after; trackers the call built are left
        at zero, as Keras makes them."""
        strategy = self.distribution_strategy_of(model)

        def copies(variable: Any) -> List[Any]:
            if strategy is None:
                return [variable]
            return list(strategy.experimental_local_results(variable))

        def variables() -> List[Any]:
            return [v for metric in model.metrics for v in metric.variables]

        held = {id(v): [c.numpy() for c in copies(v)] for v in variables()}
        try:
            yield
        finally:
            for variable in variables():
                saved = held.get(id(variable))
                for index, copy in enumerate(copies(variable)):
                    copy.assign(saved[index] if saved is not None
                                else self._tf.zeros_like(copy))

    def layers_of(self, model: Any) -> List[Any]:
        metric = self.keras.metrics.Metric
        return [layer for layer in model._flatten_layers(include_self=True, recursive=True)
                if not isinstance(layer, metric)]

    def compile_token(self, model: Any) -> Tuple[Any, ...]:
        return (getattr(model, "optimizer", None), self._container(model, "compiled_loss"),
                self._container(model, "compiled_metrics"))

    def optimizer_strategy(self, optimizer: Any) -> Any:
        return getattr(optimizer, "_distribution_strategy", None)

    # --- engines ----------------------------------------------------------------------------

    def distribution_strategy_of(self, model: Any) -> Any:
        return getattr(model, "_distribution_strategy", None)

    def equalize_replica_state(self, model: Any, strategy: Any) -> None:
        if strategy is None:
            return
        # BatchNormalization's moving statistics are sync-on-read (MEAN) here: each
        # replica updates its own copy from its shard and reads outside a replica give
        # their mean, which the template receives; the replicas get it too.
        tf_internals.equalize_across_replicas(model.non_trainable_variables, strategy)

    # --- BackupAndRestore ----------------------------------------------------------------
    # tf.keras 2.x / tf_keras: `BackupAndRestore._backup(epoch, batch)` has the
    # `WorkerTrainingState` its on_train_begin built (`_training_state`) save a TF
    # checkpoint through `write_checkpoint_manager` - under `backup_dir/chief` on the
    # chief, into a temporary directory it then removes on the other workers (every
    # worker takes part: reading a synchronised variable is a collective) - holding
    # `ckpt_saved_epoch`/`ckpt_saved_batch`; on_train_begin restores from
    # `backup_dir/chief`. kerasmgpu replaces `_backup` on the instance and saves that
    # manager's checkpoint object (a public `tf.train.Checkpoint`) with a
    # `tf.train.CheckpointManager` of its own into the directory it is given; a resume
    # points `backup_dir` (public) at the chosen generation during on_train_begin. fit
    # continues a restored epoch at the next step but reads the data from its start. The
    # same in the sources of tf.keras 2.12, 2.13, 2.15 and tf_keras 2.16, 2.18, 2.21; run
    # on tf_keras 2.21.

    backup_resumes_mid_epoch = True
    backups_are_collective = True

    def _backup_save(self, backup: Any) -> Any:
        save = getattr(backup, "_backup", None)
        if not callable(save):
            raise self.fail("BackupAndRestore has no `_backup`", "an exact mid-epoch resume")
        return getattr(save, "__wrapped__", save)

    def follow_backup(self, backup: Any, on_save: Callable[[Callable[[str], None]], None],
                      allow: Callable[[], bool]) -> bool:
        save = self._backup_save(backup)

        def redirect(directory: str, run: Callable[[], None]) -> None:
            state = getattr(backup, "_training_state", None)
            checkpoint = getattr(getattr(state, "write_checkpoint_manager", None),
                                 "checkpoint", None)
            if checkpoint is None:
                raise self.fail("BackupAndRestore has no `_training_state` with a "
                                "write_checkpoint_manager", "a backup written as one set")
            # What Keras's back_up() writes, under `directory/chief` as Keras names it.
            self._tf.train.CheckpointManager(
                checkpoint, os.path.join(directory, "chief"), max_to_keep=1).save()

        backup._backup = following_save(save, on_save, allow, redirect)
        return True

    def restore_from(self, backup: Any, directory: Optional[str]) -> None:
        own = backup.__dict__.setdefault("_kerasmgpu_backup_dir", backup.backup_dir)
        backup.backup_dir = own if directory is None else directory

    def unfollow_backup(self, backup: Any) -> None:
        original = getattr(getattr(backup, "_backup", None), "__wrapped__", None)
        if original is not None:
            backup._backup = original
        if "_kerasmgpu_backup_dir" in backup.__dict__:
            self.restore_from(backup, None)

    def save_backup(self, backup: Any, epoch: int, batch: int) -> bool:
        self._backup_save(backup)
        backup._backup(epoch=epoch, batch=batch)
        return True
