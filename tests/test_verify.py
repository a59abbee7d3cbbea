"""parallelize(verify=True): the self-check passes on what is right and raises on what
is broken on purpose, before any weight moves - on every route that runs in one process
(Keras 3 on JAX and TensorFlow, tf.keras, tf_keras, Keras 2.3's multi_gpu_model). The
torch route's checks run in the misuse job of tests/test_distributed.py
(tests/workers/verify.py).

One small model, 101 rows in batches of 40 on 3 replicas: the first batch is padded
(40 = 3 x 14 - 2; Keras 2.3 slices it 13 + 13 + 14) and the last (21 rows) is short.
Also (issue 28): a model with Dropout and GaussianNoise, compared in inference mode,
passes and still raises on a fault; under mixed_float16 (1e-2 relative) the same.
The faults, per route:
* a replica's copy of a variable changed after the copy: on TensorFlow only replica 1's
  copy (the check runs each replica on its own copy), on JAX - which trains the user's
  model laid out in place, no copy - device 1's piece of the replicated array (the
  one-device side reads one device's piece), on Keras 2.3 the copy
  `cpu_relocation=True` trains;
* a wrong padding weight (every padding row weighted as a real one); Keras 2.3 pads
  nothing, and the parallel model's compile arguments carried wrong stand in for it;
* a layer's state that is not a variable (a private Python attribute read in `call`,
  which the copy does not carry) changed on the copy (not on JAX: no copy there); on Keras 2.3, whose graph reads it once, changed on the template between its
  graph and the parallel model's;
* Keras 2.3: a layer that mixes the rows of its batch, which multi_gpu_model's slices
  cannot compute as one device does.
And a model, not a fault: a loss term that sums over a replica's rows, which the TF lines
cannot train as one device does (raises) and JAX and Keras 2.3 do (passes). And inputs
other than arrays: a PyDataset / Sequence and a tf.data pipeline are checked on their
first batch, read so that the fit then reads what it would have (a seeded reshuffling
pipeline is not read, with a warning; a PyDataset augmenting from NumPy's random state
draws the same); a generator's first batch is taken and handed back to the fit in
front of the rest, and on Keras 2.3 the *_generator calls are checked as fit, evaluate
and predict are.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_JAX,
    ON_LEGACY,
    assert_weights_close,
    classification_data,
    deterministic_weights,
    keras_module,
    mlp,
    seed_all,
)

import kerasmgpu
from kerasmgpu import batching
from kerasmgpu.env.versions import KerasLine

# Every route that runs in one process (torch needs `kerasmgpu launch`).
CHECKED = IN_PROCESS or ON_LEGACY

X, Y = classification_data(101)
FIT = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)


def test_bad_verify_value_is_refused_before_anything() -> None:
    with pytest.raises(TypeError, match=r"Received: verify='yes'.*Allowed: True, False or None"
                       r".*Fix:"):
        kerasmgpu.parallelize(object(), verify="yes")


def test_verification_error_is_public_without_a_framework() -> None:
    assert issubclass(kerasmgpu.VerificationError, RuntimeError)
    assert "VerificationError" in kerasmgpu.__all__


checked = pytest.mark.skipif(not CHECKED, reason=f"needs a route that runs in one process; "
                             f"this env: {LINE.value} (torch: tests/workers/verify.py)")

if CHECKED:
    keras = keras_module()

    class Scale(keras.layers.Layer):
        """Multiplies by a Python attribute read in call (no variable holds it)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.factor = 1.0

        def call(self, x):
            # `_outside` is set only from outside the class (no `self._outside =` in its
            # source): a private attribute the copy does not carry (docs/semantics.md).
            return x * self.factor * getattr(self, "_outside", 1.0)

    class Summed(keras.layers.Layer):
        """Adds a loss term that sums over the rows of its batch, not a mean."""

        def call(self, x):
            ops = getattr(keras, "ops", keras.backend)  # Keras 3, else the backend's
            self.add_loss(0.01 * ops.sum(ops.square(x)))
            return x

    class Centered(keras.layers.Layer):
        """Subtracts its batch's mean in training: the rows of a batch mix (one device's
        batch is not a replica's slice) where parallelize()'s trial of a layer's output
        on made-up rows does not look (inference mode: it refuses a layer mixing there)."""

        def call(self, x, training=None):
            return keras.backend.in_train_phase(
                x - keras.backend.mean(x, axis=0, keepdims=True), x, training=training)


