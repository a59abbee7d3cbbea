"""Keras 3 on TensorFlow: what differs from JAX and torch (`tf.distribute` replicas).

Verified on Keras `env.versions.KERAS3_TF_MIN` (3.10) to below `KERAS3_VERIFIED_BELOW`
with TensorFlow (the tox matrix runs 3.10 and 3.15); the internals every backend shares
are in `keras3`. What is read or wrapped here:

* optimizers: `_backend_apply_gradients`, `_all_reduce_sum_gradients` (see
  `reduce_gradients_first`; with accumulate_steps also the public `apply`, wrapped on
  the instance), and for `gradient_accumulation_steps` `_iterations`,
  `_clip_gradients`, `_apply_weight_decay`, `_backend_update_step`
  (`carry_own_accumulation`); models: `_maybe_symbolic_build`, given an element spec
  (`build_without_peeking`), and with accumulate_steps `make_train_function` /
  `train_function` (`accumulate_by_calls`).
* `BatchNormalization._moments` / `_reduction_axes`: the moments over every replica's
  kept rows (`_batch_moments`).
* verify=True: the public `stateless_call` / `stateless_compute_loss` under a
  `tf.GradientTape`.
* change tokens (`state_reader`): a hash of each tf.Variable
  (`tensorflow.value_hasher`).
* `optimizer._distribution_strategy` and `model._distribute_strategy`: the
  tf.distribute strategy each was created under.
* `Layer._losses`: the list `add_loss` extends and `_clear_losses` empties at each
  outermost call, one per layer object. MirroredStrategy runs each replica's step in a
  thread of its own on the same layers, so a replica entering the model emptied the
  list another had filled, and read that replica's terms as its own (an activity
  regularizer or `add_loss` before a synchronized BatchNormalization, whose all-reduce
  holds the threads together: weights 1e-2 off one device after one step, plain
  `MirroredStrategy` with `synchronized=True` the same). `losses_per_replica` gives
  each layer instance a list per thread (`PerThreadLosses`). Read in Keras 3.10 and
  3.15 (`layers/layer.py`: `add_loss`, `_get_own_losses`, `_clear_losses`).
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Iterator, List, Optional

from kerasmgpu._errors import bad_value
from kerasmgpu.adapters import tensorflow as tf_internals
from kerasmgpu.adapters.base import StateReader
from kerasmgpu.adapters.keras3 import Keras3
from kerasmgpu.adapters.step_ops import HOOKED


class Keras3TensorFlow(Keras3):
    """Keras 3 on TensorFlow: each replica of a `tf.distribute` strategy runs the step on
    its shard, and kerasmgpu carries out gradient accumulation itself."""

    def unscale_for_replicas(self, loss: Any) -> Any:
        # Keras 3 on TensorFlow divides every loss by the replica count inside a
        # tf.distribute replica (losses/loss.py scale_loss_for_distribution; its own
        # steps multiply back before tracking). JAX and torch see global values.
        import tensorflow as tf

        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return loss * tf.cast(replicas, loss.dtype) if replicas > 1 else loss

    def loss_reading_as_one_device(self, loss: Any) -> Any:
        # The value of `unscale_for_replicas`, the gradient of the scaled loss: what the
        # replicas' gradients sum to stays one device's gradient.
        if loss is None:
            return loss
        import tensorflow as tf

        return loss + tf.stop_gradient(self.unscale_for_replicas(loss) - loss)

    @property
    def counts_per_replica(self) -> bool:
        return True

    @property
    def output_losses_weigh_steps(self) -> bool:
        # Keras 3 (3.5 - 3.15) updates a per-output loss tracker with
        # `sample_weight=y_pred.shape[0]`: None in one device's traced step, whose feed
        # batches rows without `drop_remainder`, so each step weighs 1 whatever its rows.
        # kerasmgpu's full batches have a static size and its last batch a step of its
        # own: weighing them by rows would weigh the short batch less than one device.
        return True

    @property
    def whole_batch_on_batch(self) -> bool:
        # Keras 3 on TF (3.10 - 3.15): `train_on_batch` / `test_on_batch` run the step
        # through `strategy.run` on their arguments as they are, one whole batch per
        # replica; a replica's metric updates then counted it N times, which Keras 3.10 -
        # 3.12, whose *_on_batch keep the state a fit left behind, added to fit's counts.
        return True

    def replica_share(self, structures: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return structures
        replicas = context.num_replicas_in_sync
        replica = context.replica_id_in_sync_group

        def share(t: Any) -> Any:
            rows = tf.shape(t)[0] // replicas
            return t[rows * replica:rows * (replica + 1)]

        return tuple(None if s is None else tf.nest.map_structure(share, s)
                     for s in structures)

    def replica_mean(self, x: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return x
        return context.all_reduce(tf.distribute.ReduceOp.MEAN, x)

    def _batch_moments(self, layer: Any) -> Callable[[Any, Any], Any]:
        """`BatchNormalization._moments(inputs, mask)` over every replica's kept rows.

        Under tf.distribute each replica holds its shard (`tensorflow.replica_moments`).
        Keras's own `synchronized=True` keeps the padding rows in.
        Verified on Keras 3.10 - 3.15 (`_moments`, `_reduction_axes`).
        """
        import tensorflow as tf

        original = getattr(layer, "_moments", None)
        if not callable(original) or not hasattr(layer, "_reduction_axes"):
            raise self.fail("`BatchNormalization._moments` / `_reduction_axes` is missing",
                            "synchronized BatchNorm")

        def moments(inputs: Any, mask: Any) -> Any:
            context = tf.distribute.get_replica_context()
            if context is None:
                return original(inputs, mask)
            mean, variance = tf_internals.replica_moments(
                context, inputs, mask, layer._reduction_axes,
                idle=(layer.moving_mean, layer.moving_variance))
            return tf.squeeze(mean), tf.squeeze(variance)

        return moments

    def accumulate_gradients(self, optimizer: Any, steps: int) -> bool:
        """Keras 3 on TF: kerasmgpu accumulates (Keras's own fails under MirroredStrategy:
        `merge_call` inside its `cond`) - `tensorflow.Accumulation`, read by the hooks of
        `reduce_gradients_first` and `accumulate_by_calls`."""
        held = optimizer.__dict__.get(HOOKED + "_accumulation")
        if held is not None and held.steps == steps:
            return True
        if getattr(optimizer, "inner_optimizer", None) is not None:
            raise bad_value(
                "optimizer", f"{type(optimizer).__name__} with accumulate_steps={steps} on "
                "TensorFlow", "an optimizer without loss scaling when accumulate_steps > 1 "
                "on TensorFlow (its finiteness check and scale would count micro-batches)",
                "train in float32 (no mixed_float16 policy), or parallelize() with "
                "accumulate_steps=1")
        if getattr(optimizer, "built", False):
            return False
        optimizer.__dict__[HOOKED + "_accumulation"] = tf_internals.Accumulation(steps)
        return True

    def carry_own_accumulation(self, optimizer: Any) -> None:
        steps = self.own_accumulation(optimizer)
        if steps == 1:
            return
        held = optimizer.__dict__.get(HOOKED + "_accumulation")
        if held is not None and held.steps == steps:
            return
        problem = (
            "an optimizer with loss scaling (its finiteness check would count micro-batches)"
            if getattr(optimizer, "inner_optimizer", None) is not None else
            "EMA (use_ema=True: its averages move at every micro-batch, outside the update)"
            if getattr(optimizer, "use_ema", False) else
            "an optimizer that has trained already (its accumulators hold a group)"
            if getattr(optimizer, "built", False) else None)
        if problem is not None:
            raise bad_value(
                "optimizer", f"{type(optimizer).__name__}(gradient_accumulation_steps="
                f"{steps}) on TensorFlow with {problem}",
                "gradient_accumulation_steps on TensorFlow without loss scaling or EMA, "
                "before the first fit (kerasmgpu carries it out: Keras's own fails under "
                "MirroredStrategy, merge_call inside a cond)",
                "drop gradient_accumulation_steps and pass parallelize(model, "
                "accumulate_steps=k), or train without use_ema / mixed_float16")
        for name in ("_iterations", "_clip_gradients", "_apply_weight_decay",
                     "_backend_update_step"):
            if not hasattr(optimizer, name):
                raise self.fail(f"`{name}` is missing", "gradient_accumulation_steps")

        def update(grads: Any, variables: Any) -> Any:
            # BaseOptimizer._backend_apply_gradients's update branch (3.10 - 3.15): the
            # group's mean clipped, weight decay, the update step.
            grads = optimizer._clip_gradients(grads)
            optimizer._apply_weight_decay(variables)
            return optimizer._backend_update_step(grads, variables, optimizer.learning_rate)

        optimizer.__dict__[HOOKED + "_accumulation"] = tf_internals.Accumulation(
            steps, counted=lambda: int(optimizer._iterations.numpy()), update=update)

    def finish_group(self, model: Any, factor: float) -> None:
        """kerasmgpu's sums (`tensorflow.finish_group`)."""
        optimizer = model.optimizer
        tf_internals.finish_group(optimizer.__dict__[HOOKED + "_accumulation"],
                                  optimizer, list(model.trainable_variables), factor)

    def accumulate_by_calls(self, model: Any) -> None:
        """Keras 3 on TF, accumulating: the train function, traced twice (accumulating,
        applying), and the one to run chosen before each micro-batch.

        `TensorFlowTrainer.make_train_function` (3.10 - 3.15: it stores
        `_make_function(train_step)` in `train_function`, which `fit` calls once per
        micro-batch after one `make_train_function()` at its start) is wrapped on the
        instance: each fit starts a group with zero sums.
        """
        optimizer = getattr(model, "optimizer", None)
        if (model.__dict__.get(HOOKED + "_calls")
                or HOOKED + "_accumulation" not in getattr(optimizer, "__dict__", {})):
            return
        original = getattr(model, "make_train_function", None)
        if not callable(original) or not hasattr(model, "train_function"):
            raise self.fail("`make_train_function` / `train_function` are missing",
                            "accumulate_steps on TensorFlow")

        model.__dict__["make_train_function"] = tf_internals.switching_train_function(
            model, original, lambda: model.optimizer.__dict__.get(HOOKED + "_accumulation"),
            lambda: int(getattr(model, "steps_per_execution", 1) or 1))
        model.__dict__[HOOKED + "_calls"] = True

    def state_reader(self, variables: List[Any]) -> StateReader:
        # A hash of each tf.Variable's value (`tensorflow.value_hasher`).
        variables = self._backend_values(list(variables))
        return tf_internals.value_hasher([v.value for v in variables])

    def replica_loss_and_gradients(self, model: Any, x: Any, y: Any, sample_weight: Any,
                                   training: bool) -> List[Any]:
        """Inside a tf.distribute replica a variable's value is the replica's own copy,
        and Keras divides the loss by the replica count there, as in its step."""
        loss_of = self._stateless_loss(model, x, y, sample_weight, training)
        import tensorflow as tf

        trainable = [tf.convert_to_tensor(v.value) for v in model.trainable_variables]
        with tf.GradientTape() as tape:
            tape.watch(trainable)
            loss = loss_of(trainable,
                           [tf.convert_to_tensor(v.value) for v in model.non_trainable_variables],
                           [tf.convert_to_tensor(v.value) for v in model.metrics_variables])
        grads = tape.gradient(loss, trainable)
        # An Embedding's gradient is IndexedSlices: dense, to be summed and compared.
        return [loss] + [tf.zeros_like(v) if g is None else tf.convert_to_tensor(g)
                         for g, v in zip(grads, trainable)]

    def losses_per_replica(self, model: Any) -> None:
        for layer in self.layers_of(model):
            own = layer.__dict__.get("_losses")
            if isinstance(own, PerThreadLosses):
                continue
            if not isinstance(own, list):
                raise self.fail("`Layer._losses` is not a list",
                                "the terms add_loss collects in a call")
            # Past Keras's attribute tracking, which would wrap a list it is given.
            object.__setattr__(layer, "_losses", PerThreadLosses(own))

    def build_without_peeking(self, model: Any) -> None:
        """Keras 3 on TF: fit/evaluate build the model from the data's element spec, as
        on one device, instead of a batch pulled through a throw-away iterator.

        With a strategy, `TensorFlowTrainer._maybe_symbolic_build` reads one batch of a
        fresh iterator (one device builds when the step is traced), and each new
        iterator of a tf.data pipeline draws its next reshuffle: one device's first
        epoch would be the parallel model's second permutation. `_symbolic_build` uses
        only each tensor's shape and dtype, which a `tf.data` element spec holds.
        Verified on Keras 3.10 - 3.15 (`backend/tensorflow/trainer.py`).
        """
        if model.__dict__.get(HOOKED + "_build"):
            return
        original = getattr(model, "_maybe_symbolic_build", None)
        if not callable(original):
            raise self.fail("`TensorFlowTrainer._maybe_symbolic_build` is missing",
                            "the build fit/evaluate run under a strategy")
        dataset_adapter = getattr(self._data_adapters("tf_dataset_adapter"),
                                  "TFDatasetAdapter", None)

        def maybe_symbolic_build(iterator: Any = None, data_batch: Any = None) -> Any:
            adapter = getattr(iterator, "data_adapter", None)
            if (data_batch is None and dataset_adapter is not None
                    and isinstance(adapter, dataset_adapter)):
                return original(data_batch=adapter.get_tf_dataset().element_spec)
            return original(iterator=iterator, data_batch=data_batch)

        model.__dict__["_maybe_symbolic_build"] = maybe_symbolic_build
        model.__dict__[HOOKED + "_build"] = True

    def reduce_gradients_first(self, optimizer: Any) -> None:
        """Keras 3 on TF: the optimizer transforms the global batch's gradient.

        Under tf.distribute, `BaseOptimizer._backend_apply_gradients` clips (clipnorm,
        global_clipnorm, clipvalue) and accumulates each replica's own gradient; only
        `TFOptimizer._backend_update_step` sums them over the replicas
        (`_all_reduce_sum_gradients`). One device clips the sum. Here the sum is taken
        on entry to `_backend_apply_gradients` - the same one all-reduce, moved before
        the transforms - and the later one passes the reduced gradients through. A
        LossScaleOptimizer's inner optimizer is reduced the same way, and its finiteness
        check is agreed by every replica (Keras takes replica 0's). Verified on Keras
        3.10 - 3.15 (`keras/src/optimizers/base_optimizer.py`,
        `keras/src/backend/tensorflow/optimizer.py`, `loss_scale_optimizer.py`).
        """
        if optimizer is None:
            return
        inner = getattr(optimizer, "inner_optimizer", None)
        if inner is not None:
            self._agree_on_finite(optimizer)
            optimizer = inner
        self._skip_apply_while_accumulating(optimizer)
        if optimizer.__dict__.get(HOOKED + "_reduce"):
            return
        apply = getattr(optimizer, "_backend_apply_gradients", None)
        reduce = getattr(optimizer, "_all_reduce_sum_gradients", None)
        if not callable(apply) or not callable(reduce):
            raise self.fail("`_backend_apply_gradients` / `_all_reduce_sum_gradients` are "
                            "missing", type(optimizer).__name__)
        marked = optimizer.__dict__
        group = lambda: marked.get(HOOKED + "_accumulation")  # noqa: E731
        early_apply, late_reduce = tf_internals.reduce_before(apply, reduce, group)
        optimizer.__dict__["_backend_apply_gradients"] = early_apply
        optimizer.__dict__["_all_reduce_sum_gradients"] = late_reduce
        optimizer.__dict__[HOOKED + "_reduce"] = True

    def _skip_apply_while_accumulating(self, optimizer: Any) -> None:
        # Accumulating, `apply` itself is skipped: it counts a step (`_iterations`, which
        # Adam's bias correction reads) and applies constraints after the update. Not for
        # the optimizer's own accumulation, whose `apply` counts every micro-batch.
        marked = optimizer.__dict__
        group = marked.get(HOOKED + "_accumulation")
        if group is None or group.own or marked.get(HOOKED + "_skip"):
            return
        reduce = getattr(optimizer, "_all_reduce_sum_gradients", None)
        if not callable(reduce):
            raise self.fail("`_all_reduce_sum_gradients` is missing", type(optimizer).__name__)
        marked["apply"] = tf_internals.accumulating_apply(
            optimizer.apply, reduce, lambda: marked.get(HOOKED + "_accumulation"),
            lambda: getattr(optimizer, "loss_scale_factor", None))
        marked[HOOKED + "_skip"] = True

    def _agree_on_finite(self, optimizer: Any) -> None:
        check = getattr(optimizer, "check_finite", None)
        if not callable(check):
            raise self.fail("`LossScaleOptimizer.check_finite` is missing",
                            type(optimizer).__name__)
        if not optimizer.__dict__.get(HOOKED + "_finite"):
            optimizer.__dict__["check_finite"] = tf_internals.all_replicas_agree(check)
            optimizer.__dict__[HOOKED + "_finite"] = True

    # --- the strategy (engines.mirrored) ---------------------------------------------

    def optimizer_strategy(self, optimizer: Any) -> Any:
        """The tf.distribute strategy an optimizer's variables belong to."""
        return getattr(optimizer, "_distribution_strategy", None)

    def distribution_strategy_of(self, model: Any) -> Any:
        return getattr(model, "_distribute_strategy", None)

    def equalize_replica_state(self, model: Any, strategy: Any) -> None:
        if strategy is None:
            return
        # BatchNormalization's moving statistics are mirrored on-write variables in
        # Keras 3 whose per-replica copies each follow their own shard (reads return
        # replica 0's); kerasmgpu averages them, so every replica and the template hold
        # one state.
        tf_internals.equalize_across_replicas(
            [getattr(v, "value", v) for v in model.non_trainable_variables], strategy)


