"""The models of the Keras guides, on 2 and 3 devices, against one device.

Written from the patterns the Keras guides teach (our own code): a custom `train_step`
on each backend (TensorFlow's GradientTape, JAX's stateless step), `fit(x)` without
targets for a model trained by `add_loss` (an autoencoder, the guide's VAE), a GAN with two optimizers, multi-input /
multi-output models with dict inputs and per-output losses and metrics, per-element
and sequence losses, BatchNormalization and Dropout, a Sequential without an `Input`.
Where the math allows (no randomness, no per-replica batch statistics) the parallel
model must give one device's numbers; elsewhere it must train, and the template and the
parallel model must agree.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import (
    _VERSION,
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_TF,
    REPLICAS,
    assert_history_close,
    assert_weights_close,
    deterministic_weights,
    keras_module,
    one_replica_count,
    requires,
    seed_all,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

pytestmark = requires(in_process=True)

if IN_PROCESS:
    keras = keras_module()
KERAS3 = LINE is KerasLine.KERAS_3

RNG = np.random.default_rng(7)
X = RNG.normal(size=(61, 6)).astype("float32")
Y = (X @ RNG.normal(size=(6, 1)) + 0.1 * RNG.normal(size=(61, 1))).astype("float32")


def _stateless_update(model, loss_of, state, data):
    """The JAX guide's stateless update of a custom train_step: `loss_of(trainable,
    non_trainable, x, y)` -> (loss, non_trainable) differentiated and applied; returns
    (loss, trainable, non_trainable, optimizer_vars)."""
    import jax

    trainable, non_trainable, optimizer_vars, _ = state
    x, y = data
    (loss, non_trainable), grads = jax.value_and_grad(loss_of, has_aux=True)(
        trainable, non_trainable, x, y)
    trainable, optimizer_vars = model.optimizer.stateless_apply(optimizer_vars, grads,
                                                                trainable)
    return loss, trainable, non_trainable, optimizer_vars


def _guide_model_class():
    """The "Customizing what happens in fit()" model: its own train_step, `x, y = data`."""
    if ON_JAX:
        import jax

        class GuideModel(keras.Model):
            def compute_loss_and_updates(self, trainable, non_trainable, x, y, training=False):
                y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                            training=training)
                loss = self.compute_loss(x, y, y_pred)
                return loss, (y_pred, non_trainable)

            def train_step(self, state, data):
                trainable, non_trainable, optimizer_vars, metrics_vars = state
                x, y = data
                grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)
                (loss, (y_pred, non_trainable)), grads = grad_fn(
                    trainable, non_trainable, x, y, training=True)
                trainable, optimizer_vars = self.optimizer.stateless_apply(
                    optimizer_vars, grads, trainable)
                new_metrics_vars, logs = [], {}
                for metric in self.metrics:
                    start = len(new_metrics_vars)
                    this = metrics_vars[start:start + len(metric.variables)]
                    if metric.name == "loss":
                        this = metric.stateless_update_state(this, loss)
                    else:
                        this = metric.stateless_update_state(this, y, y_pred)
                    logs[metric.name] = metric.stateless_result(this)
                    new_metrics_vars += this
                return logs, (trainable, non_trainable, optimizer_vars, new_metrics_vars)

        return GuideModel
    import tensorflow as tf

    if KERAS3:

        class GuideModel(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    loss = self.compute_loss(y=y, y_pred=y_pred)
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply(gradients, self.trainable_variables)
                for metric in self.metrics:
                    if metric.name == "loss":
                        metric.update_state(loss)
                    else:
                        metric.update_state(y, y_pred)
                return {m.name: m.result() for m in self.metrics}

        return GuideModel

    class GuideModel(keras.Model):  # tf.keras / tf_keras guide form
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            self.compiled_metrics.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    return GuideModel


def _guide_model():
    seed_all(keras, 3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="tanh")(inputs)
    model = _guide_model_class()(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 3)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


@pytest.mark.core
@one_replica_count(3)
def test_custom_train_step_gets_x_y_and_matches_one_device(replicas: int) -> None:
    """61 rows, batch 10: the last batch (1 row) is padded; the guide's step is exact."""
    single, template = _guide_model(), _guide_model()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # exact: no padding warning expected
        h2 = pmodel.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    np.testing.assert_allclose(single.predict(X, verbose=0), pmodel.predict(X, verbose=0),
                               atol=1e-5)


def _tracker_model_class():
    """The guide's own `Mean("loss")` tracker of compute_loss's value, per backend."""
    if ON_JAX:

        class TrackerModel(keras.Model):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.tracked = keras.metrics.Mean(name="loss")

            @property
            def metrics(self):
                return [self.tracked]

            def loss_of(self, trainable, non_trainable, x, y):
                y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                            training=True)
                return self.compute_loss(x, y, y_pred), non_trainable

            def train_step(self, state, data):
                loss, trainable, non_trainable, optimizer_vars = _stateless_update(
                    self, self.loss_of, state, data)
                metrics_vars = self.tracked.stateless_update_state(state[3], loss)
                return ({"loss": self.tracked.stateless_result(metrics_vars)},
                        (trainable, non_trainable, optimizer_vars, metrics_vars))

        return TrackerModel
    import tensorflow as tf

    class TrackerModel(keras.Model):  # type: ignore[no-redef]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.tracked = keras.metrics.Mean(name="loss")

        @property
        def metrics(self):
            return [self.tracked]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            self.tracked.update_state(loss)
            return {"loss": self.tracked.result()}

    return TrackerModel


def _small(cls, seed, **compile_args):
    """A functional model of class `cls` (6 features, a tanh layer of 4, one output),
    its weights drawn from `seed`, compiled with `compile_args`."""
    seed_all(keras, seed)
    inputs = keras.Input((6,))
    model = cls(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="tanh")(inputs)))
    deterministic_weights(model, seed)
    model.compile(**compile_args)
    return model


@pytest.mark.core
def test_a_loss_left_unreduced_is_refused_and_its_sum_trains_as_on_one_device() -> None:
    """reduction='none' in compile: Keras's own step differentiates the per-row losses as
    their sum and History averages them weighing each by its batch's size - the weights
    came out one device's, History's loss 1.04 for 0.41 (Keras 3 + TensorFlow), 0.35 for
    0.41 (tf_keras), silently (JAX: Keras's own error). Refused at parallelize(); the
    fix it names, reduction='sum', trains as on one device (61 rows: a short batch)."""

    class Handing(keras.Model):  # Keras's own step reduces the values: refused too
        def train_step(self, *args):
            return super().train_step(*args)

    def build(reduction, cls=keras.Model):
        return _small(cls, 5, optimizer=keras.optimizers.SGD(0.01),
                      loss=keras.losses.MeanSquaredError(reduction=reduction))

    for cls in (keras.Model, Handing):
        template = build("none", cls)
        start = [np.array(w) for w in template.get_weights()]
        with pytest.raises(ValueError, match=r"Received: loss=MeanSquaredError\(reduction="
                           r"'none'\)\. Allowed: .*Fix: compile with reduction='sum'"):
            kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
        for a, b in zip(start, template.get_weights()):
            np.testing.assert_array_equal(a, b)
    single, template = build("sum"), build("sum")
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0)
    expected = single.fit(X, Y, **fit)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    assert_history_close(expected, pmodel.fit(X, Y, **fit))
    assert_weights_close(single, template)
    # Compiled so afterwards: refused before anything is compiled.
    with pytest.raises(ValueError, match=r"reduction='none'"):
        pmodel.compile(optimizer=keras.optimizers.SGD(0.01),
                       loss=keras.losses.MeanSquaredError(reduction="none"))


@pytest.mark.core
def test_a_step_handing_over_to_keras_reads_one_devices() -> None:
    """A model class whose train_step and test_step hand over to Keras's
    (`return super().train_step(data)`, around logging of its own): a step of the user's,
    whose compute_loss kerasmgpu reads as one device's - and Keras's own step then
    unscaled it again for its tracker: History's loss and val_loss 3 times one device's
    on 3 replicas (Keras 3 + TensorFlow), silently. Now Keras's own code calling
    compute_loss gets it as Keras does."""

    class Handing(keras.Model):
        def train_step(self, *args):  # (data), or on JAX (state, data)
            return super().train_step(*args)

        def test_step(self, *args):
            return super().test_step(*args)

    def build():
        return _small(Handing, 6, optimizer=keras.optimizers.SGD(0.05), loss="mse",
                      metrics=["mae"])

    single, template = build(), build()
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0, validation_data=(X, Y))
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    assert_history_close(single.fit(X, Y, **fit), pmodel.fit(X, Y, **fit))
    assert_weights_close(single, template)
    np.testing.assert_allclose(pmodel.evaluate(X, Y, batch_size=10, verbose=0),
                               single.evaluate(X, Y, batch_size=10, verbose=0), rtol=1e-5)


@pytest.mark.core
@pytest.mark.skipif(not ON_TF, reason="where each replica runs its own step: TensorFlow "
                    "(torch: tests/test_distributed.py's job; JAX runs one program)")
@pytest.mark.parametrize("where", ["train_step", "compute_loss", "ema"])
def test_a_step_of_yours_assigning_variables_is_named_and_an_average_of_weights_exact(
        where: str) -> None:
    """A train_step counting the rows it is given in a variable of the model's: each
    replica ran it on its share and TensorFlow combined the replicas' values - 8232 for
    one device's 44 aggregated by the sum (Keras 3.15 + TensorFlow), silently. Such a
    step - or a compute_loss of the model's (it runs in the step) - is named in a
    warning at parallelize(). No made-up rows can tell it from a step keeping an average
    of the weights after the optimizer (Keras's DDIM example), which every replica
    computes alike: that one ("ema", built in scope, as its other state requires)
    trains as on one device, with the warning."""
    import tensorflow as tf

    class Counting(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            how = "sum" if KERAS3 else tf.VariableAggregation.SUM
            self.rows = self.add_weight(name="rows", shape=(), initializer="zeros",
                                        trainable=False, aggregation=how)

        def train_step(self, data):
            self.rows.assign_add(tf.cast(tf.shape(data[0])[0], "float32"))
            return super().train_step(data)

    class Losing(Counting):
        train_step = keras.Model.train_step

        def compute_loss(self, *args, **kwargs):
            self.rows.assign_add(1.0)
            return super().compute_loss(*args, **kwargs)

    class Averaging(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.shadow = [self.add_weight(name=f"ema{i}", shape=w.shape, trainable=False,
                                           initializer="zeros")
                           for i, w in enumerate(self.trainable_weights)]

        def train_step(self, data):
            logs = super().train_step(data)
            for weight, average in zip(self.trainable_weights, self.shadow):
                average.assign(0.9 * average + 0.1 * weight)
            return logs

    cls = {"train_step": Counting, "compute_loss": Losing, "ema": Averaging}[where]

    def build():
        return _small(cls, 5, optimizer=keras.optimizers.SGD(0.05), loss="mse")

    said = (rf"kerasmgpu: {cls.__name__}: its own "
            rf"{'train_step' if where == 'ema' else where} assigns variables .*Fix: update "
            r"state computed from the rows in a callback")
    single = build()
    with kerasmgpu.scope(gpus=REPLICAS[-1]):  # tf_keras copies no model-level weight
        template = build()
    template.set_weights(single.get_weights())
    with pytest.warns(UserWarning, match=said):
        pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    if where != "ema":
        return
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert_history_close(single.fit(X, Y, **fit), pmodel.fit(X, Y, **fit))
    assert_weights_close(single, template)  # the averages among them
    assert float(np.abs(np.asarray(template.shadow[0])).max()) > 0.01  # they moved


@requires(lines=[KerasLine.KERAS_3])
@pytest.mark.parametrize("rows", [60, 61])  # 61: a padded last batch of 1 row
def test_own_loss_tracker_of_compute_loss_reads_one_devices_loss(rows: int) -> None:
    """The guide's `Mean("loss")` tracker of compute_loss's value (issue 28, item 18):
    Keras 3 on TF divides that value by the replicas inside a replica (History read
    1/replicas of it); one device's Mean weighs every step alike, the padded one too."""

    def model():
        seed_all(keras, 3)
        inputs = keras.Input((6,))
        made = _tracker_model_class()(inputs, keras.layers.Dense(1)(inputs))
        deterministic_weights(made, 3)
        made.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return made

    single, template = model(), model()
    h1 = single.fit(X[:rows], Y[:rows], batch_size=12, epochs=2, shuffle=False, verbose=0)
    h2 = kerasmgpu.parallelize(template, gpus=REPLICAS[-1]).fit(
        X[:rows], Y[:rows], batch_size=12, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


def _output_mean_model_class():
    """A custom step that tracks the mean of the model's output in a `Mean` of its own,
    updated without a sample weight: the output carries its Keras mask (mask_zero),
    which Keras's `Mean` applies only given a weight (3.3 - 3.15)."""
    if ON_JAX:
        import jax

        class OutputMean(keras.Model):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.output_mean = keras.metrics.Mean(name="output_mean")

            def loss_of(self, trainable, non_trainable, x, y):
                y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                            training=True)
                return self.compute_loss(x, y, y_pred), (y_pred, non_trainable)

            def train_step(self, state, data):
                trainable, non_trainable, optimizer_vars, metrics_vars = state
                x, y = data
                (loss, (y_pred, non_trainable)), grads = jax.value_and_grad(
                    self.loss_of, has_aux=True)(trainable, non_trainable, x, y)
                trainable, optimizer_vars = self.optimizer.stateless_apply(
                    optimizer_vars, grads, trainable)
                logs, new = {}, []
                for metric in self.metrics:
                    these = metrics_vars[len(new):len(new) + len(metric.variables)]
                    these = (metric.stateless_update_state(these, loss)
                             if metric.name == "loss" else
                             metric.stateless_update_state(these, y_pred))
                    logs[metric.name] = metric.stateless_result(these)
                    new += these
                return logs, (trainable, non_trainable, optimizer_vars, new)

        return OutputMean
    import tensorflow as tf

    class OutputMean(keras.Model):  # type: ignore[no-redef]
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.output_mean = keras.metrics.Mean(name="output_mean")

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            for metric in self.metrics:
                metric.update_state(loss) if metric.name == "loss" else \
                    metric.update_state(y_pred)
            return {m.name: m.result() for m in self.metrics}

    return OutputMean


@pytest.mark.core
@requires(lines=[KerasLine.KERAS_3])
def test_an_unweighted_mean_of_a_masked_output_reads_one_devices() -> None:
    """The `Mean` half of the masked-metric fix (issue 28): the padding weight must not
    switch the output's Keras mask on for the padded batch alone (one device's unweighted
    Mean averages the masked timesteps too). 29 rows, batch 6: a 5-row last batch. On
    TensorFlow the output reaches the Mean with its mask (failed without the fix: 1.6e-4
    relative); JAX's stateless_call returns it without one, so there it is one device's
    by construction, checked all the same."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(1, 9, size=(29, 7))
    tokens[:, 4:] = 0  # masked timesteps
    tokens[::3, 2:] = 0
    targets = rng.normal(size=(29, 7, 1)).astype("float32")

    def model():
        seed_all(keras, 12)
        inputs = keras.Input((7,), dtype="int32")
        hidden = keras.layers.Embedding(9, 4, mask_zero=True)(inputs)
        made = _output_mean_model_class()(inputs, keras.layers.Dense(1)(hidden))
        deterministic_weights(made, 12)
        made.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return made

    single, template = model(), model()
    fit = dict(batch_size=6, epochs=2, shuffle=False, verbose=0)
    h1 = single.fit(tokens, targets, **fit)
    h2 = kerasmgpu.parallelize(template, gpus=REPLICAS[-1]).fit(tokens, targets, **fit)
    assert "output_mean" in h1.history
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


def _autoencoder(units: int = 3):
    """Trained by `add_loss` only: the reconstruction error is added by a layer."""

    class Reconstruction(keras.layers.Layer):
        def call(self, inputs):
            original, rebuilt = inputs
            ops = keras.ops if KERAS3 else __import__("tensorflow").math
            self.add_loss(ops.reduce_mean(ops.square(original - rebuilt)) if not KERAS3
                          else ops.mean(ops.square(original - rebuilt)))
            return rebuilt

    seed_all(keras, 5)
    inputs = keras.Input((6,))
    code = keras.layers.Dense(units, activation="tanh")(inputs)
    rebuilt = keras.layers.Dense(6)(code)
    model = keras.Model(inputs, Reconstruction()([inputs, rebuilt]))
    deterministic_weights(model, 5)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model


@pytest.mark.core
def test_fit_without_targets_add_loss_model() -> None:
    """fit(x) with no y: exact when the batches divide, and when not (every replica gets
    the short batch whole, on every line: Keras 3.3 - 3.9 on JAX were padded, and
    warned, before kerasmgpu laid such a batch out itself there)."""
    replicas = REPLICAS[-1]
    single, template = _autoencoder(), _autoencoder()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    batch = 6 * replicas
    # 60 rows divide: no padding anywhere. 61 leave a short last batch: every replica
    # computes the add_loss term on all of it.
    for rows in (60, 61):
        h1 = single.fit(X[:rows], batch_size=batch, epochs=2, shuffle=False, verbose=0)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            h2 = pmodel.fit(X[:rows], batch_size=batch, epochs=2, shuffle=False, verbose=0)
        assert_history_close(h1, h2)
        assert_weights_close(single, template)


def _batch_term_model(kind: str, batchnorm: bool = False):
    """A regression model whose loss has a term computed from the whole batch: a mean
    over its rows (the kind data parallelism gives one device's value on batches that
    divide) - `add_loss` of a layer's mean square, or a Keras activity regularizer
    (which Keras 3.15 and tf.keras divide by the batch size) - or, on JAX, whose one
    program sees the global batch, a sum over the batch."""
    ops = keras.ops if KERAS3 else __import__("tensorflow").math

    class BatchTerm(keras.layers.Layer):
        def call(self, inputs):
            square = ops.square(inputs - 0.2)
            if kind == "sum":
                self.add_loss(0.01 * ops.sum(square))
            else:
                self.add_loss(0.3 * (ops.mean(square) if KERAS3 else ops.reduce_mean(square)))
            return inputs

    seed_all(keras, 9)
    inputs = keras.Input((6,))
    regularizer = keras.regularizers.L2(0.2) if kind == "activity" else None
    hidden = keras.layers.Dense(5, activation="tanh", activity_regularizer=regularizer)(inputs)
    if kind != "activity":
        hidden = BatchTerm()(hidden)
    if batchnorm:
        hidden = keras.layers.BatchNormalization()(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 9)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


@pytest.mark.parametrize("kind", ["add_loss", "activity", "sum"])
def test_a_term_computed_from_the_batch_reads_one_devices_on_a_short_batch(kind: str) -> None:
    """Item 19 of issue 28: 55 rows in batches of 10 leave a last batch of 5, which 2
    or 3 replicas can only split by padding it. Every replica gets it whole - a copy
    each on the TensorFlow lines (torch: tests/test_distributed.py), laid out
    replicated under JAX's one program - and computes one device's terms; before, the
    padding copies counted in them (History up to 9e-4 relative off, weights 4e-3 on 3
    replicas), with only a warning."""
    if kind == "sum" and not ON_JAX:
        pytest.skip("a sum over a replica's rows is averaged over the replicas on any "
                    "batch where each replica runs its own step (docs/semantics.md)")
    from kerasmgpu.env.versions import KERAS3_ACTIVITY_LOSS_IS_A_MEAN

    if kind == "activity" and KERAS3 and ON_TF and _VERSION < KERAS3_ACTIVITY_LOSS_IS_A_MEAN:
        with pytest.raises(ValueError, match="activity"):
            kerasmgpu.parallelize(_batch_term_model(kind), gpus=REPLICAS[-1])
        return
    x, y = X[:55], Y[:55]
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0,
               validation_data=(X[:13], Y[:13]))
    # One device's run is the same for every replica count: trained once.
    single = _batch_term_model(kind)
    h1 = single.fit(x, y, **fit)
    for replicas in REPLICAS:
        template = _batch_term_model(kind)
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            # The self-check on the last: its first padded step is the whole batch too.
            pmodel = kerasmgpu.parallelize(template, gpus=replicas,
                                           verify=replicas == REPLICAS[-1])
            h2 = pmodel.fit(x, y, **fit)
        assert_history_close(h1, h2)
        assert_weights_close(single, template)
        np.testing.assert_allclose(single.evaluate(X[:7], Y[:7], verbose=0),
                                   pmodel.evaluate(X[:7], Y[:7], verbose=0), rtol=1e-5)
        np.testing.assert_allclose(single.predict(X[:7], verbose=0),
                                   pmodel.predict(X[:7], verbose=0), atol=1e-5)


def _batches_of(feed: str, rows: int, batch: int):
    """The first `rows` rows of X, Y in batches of `batch`, as a generator of one
    epoch or a tf.data pipeline."""
    if feed == "tf.data":
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((X[:rows], Y[:rows])).batch(batch)
    return ((X[i:i + batch], Y[i:i + batch]) for i in range(0, rows, batch))


@pytest.mark.core
@pytest.mark.parametrize("feed", [
    "generator", pytest.param("tf.data", marks=[pytest.mark.tf_data, requires(tf_data=True)])])
@pytest.mark.parametrize("kind", ["add_loss", "sum"])
def test_a_term_computed_from_the_batch_reads_one_devices_from_a_generator_or_pipeline(
        kind: str, feed: str) -> None:
    """Item 19 of issue 28 for the inputs Keras reads by itself: 55 rows in batches of
    10 from a generator or a tf.data pipeline. On JAX such a feed reaches Keras as a
    generator or a dataset, which kerasmgpu cannot mark as it marks its own PyDatasets:
    its short batches were padded, with a warning, and the copies counted in the term
    (weights 9e-3 off one device for a sum on 3 devices). Now its batches are told by
    their packing and a short one is laid out replicated, in one process, as from
    arrays; the TensorFlow lines give every replica a copy, as for arrays."""
    if kind == "sum" and not ON_JAX:
        pytest.skip("a sum over a replica's rows is averaged over the replicas on any "
                    "batch where each replica runs its own step (docs/semantics.md)")
    if LINE is KerasLine.LEGACY:
        pytest.skip("Keras 2.3 reads a generator with fit_generator, whose batches it "
                    "slices unpadded (test_keras23_models.py)")
    single = _batch_term_model(kind)
    fit = dict(epochs=2 if feed == "tf.data" else 1, verbose=0)  # a generator: one epoch
    h1 = single.fit(_batches_of(feed, 55, 10), **fit)
    template = _batch_term_model(kind)
    with warnings.catch_warnings():
        # kerasmgpu's (Keras warns that a generator of one epoch ran out, as on one device)
        warnings.filterwarnings("error", "kerasmgpu", UserWarning)
        pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
        h2 = pmodel.fit(_batches_of(feed, 55, 10), **fit)
        assert_history_close(h1, h2)
        assert_weights_close(single, template)
        # evaluate reads its own short batch whole (7 rows on 2 or 3 devices).
        np.testing.assert_allclose(single.evaluate(_batches_of(feed, 17, 10), verbose=0),
                                   pmodel.evaluate(_batches_of(feed, 17, 10), verbose=0),
                                   rtol=1e-5)


@pytest.mark.parametrize("kind", ["add_loss", "activity"])
def test_a_term_before_a_synchronized_batchnorm_reads_one_devices(kind: str) -> None:
    """A term added before a BatchNormalization that sync_batchnorm=True synchronizes.
    Keras 3 on TF runs each replica's step in a thread of its own on the same layers,
    and a layer keeps the terms of a call in one list, which a replica entering the
    model emptied while another had filled it: the all-reduce of the synchronized
    moments holds the threads together, so one replica read the other's term as its
    own (weights 1e-2 off one device after one step, batches that divide; plain
    MirroredStrategy with synchronized=True the same). Exact on every route."""
    from kerasmgpu.env.versions import KERAS3_ACTIVITY_LOSS_IS_A_MEAN

    if kind == "activity" and KERAS3 and ON_TF and _VERSION < KERAS3_ACTIVITY_LOSS_IS_A_MEAN:
        pytest.skip("refused before 3.15 on TensorFlow (test_a_term_computed_from_the_"
                    "batch...)")
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0)
    for rows in (60, 55):
        single, template = (_batch_term_model(kind, batchnorm=True),
                            _batch_term_model(kind, batchnorm=True))
        h1 = single.fit(X[:rows], Y[:rows], **fit)
        pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[0], sync_batchnorm=True)
        h2 = pmodel.fit(X[:rows], Y[:rows], **fit)
        assert_history_close(h1, h2)
        assert_weights_close(single, template)


def _own_loss_model():
    """A model whose train_step computes its loss itself, not through compute_loss /
    compiled_loss (the form a GAN or a hand-written objective takes), deterministic."""
    seed_all(keras, 3)
    if ON_JAX:

        class Own(keras.Model):
            def loss_and_updates(self, trainable, non_trainable, x, y):
                y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                            training=True)
                return keras.ops.mean(keras.ops.square(y - y_pred)), non_trainable

            def train_step(self, state, data):
                loss, trainable, non_trainable, optimizer_vars = _stateless_update(
                    self, self.loss_and_updates, state, data)
                return {"own": loss}, (trainable, non_trainable, optimizer_vars, state[3])
    else:
        import tensorflow as tf

        class Own(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    y_pred = self(x, training=True)
                    if KERAS3:  # Keras 3's loss objects average over the global batch
                        loss = keras.losses.MeanSquaredError()(y, y_pred)
                    else:  # tf.keras: the step averages over the global batch itself
                        loss = tf.nn.compute_average_loss(
                            keras.losses.mean_squared_error(y, y_pred))
                gradients = tape.gradient(loss, self.trainable_variables)
                self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
                return {"own": loss}

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="tanh")(inputs)
    model = Own(inputs, keras.layers.Dense(1)(hidden))
    deterministic_weights(model, 3)
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model


def test_a_step_with_its_own_loss_reads_one_devices_on_a_short_batch() -> None:
    """A train_step that names neither compute_loss nor compiled_loss computes its loss
    where no padding weight reaches: its short last batch (55 rows, batch 10: 5) goes
    whole to every replica, and the weights are one device's, with nothing to warn
    about; before, the padding copies counted in that loss, with a warning."""
    fit = dict(batch_size=10, epochs=2, shuffle=False, verbose=0)
    single = _own_loss_model()  # one device's run: the same for every replica count
    single.fit(X[:55], Y[:55], **fit)
    for replicas in REPLICAS:
        template = _own_loss_model()
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            kerasmgpu.parallelize(template, gpus=replicas).fit(X[:55], Y[:55], **fit)
        assert_weights_close(single, template)


def _vae(latent: int = 2):
    """The Keras guide's VAE: an encoder to (mean, log variance), a sampling layer that
    adds the KL term by `add_loss`, a decoder, and the reconstruction error by `add_loss`.
    It samples while training (so it cannot be compared with one device) and returns the
    mean otherwise (so the template and the parallel model can be)."""
    if KERAS3:
        ops = keras.ops

        def normal(like):
            return keras.random.normal(ops.shape(like), seed=7)

        mean_of, exp, square = ops.mean, ops.exp, ops.square
    else:
        import tensorflow as tf

        def normal(like):
            return tf.random.normal(tf.shape(like))

        mean_of, exp, square = tf.reduce_mean, tf.exp, tf.square

    class Sampling(keras.layers.Layer):
        def call(self, inputs, training=None):
            z_mean, z_log_var = inputs
            self.add_loss(-0.5 * mean_of(1 + z_log_var - square(z_mean) - exp(z_log_var)))
            if not training:
                return z_mean
            return z_mean + exp(0.5 * z_log_var) * normal(z_mean)

    class Reconstruction(keras.layers.Layer):
        def call(self, inputs):
            original, rebuilt = inputs
            self.add_loss(mean_of(square(original - rebuilt)))
            return rebuilt

    seed_all(keras, 29)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    z = Sampling()([keras.layers.Dense(latent)(hidden), keras.layers.Dense(latent)(hidden)])
    rebuilt = keras.layers.Dense(6)(keras.layers.Dense(8, activation="relu")(z))
    model = keras.Model(inputs, Reconstruction()([inputs, rebuilt]))
    deterministic_weights(model, 29)
    model.compile(optimizer=keras.optimizers.Adam(0.01))
    return model


@one_replica_count(2)
def test_vae_with_add_loss_trains_saves_and_reloads(replicas: int, tmp_path) -> None:
    template = _vae()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    x = X[:60]  # 60 rows in batches of 12: no padding, so no add_loss warning either
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        history = pmodel.fit(x, batch_size=12, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    # The template and the parallel model hold one state: same predictions, and the
    # same loss on the same data.
    expected = template.predict(x, verbose=0)
    np.testing.assert_allclose(pmodel.predict(x, verbose=0), expected, atol=1e-5)
    path = tmp_path / "vae.weights.h5"
    template.save_weights(str(path))
    reloaded = _vae()
    reloaded.load_weights(str(path))
    np.testing.assert_allclose(reloaded.predict(x, verbose=0), expected, atol=1e-6)
    np.testing.assert_allclose(reloaded.evaluate(x, batch_size=12, verbose=0),
                               pmodel.evaluate(x, batch_size=12, verbose=0), rtol=1e-4)


def _two_headed():
    """Dict inputs, two named outputs, a loss and a metric per output."""
    seed_all(keras, 11)
    a = keras.Input((4,), name="a")
    b = keras.Input((3,), name="b")
    merged = keras.layers.Concatenate()([a, b])
    hidden = keras.layers.Dense(6, activation="relu")(merged)
    score = keras.layers.Dense(1, name="score")(hidden)
    label = keras.layers.Dense(3, activation="softmax", name="label")(hidden)
    model = keras.Model({"a": a, "b": b}, {"score": score, "label": label})
    deterministic_weights(model, 11)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss={"score": "mse", "label": "sparse_categorical_crossentropy"},
        loss_weights={"score": 1.0, "label": 0.5},
        metrics={"score": ["mae"], "label": ["accuracy"]},
    )
    return model


@one_replica_count(3)
def test_dict_inputs_and_per_output_losses_and_metrics(replicas: int) -> None:
    inputs = {"a": X[:, :4], "b": X[:, 3:6]}
    targets = {"score": Y, "label": (np.abs(Y[:, 0]) * 3).astype("int64") % 3}
    single, template = _two_headed(), _two_headed()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    kwargs = dict(batch_size=10, epochs=2, shuffle=False, verbose=0,
                  validation_data=(inputs, targets))
    h1 = single.fit(inputs, targets, **kwargs)
    h2 = pmodel.fit(inputs, targets, **kwargs)
    assert_history_close(h1, h2, rtol=2e-5)
    assert_weights_close(single, template)
    e1 = single.evaluate(inputs, targets, batch_size=7, verbose=0, return_dict=True)
    e2 = pmodel.evaluate(inputs, targets, batch_size=7, verbose=0, return_dict=True)
    assert e1.keys() == e2.keys()
    for key in e1:
        np.testing.assert_allclose(e1[key], e2[key], rtol=2e-5, err_msg=key)
    p1, p2 = single.predict(inputs, batch_size=7, verbose=0), pmodel.predict(
        inputs, batch_size=7, verbose=0)
    for key in ("score", "label"):
        np.testing.assert_allclose(p1[key], p2[key], atol=1e-5)


def _per_element(units: int = 4):
    """Keras 2.3's multi-input test model: output (batch, 4), a loss without a mean."""
    seed_all(keras, 13)
    left, right = keras.Input((5,)), keras.Input((3,))
    merged = keras.layers.Concatenate()([keras.layers.Dense(units)(left), right])
    model = keras.Model([left, right], keras.layers.Dense(units)(merged))
    deterministic_weights(model, 13)

    def per_element(y_true, y_pred):  # (batch, 4): no reduction over the last axis
        return (y_true - y_pred) ** 2

    model.compile(optimizer=keras.optimizers.SGD(0.02), loss=per_element)
    return model


@pytest.mark.core
def test_per_element_loss_with_padding() -> None:
    replicas = 2
    xs = [X[:, :5], X[:, 3:6]]
    ys = np.tile(Y, (1, 4))
    single, template = _per_element(), _per_element()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(xs, ys, batch_size=9, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(xs, ys, batch_size=9, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


def _sequence_tagger():
    """Per-timestep outputs (batch, time, classes) and per-timestep targets."""
    seed_all(keras, 17)
    inputs = keras.Input((5, 3))
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax")(hidden)
    model = keras.Model(inputs, outputs)
    deterministic_weights(model, 17)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_sequence_outputs_with_temporal_weights() -> None:
    replicas = REPLICAS[-1]
    x = RNG.normal(size=(43, 5, 3)).astype("float32")
    y = RNG.integers(0, 3, size=(43, 5)).astype("int64")
    temporal = RNG.uniform(0.0, 2.0, size=(43, 5)).astype("float32")
    single, template = _sequence_tagger(), _sequence_tagger()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    h1 = single.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)
    if KERAS3:  # tf.keras wants sample_weight_mode="temporal" for 2-D weights
        e1 = single.evaluate(x, y, sample_weight=temporal, batch_size=8, verbose=0)
        e2 = pmodel.evaluate(x, y, sample_weight=temporal, batch_size=8, verbose=0)
        np.testing.assert_allclose(e1, e2, rtol=1e-5)


def test_sequential_without_input() -> None:
    def build():
        seed_all(keras, 19)
        model = keras.Sequential([keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    single, template = build(), build()
    single.build((None, 6))
    template.build((None, 6))
    deterministic_weights(single, 19)
    deterministic_weights(template, 19)
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    h1 = single.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(X, Y, batch_size=10, epochs=2, shuffle=False, verbose=0)
    assert_history_close(h1, h2)
    assert_weights_close(single, template)


def _batchnorm_dropout():
    seed_all(keras, 23)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8)(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.Activation("relu")(hidden)
    hidden = keras.layers.Dropout(0.3)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", metrics=["mae"])
    return model


@one_replica_count(3)
def test_batchnorm_template_and_parallel_model_agree(replicas: int) -> None:
    """Per-replica statistics can't equal one device's, but after training the template
    and the parallel model hold the same state: they predict and evaluate alike."""
    template = _batchnorm_dropout()
    pmodel = kerasmgpu.parallelize(template, gpus=replicas)
    pmodel.fit(X, Y, batch_size=12, epochs=3, verbose=0)
    moving = [w for w in template.weights if "moving" in w.name]
    assert moving and all(np.abs(np.asarray(w)).sum() > 0 for w in moving)
    np.testing.assert_allclose(template.predict(X, verbose=0), pmodel.predict(X, verbose=0),
                               atol=1e-5)
    np.testing.assert_allclose(template.evaluate(X, Y, verbose=0),
                               pmodel.evaluate(X, Y, verbose=0), rtol=1e-5)


def _gan():
    """The guide's GAN: two sub-models, two optimizers, its own train_step."""
    latent = 4
    seed_all(keras, 29)
    generator = keras.Sequential([keras.Input((latent,)), keras.layers.Dense(6)])
    discriminator = keras.Sequential([keras.Input((6,)),
                                      keras.layers.Dense(1, activation="sigmoid")])

    if ON_JAX:
        return None  # the stateless JAX form of a GAN is its own guide; covered by JAX's step

    import tensorflow as tf

    class GAN(keras.Model):
        def __init__(self):
            super().__init__()
            self.generator, self.discriminator = generator, discriminator
            self.d_tracker = keras.metrics.Mean(name="d_loss")
            self.g_tracker = keras.metrics.Mean(name="g_loss")

        def call(self, x):
            return self.discriminator(x)

        @property
        def metrics(self):
            return [self.d_tracker, self.g_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        def train_step(self, real):
            if isinstance(real, tuple):
                real = real[0]
            rows = tf.shape(real)[0]
            noise = tf.random.normal((rows, latent))
            fake = self.generator(noise)
            images = tf.concat([fake, real], axis=0)
            labels = tf.concat([tf.ones((rows, 1)), tf.zeros((rows, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(images))
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(tf.zeros((rows, 1)),
                                      self.discriminator(self.generator(noise)))
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_tracker.update_state(d_loss)
            self.g_tracker.update_state(g_loss)
            return {"d_loss": self.d_tracker.result(), "g_loss": self.g_tracker.result()}

    gan = GAN()
    gan.build((None, 6))
    return gan


def _gan_loss():
    """Keras 3 scales its Loss objects for tf.distribute itself; tf.keras wants a loss
    in a custom step to be averaged over the global batch by the step."""
    if KERAS3:
        return keras.losses.BinaryCrossentropy()
    import tensorflow as tf

    def loss(labels, predictions):
        return tf.nn.compute_average_loss(keras.losses.binary_crossentropy(labels, predictions))

    return loss


@requires(tf=True)
def test_gan_with_two_optimizers_trains_in_scope(tmp_path) -> None:
    """A GAN's sub-models and optimizers live in the engine: build it in scope()."""
    with kerasmgpu.scope(gpus=REPLICAS[-1]):
        gan = _gan()
        gan.compile(keras.optimizers.Adam(0.001), keras.optimizers.Adam(0.001), _gan_loss())
        # Optimizers a step uses besides model.optimizer are built in scope: under
        # tf.distribute one built lazily inside the step fails (Keras itself too).
        gan.d_optimizer.build(gan.discriminator.trainable_variables)
        gan.g_optimizer.build(gan.generator.trainable_variables)
    pgan = kerasmgpu.parallelize(gan, gpus=REPLICAS[-1])
    history = pgan.fit(X, batch_size=12, epochs=2, verbose=0)
    assert set(history.history) == {"d_loss", "g_loss"}
    assert all(np.isfinite(v) for v in history.history["d_loss"] + history.history["g_loss"])
    path = tmp_path / "generator.weights.h5"
    gan.generator.save_weights(str(path))
    copy = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6)])
    copy.load_weights(str(path))
    assert_weights_close(copy, gan.generator)