def _summed_model():
    """`_model(Summed())` as a subclassed model adding the term in its own call."""

    class SummedModel(keras.Model):
        def __init__(self):
            super().__init__(name="summed")
            self.hidden = keras.layers.Dense(16, activation="relu", name="hidden")
            self.out = keras.layers.Dense(3, activation="softmax", name="out")

        def call(self, x, training=None):
            hidden = self.hidden(x)
            self.add_loss(0.01 * ops.sum(ops.square(hidden)))
            return self.out(hidden)

    ops = getattr(keras, "ops", keras.backend)  # Keras 3, else the backend's
    seed_all(keras, 1)
    model = SummedModel()
    model(X[:2])
    deterministic_weights(model, 1)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss="sparse_categorical_crossentropy")
    return model


def _model(layer=None):
    if layer is None:
        return mlp(keras, metrics=())
    seed_all(keras, 1)
    inputs = keras.Input((20,))
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax", name="out")(layer(hidden))
    model = deterministic_weights(keras.Model(inputs, outputs), 1)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1),
                  loss="sparse_categorical_crossentropy")
    return model


def _relocated(template):
    """Keras 2.3: multi_gpu_model(cpu_relocation=True) trains a copy of the template
    (verify from KERASMGPU_VERIFY, as legacy code turns it on); the copy it trains."""
    from kerasmgpu.legacy import multi_gpu_model

    pmodel = multi_gpu_model(template, gpus=3, cpu_relocation=True)
    inner = [layer for layer in pmodel.layers if isinstance(layer, keras.Model)]
    assert len(inner) == 1
    return pmodel, inner[0]


def _copy_changed(pmodel, copy):
    """A kernel of the replicas' copy moved after the copy was made."""
    if ON_LEGACY:
        kernel = copy.layers[1].kernel
        keras.backend.set_value(kernel, keras.backend.get_value(kernel) + 0.5)
        return "dense"
    kernel = pmodel.layers[1].kernel
    if ON_JAX:
        # No copy on JAX (the user's model, laid out in place): device 1's piece of the
        # replicated kernel diverges, as a replica's copy would. The template's one-device
        # side reads device 0's piece; the step runs replica 1's rows on device 1's.
        import jax

        value = kernel.value
        pieces = [shard.data for shard in value.addressable_shards]
        device = next(iter(pieces[1].devices()))
        pieces[1] = jax.device_put(np.asarray(pieces[1]) + 0.5, device)
        kernel.assign(jax.make_array_from_single_device_arrays(value.shape, value.sharding,
                                                               pieces))
        return "dense"
    # TensorFlow: replica 1's copy alone (a MirroredVariable's component).
    strategy = pmodel.__dict__["_kerasmgpu"].engine.strategy
    mirrored = kernel.value if LINE is KerasLine.KERAS_3 else kernel
    copy = strategy.experimental_local_results(mirrored)[1]
    copy.assign(copy.numpy() + 0.5)
    return "dense"