class PerThreadLosses:
    """A layer's `_losses` as each thread sees it: the list a thread filled or emptied
    itself, and where it has none (a read outside any replica's step) the list last
    written. The operations Keras's `Layer` uses (extend, append, clear, copy by slice,
    len, iteration, truth)."""

    def __init__(self, items: List[Any]) -> None:
        self._lists: Dict[int, List[Any]] = {}
        self._latest: List[Any] = list(items)
        self._lock = threading.Lock()

    def _own(self) -> List[Any]:
        with self._lock:
            mine = self._lists.get(threading.get_ident())
            if mine is None:
                mine = self._lists[threading.get_ident()] = []
            self._latest = mine
            return mine

    def _seen(self) -> List[Any]:
        with self._lock:
            found: Optional[List[Any]] = self._lists.get(threading.get_ident())
            return self._latest if found is None else found

    def extend(self, items: Any) -> None:
        self._own().extend(items)

    def append(self, item: Any) -> None:
        self._own().append(item)

    def clear(self) -> None:
        self._own().clear()

    def __getitem__(self, index: Any) -> Any:
        return self._seen()[index]

    def __len__(self) -> int:
        return len(self._seen())

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._seen()))

    def __bool__(self) -> bool:
        return bool(self._seen())

    def __deepcopy__(self, memo: Any) -> PerThreadLosses:
        return PerThreadLosses([])

    def __copy__(self) -> PerThreadLosses:
        return PerThreadLosses([])