def _parallel(fault, monkeypatch):
    """(template, its parallel model with verify on, the fault's mark in the message),
    the fault made."""
    if fault == "mixing":  # (in training only: the check compares layers in inference)
        template = _model(Centered(name="centered"))
        return template, kerasmgpu.parallelize(template, gpus=3, verify=True), (
            "a layer reading the batch's other rows in training only")
    template = _model(Scale(name="scale") if fault == "state" else None)
    if fault == "state" and ON_LEGACY:
        # Graph mode reads a Python attribute when a graph is built: the template's was
        # built before this change, the parallel model's after it.
        template.get_layer("scale").factor = 3.0
        return template, kerasmgpu.parallelize(template, gpus=3, verify=True), "was built"
    if fault == "padding":
        if ON_LEGACY:  # nothing is padded here: the recompile weighs the loss wrong
            from kerasmgpu.adapters.keras23 import Keras23

            own = Keras23.compile_args
            monkeypatch.setattr(Keras23, "compile_args",
                                lambda self, m: {**own(self, m), "loss_weights": [2.0]})
        else:
            monkeypatch.setattr(batching.BatchPlan, "mask",
                                lambda self: np.ones(self.padded, "float32"))
        return template, kerasmgpu.parallelize(template, gpus=3, verify=True), "loss"
    if ON_LEGACY:
        monkeypatch.setenv("KERASMGPU_VERIFY", "1")
        pmodel, copy = _relocated(template)
    else:
        pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
        copy = pmodel
    if fault == "state":
        # A public attribute changed on the copy would reach the template (the copy
        # carries it); one the copy cannot carry stands for a state it missed.
        copy.get_layer("scale")._outside = 3.0
        return template, pmodel, "'scale'"
    return template, pmodel, _copy_changed(pmodel, copy)


@checked
def test_verify_changes_nothing_on_a_correct_model() -> None:
    one, plain, checked = _model(), _model(), _model()
    one.fit(X, Y, **FIT)
    kerasmgpu.parallelize(plain, gpus=3).fit(X, Y, **FIT)
    pchecked = kerasmgpu.parallelize(checked, gpus=3, verify=True)
    pchecked.fit(X, Y, **FIT)
    assert_weights_close(checked, plain, atol=0)
    assert_weights_close(checked, one, atol=1e-5)
    np.testing.assert_allclose(pchecked.predict(X, batch_size=40, verbose=0),
                               one.predict(X, batch_size=40, verbose=0), atol=1e-5)
    pchecked.evaluate(X, Y, batch_size=40, verbose=0)


# JAX trains the user's model itself: no copy, so no state a copy could miss
# (tests/test_in_place.py: a changed attribute reaches the step).
FAULTS = ["kernel", "padding"] + ([] if ON_JAX else ["state"]) + (
    ["mixing"] if ON_LEGACY else [])


@checked
@pytest.mark.parametrize("fault", FAULTS)
def test_verify_raises_before_any_weight_moves(fault, monkeypatch) -> None:
    template, pmodel, named = _parallel(fault, monkeypatch)
    before = [w.copy() for w in pmodel.get_weights()]
    before_template = [w.copy() for w in template.get_weights()]
    with pytest.raises(kerasmgpu.VerificationError, match=named) as raised:
        pmodel.fit(X, Y, **FIT)
    assert "Nothing was applied" in str(raised.value)
    for a, b in zip(pmodel.get_weights() + template.get_weights(), before + before_template):
        np.testing.assert_array_equal(a, b)
    iterations = template.optimizer.iterations
    assert int(keras.backend.get_value(iterations) if ON_LEGACY else np.asarray(iterations)) == 0


@checked
def test_predict_and_evaluate_compare_their_first_batch(monkeypatch) -> None:
    _, pmodel, named = _parallel("kernel", monkeypatch)
    for call in (lambda: pmodel.predict(X, batch_size=40, verbose=0),
                 lambda: pmodel.evaluate(X, Y, batch_size=40, verbose=0)):
        with pytest.raises(kerasmgpu.VerificationError, match=named):
            call()


@checked
def test_a_model_built_in_scope_is_checked_and_trains_as_on_one_device() -> None:
    """A model built in kerasmgpu.scope() (no copy): one device's loss is computed on its
    own distributed variables, outside a replica. On tf_keras and tf.keras its compiled
    loss's trackers (sync-on-read) refused the update there, and verify=True failed on
    every such model ("SyncOnReadVariable does not support `assign_add`")."""
    if ON_LEGACY:
        pytest.skip("Keras 2.3 has no kerasmgpu.scope() models to adopt")
    one = _model()
    with kerasmgpu.scope():
        template = _model()
    pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
    one.fit(X, Y, **FIT)
    pmodel.fit(X, Y, **FIT)
    assert_weights_close(template, one, atol=1e-5)


@checked
def test_a_loss_term_summed_over_a_replica_s_rows_raises_where_replicas_step_alone() -> None:
    """A term that sums over the rows of a batch: one device's on JAX (one program over
    the global batch) and Keras 2.3 (the template's own terms); where each replica runs
    its own step (the TF lines), the replicas' terms are averaged, so the check must
    raise naming the term, before any weight moves. The first batch (40 rows over 3)
    goes whole to every replica, which computes one device's term whatever it is; the
    last (21 rows) divides, so the check must reach it (`verify._batches`); and on
    Keras 3 its loss must hold the `add_loss` terms (a stateless call collects them).
    On the TF lines such a layer is refused by parallelize() before anything, tried on
    made-up rows (tests/test_tried_layers.py); one it cannot try - the model's own
    call, subclassed - is left to the check, named in a warning."""
    if ON_JAX or ON_LEGACY:
        template, one = _model(Summed(name="summed")), _model(Summed(name="summed"))
        pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
    else:
        one = _summed_model()
        with kerasmgpu.scope():  # no get_config to be copied by: trained as it is
            template = _summed_model()
        with pytest.warns(UserWarning, match=r"add_loss in SummedModel\.call \(layer "
                          r"'summed'\) could not be tried on made-up rows"):
            pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
    if ON_JAX or ON_LEGACY:
        one.fit(X, Y, **FIT)
        pmodel.fit(X, Y, **FIT)
        assert_weights_close(template, one, atol=1e-5)
        return
    before = [w.copy() for w in template.get_weights()]
    with pytest.raises(kerasmgpu.VerificationError,
                       match=r"\(21 rows\).*in a loss term computed from the batch \(add_loss "
                       r"in SummedModel.call \(layer 'summed'\)\).*make it a mean"):
        pmodel.fit(X, Y, **FIT)
    for a, b in zip(template.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def _fed(kind):
    """X, Y in batches of 40 as a `kind` of input fit reads batch by batch: a
    "tf.data" pipeline (or one "tf.data-shuffled" at every iterator, from a seed), a "pydataset"
    (or one "augmented" with noise drawn from NumPy's global random state), a
    "generator" (or an "augmented-generator")."""
    if kind.startswith("tf.data"):
        import tensorflow as tf

        data = tf.data.Dataset.from_tensor_slices((X, Y))
        return (data.shuffle(101, seed=3) if kind == "tf.data-shuffled" else data).batch(40)
    base = getattr(keras.utils, "PyDataset", None) or keras.utils.Sequence

    class Batches(base):
        def __len__(self):
            return -(-len(X) // 40)

        def __getitem__(self, index):
            rows = slice(40 * index, 40 * (index + 1))
            if kind.startswith("augmented"):
                return X[rows] + np.random.normal(scale=0.1, size=X[rows].shape), Y[rows]
            return X[rows], Y[rows]

    if kind.endswith("generator"):
        return (Batches()[i] for i in range(3))
    return Batches()


ONCE = dict(epochs=1, shuffle=False, verbose=0)  # a PyDataset's batches in order
# Keras 2.3 does not read a tf.data.Dataset; the JAX envs have no TensorFlow but
# keras3.15-jax-tfdata (these are marked tf_data by the parameter's name: conftest.py).
TF_DATA = importlib.util.find_spec("tensorflow") is not None and not ON_LEGACY
FED = ["pydataset", "generator"] + (["tf.data"] if TF_DATA else [])


def _once(kind, **more):
    """fit / evaluate / predict arguments for `kind`: a generator's length is its steps
    (Keras 2.3 asks for them)."""
    if kind.endswith("generator"):
        more["steps_per_epoch" if "epochs" in more else "steps"] = 3
    return more


def _checked_batches(caplog):
    """The fit batches the check compared, from its debug log."""
    return [r.getMessage() for r in caplog.records
            if r.name == "kerasmgpu.verify" and "fit batch rows" in r.getMessage()]


@checked
@pytest.mark.parametrize("kind", FED)
def test_verify_reads_a_dataset_s_first_batch_without_taking_it(kind, caplog) -> None:
    """A dataset's first batch, and its first rows shared the other way, are checked -
    once a fit, though Keras 2.3's fit calls fit_generator, also checked - and the fit
    still trains on every batch, as without the check (a dataset's batch is peeked, a
    generator's taken and handed back in front of the rest)."""
    one, plain, checked = _model(), _model(), _model()
    one.fit(_fed(kind), **_once(kind, **ONCE))
    pplain = kerasmgpu.parallelize(plain, gpus=3)
    pplain.fit(_fed(kind), **_once(kind, **ONCE))
    pchecked = kerasmgpu.parallelize(checked, gpus=3, verify=True)
    with caplog.at_level("DEBUG", logger="kerasmgpu.verify"):
        pchecked.fit(_fed(kind), **_once(kind, **ONCE))
    assert _checked_batches(caplog) == ["kerasmgpu verify: fit batch rows 0-40, loss and "
                                        "gradients compared in training mode",
                                        "kerasmgpu verify: fit batch rows 0-39, loss and "
                                        "gradients compared in training mode"]
    assert_weights_close(checked, plain, atol=0)
    assert_weights_close(checked, one, atol=1e-5)
    # evaluate and predict read every batch too (their first one checked).
    np.testing.assert_array_equal(pchecked.predict(_fed(kind), **_once(kind, verbose=0)),
                                  pplain.predict(_fed(kind), **_once(kind, verbose=0)))
    assert (pchecked.evaluate(_fed(kind), **_once(kind, verbose=0))
            == pplain.evaluate(_fed(kind), **_once(kind, verbose=0)))
    if ON_LEGACY:  # a Keras 2.3 project's own call
        by_generator = _model()
        kerasmgpu.parallelize(by_generator, gpus=3, verify=True).fit_generator(
            _fed(kind), **_once(kind, **ONCE))
        assert_weights_close(by_generator, plain, atol=0)


@checked
@pytest.mark.parametrize("kind", FED)
@pytest.mark.parametrize("fault", ["kernel", "padding"])
def test_verify_raises_on_a_dataset_before_any_weight_moves(kind, fault, monkeypatch) -> None:
    """fit, and evaluate / predict on their first batch's outputs - on Keras 2.3 also
    the *_generator calls its code trains a generator or Sequence with."""
    template, pmodel, named = _parallel(fault, monkeypatch)
    before = [w.copy() for w in template.get_weights()]
    fits = [pmodel.fit] + ([pmodel.fit_generator] if ON_LEGACY else [])
    for fit in fits:
        with pytest.raises(kerasmgpu.VerificationError, match=named):
            fit(_fed(kind), **_once(kind, **ONCE))
    for a, b in zip(template.get_weights(), before):
        np.testing.assert_array_equal(a, b)
    # evaluate and predict compare their first batch too.
    if fault == "kernel":
        calls = [pmodel.evaluate, pmodel.predict] + (
            [pmodel.evaluate_generator, pmodel.predict_generator] if ON_LEGACY else [])
        for call in calls:
            with pytest.raises(kerasmgpu.VerificationError, match=named):
                call(_fed(kind), **_once(kind, verbose=0))


@checked
@pytest.mark.parametrize("kind", ["augmented", "augmented-generator"]
                         + (["tf.data-shuffled"] if TF_DATA else []))
def test_verify_leaves_what_a_dataset_then_reads_as_it_was(kind) -> None:
    """The check's read of a dataset changes nothing the fit then reads: a PyDataset
    that draws from NumPy's random state draws the same (the state is put back), a
    generator that does yields the batch it drew for the check back to the fit; a
    pipeline whose shuffle would reshuffle for one more iterator is not read (a warning
    says it was not checked). Both fits equal the unchecked one to the bit."""
    plain, checked = _model(), _model()
    np.random.seed(5)
    kerasmgpu.parallelize(plain, gpus=3).fit(_fed(kind), **_once(kind, **ONCE))
    np.random.seed(5)
    pchecked = kerasmgpu.parallelize(checked, gpus=3, verify=True)
    if kind == "tf.data-shuffled":
        with pytest.warns(UserWarning, match=r"checked nothing: one more read could change "
                          r"what the call then reads from it \(stateful ops: ShuffleDataset"):
            pchecked.fit(_fed(kind), **ONCE)
    else:
        pchecked.fit(_fed(kind), **_once(kind, **ONCE))
    assert_weights_close(checked, plain, atol=0)


class _IndexedIterator:
    """An iterator of X, Y's batches of 40 that also has __getitem__ (no __len__):
    kerasmgpu reads it as a generator, weighing classes as for a PyDataset."""

    def __init__(self):
        self.batches = [(X[i:i + 40], Y[i:i + 40]) for i in range(0, len(X), 40)]
        self.at = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.at == len(self.batches):
            raise StopIteration
        self.at += 1
        return self.batches[self.at - 1]

    def __getitem__(self, index):
        return self.batches[index]


@checked
@pytest.mark.skipif(ON_LEGACY, reason="Keras 2.3's fit takes such an object for arrays and "
                    "fails on it, on one device too")
def test_verify_says_it_checked_nothing_on_an_iterator_that_is_also_indexed() -> None:
    """Its first batch cannot be taken and handed back as the same kind of object, so it
    is not read: a warning says so, and the fit trains as unchecked, to the bit."""
    plain, checked_model = _model(), _model()
    kerasmgpu.parallelize(plain, gpus=3).fit(_IndexedIterator(), steps_per_epoch=3, **ONCE)
    pchecked = kerasmgpu.parallelize(checked_model, gpus=3, verify=True)
    with pytest.warns(UserWarning, match=r"fit\(\) on a _IndexedIterator checked nothing: "
                      r"an iterator that is also indexed cannot be handed back"):
        pchecked.fit(_IndexedIterator(), steps_per_epoch=3, **ONCE)
    assert_weights_close(checked_model, plain, atol=0)
    assert any(np.abs(a - b).max() > 1e-3
               for a, b in zip(plain.get_weights(), _model().get_weights()))  # it trained


@checked
def test_environment_variable_turns_it_on_and_an_explicit_false_wins(monkeypatch) -> None:
    monkeypatch.setenv("KERASMGPU_VERIFY", "1")
    pmodel = kerasmgpu.parallelize(_model(Centered()) if ON_LEGACY else _model(), gpus=3)
    if not ON_LEGACY:
        _copy_changed(pmodel, pmodel)
    with pytest.raises(kerasmgpu.VerificationError):
        pmodel.fit(X, Y, **FIT)
    unchecked = kerasmgpu.parallelize(_model(Centered()) if ON_LEGACY else _model(), gpus=3,
                                      verify=False)
    if not ON_LEGACY:
        _copy_changed(unchecked, unchecked)
    unchecked.fit(X, Y, **FIT)  # explicit verify=False: no check, trains


# --- what cannot agree exactly (issue 28): random layers, 16-bit compute ---------------------


def _noisy(h):
    """Dropout and GaussianNoise: random in training mode, so compared in inference mode."""
    return keras.layers.GaussianNoise(0.3, name="noise")(keras.layers.Dropout(0.5, name="drop")(h))


@checked
def test_verify_passes_a_model_with_dropout_comparing_in_inference_mode() -> None:
    """The check draws nothing and changes nothing: a fit with it trains as one without
    (same seeds, to the bit), and the parallel model's inference-mode figures are one
    device's, before and after training (101 rows in batches of 40: padded)."""
    # Each copied right after it is built: a copy's random layers draw their seeds then.
    plain = _model(_noisy)
    pplain = kerasmgpu.parallelize(plain, gpus=3)
    checked = _model(_noisy)
    pchecked = kerasmgpu.parallelize(checked, gpus=3, verify=True)
    one = _model(_noisy)
    np.testing.assert_allclose(pchecked.evaluate(X, Y, batch_size=40, verbose=0),
                               one.evaluate(X, Y, batch_size=40, verbose=0), rtol=1e-5)
    seed_all(keras, 5)
    pplain.fit(X, Y, **FIT)
    seed_all(keras, 5)
    pchecked.fit(X, Y, **FIT)
    assert_weights_close(checked, plain, atol=0)
    one.set_weights(checked.get_weights())
    np.testing.assert_allclose(pchecked.predict(X, batch_size=40, verbose=0),
                               one.predict(X, batch_size=40, verbose=0), atol=1e-5)


@checked
@pytest.mark.parametrize("fault", ["kernel", "padding"])
def test_verify_with_dropout_still_raises_on_a_fault(fault, monkeypatch) -> None:
    if ON_LEGACY and fault == "padding":
        pytest.skip("Keras 2.3 pads nothing")
    template = _model(_noisy)
    if fault == "padding":
        monkeypatch.setattr(batching.BatchPlan, "mask",
                            lambda self: np.ones(self.padded, "float32"))
    if ON_LEGACY:
        monkeypatch.setenv("KERASMGPU_VERIFY", "1")
        pmodel, copy = _relocated(template)
    else:
        pmodel = copy = kerasmgpu.parallelize(template, gpus=3, verify=True)
    named = "(?s)gradient of hidden.*'hidden'" if fault == "kernel" else "loss"
    if fault == "kernel":
        _copy_changed(pmodel, copy)
    with pytest.raises(kerasmgpu.VerificationError, match=named) as raised:
        pmodel.fit(X, Y, **FIT)
    assert "inference mode" in str(raised.value) and "drop (Dropout)" in str(raised.value)


@checked
@pytest.mark.parametrize("fault", [None, "kernel", "padding"])
def test_verify_under_a_16_bit_policy(fault, monkeypatch) -> None:
    """mixed_float16: a correct model passes (the replicas sum float16 in another order:
    1e-2 relative, not float32's 1e-5) and trains as one device does within that; a
    fault still raises."""
    if ON_LEGACY:
        pytest.skip("Keras 2.3 has no mixed precision policy")
    if fault == "padding":
        monkeypatch.setattr(batching.BatchPlan, "mask",
                            lambda self: np.ones(self.padded, "float32"))
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        one, template = _model(), _model()
        assert "16" in str(template.dtype_policy.compute_dtype)
        pmodel = kerasmgpu.parallelize(template, gpus=3, verify=True)
        if fault is None:
            h1 = one.fit(X, Y, **FIT)
            h2 = pmodel.fit(X, Y, **FIT)
            np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-2)
            assert_weights_close(one, template, atol=1e-2)
            return
        named = _copy_changed(pmodel, pmodel) if fault == "kernel" else "loss"
        with pytest.raises(kerasmgpu.VerificationError, match=named) as raised:
            pmodel.fit(X, Y, **FIT)
        assert "beyond 0.01" in str(raised.value)
    finally:
        keras.mixed_precision.set_global_policy("float32")
