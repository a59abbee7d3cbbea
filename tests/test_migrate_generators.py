"""`kerasmgpu migrate`, the generators family: fit/evaluate/predict_generator.

Source tests need libcst only; the run test trains with a Sequence and a Python generator
and compares with Keras 2.3.1 (recorded on the keras23 env by this test's own run there).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import BACKEND, LINE, requires
from migrate_cases import assert_idempotent, findings, migrate, run_keras23, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_fit_generator_positionals_become_keywords(target: str) -> None:
    text = "model.fit_generator(gen, 100, 5, 2, [cb], val_gen, 10)\n"
    assert migrate(text, target) == (
        "model.fit(gen, steps_per_epoch=100, epochs=5, verbose=2, callbacks=[cb], "
        "validation_data=val_gen, validation_steps=10)\n"
    )
    assert_idempotent(text, target)


@pytest.mark.text
def test_generator_keyword_becomes_the_first_positional() -> None:
    text = "h = self.model.fit_generator(epochs=3, generator=gen(), steps_per_epoch=7)\n"
    assert migrate(text) == "h = self.model.fit(gen(), epochs=3, steps_per_epoch=7)\n"


@pytest.mark.text
def test_worker_arguments_stay_on_tf_keras() -> None:
    text = ("model.fit_generator(seq, workers=4, use_multiprocessing=True,\n"
            "                    max_queue_size=20)\n")
    assert migrate(text, "tf_keras") == (
        "model.fit(seq, workers=4, use_multiprocessing=True,\n"
        "                    max_queue_size=20)\n"
    )
    assert severities(text, "dropped", "tf_keras") == []


@pytest.mark.text
def test_worker_arguments_are_dropped_on_keras3_with_a_warning_that_says_what_changes() -> None:
    text = "model.fit_generator(seq, 10, workers=4, use_multiprocessing=True)\n"
    assert migrate(text) == "model.fit(seq, steps_per_epoch=10)\n"
    [warning] = [f for f in findings(text) if f.severity is Severity.WARNING]
    assert warning.message.startswith("workers=4, use_multiprocessing=True dropped from fit()")
    assert "super().__init__(workers=4, use_multiprocessing=True)" in warning.message
    assert "the same batches in the same order, more slowly" in warning.message
    assert "batches repeated" in warning.message  # what multiprocessing did to a generator


@pytest.mark.text
def test_worker_arguments_at_their_defaults_are_dropped_with_an_info() -> None:
    text = "model.fit_generator(seq, 10, workers=1, max_queue_size=10)\n"
    assert migrate(text) == "model.fit(seq, steps_per_epoch=10)\n"
    assert [f.severity for f in findings(text)] == [Severity.INFO]


@pytest.mark.text
@pytest.mark.parametrize("method", ["evaluate_generator", "predict_generator"])
def test_evaluate_and_predict_keep_verbose_0(method: str) -> None:
    base = method.split("_")[0]
    assert migrate(f"out = m.{method}(gen, steps=3)\n") == (
        f"out = m.{base}(gen, steps=3, verbose=0)\n")
    assert migrate(f"out = m.{method}(gen, 3, verbose=1)\n") == (
        f"out = m.{base}(gen, steps=3, verbose=1)\n")


@pytest.mark.text
def test_evaluate_generator_warns_that_the_loss_becomes_the_mean() -> None:
    assert severities("m.evaluate_generator(gen, 3)\n", "loss of the last batch only") == [
        Severity.WARNING]


@pytest.mark.text
def test_keras1_keywords() -> None:
    text = ("m.fit_generator(gen, steps_per_epoch=10, nb_epoch=3, nb_worker=2, pickle_safe=True,"
            " max_q_size=5, validation_data=v, nb_val_samples=4)\n")
    assert migrate(text, "tf_keras") == (
        "m.fit(gen, steps_per_epoch=10, epochs=3, workers=2, use_multiprocessing=True, "
        "max_queue_size=5, validation_data=v, validation_steps=4)\n"
    )
    assert severities(text, "it counts batches, not samples", "tf_keras") == [Severity.WARNING]


@pytest.mark.text
def test_samples_per_epoch_is_an_error_and_stays() -> None:
    text = "m.fit_generator(gen, samples_per_epoch=1000, nb_epoch=3)\n"
    assert migrate(text) == text
    assert severities(text, "samples_per_epoch is Keras 1's") == [Severity.ERROR]


@pytest.mark.text
def test_a_local_fit_generator_method_is_not_keras() -> None:
    text = """
        class Trainer:
            def fit_generator(self, gen):
                return gen

        Trainer().fit_generator(g)
    """
    assert migrate(text) == migrate(text, "keras23")
    assert "defined in this file" in findings(text)[0].message


@pytest.mark.text
def test_keras23_target_only_informs() -> None:
    text = "m.fit_generator(g, 10)\n"
    assert migrate(text, "keras23") == text
    assert severities(text, "fit_generator is deprecated", "keras23") == [Severity.INFO]


SOURCE = '''
import numpy as np
import keras
from keras.layers import Dense
from keras.models import Sequential
from keras.optimizers import SGD
from keras.utils import Sequence

rng = np.random.RandomState(1)
x = rng.randn(40, 3).astype("float32")
y = (x @ np.array([[0.5], [-1.0], [2.0]], dtype="float32")).astype("float32")


class Batches(Sequence):
    def __len__(self):
        return 5

    def __getitem__(self, i):
        return x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]


def batches():
    while True:
        for i in range(5):
            yield x[i * 8:(i + 1) * 8], y[i * 8:(i + 1) * 8]


model = Sequential([Dense(1, input_shape=(3,), kernel_initializer="zeros")])
model.compile(optimizer=SGD(lr=0.05), loss="mse")
sequence = Batches()
model.fit_generator(sequence, 5, 2, verbose=0, shuffle=False, workers=2,
                    use_multiprocessing=False, max_queue_size=4)
model.fit_generator(generator=batches(), steps_per_epoch=5, epochs=1, verbose=0)
loss = model.evaluate_generator(Batches(), steps=5)
predicted = model.predict_generator(batches(), steps=1)
result = [float(v) for w in model.get_weights() for v in np.ravel(w)]
result += [float(v) for v in np.ravel(predicted)[:3]]
'''
# Keras 2.3.1 (tensorflow 2.15.1): weights, then the first three predictions.
KERAS23 = [0.39228392, -0.62952942, 1.6038551, -0.11832560, 0.056886606, -4.7753682, 1.5570307]
KERAS23_LOSS = 0.27636456  # the last batch's loss: Keras 2.3.1's evaluate_generator
MEAN_LOSS = 0.24603039  # the mean over the 5 batches of the same weights


# The moved worker arguments keep Keras 2.3's results on TensorFlow; on JAX and PyTorch,
# Keras 3.15's threaded PyDataset trains this model to other weights (the WARNING says so).
EXACT_WITH_WORKERS = requires(lines=[KerasLine.LEGACY, KerasLine.TF_KERAS_LEGACY]) if (
    BACKEND in ("jax", "torch")) else requires(
    lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])


@EXACT_WITH_WORKERS
@pytest.mark.core
def test_migrated_generator_calls_train_and_predict_as_keras23_did() -> None:
    ran = run_keras23(SOURCE, "generators.py")
    np.testing.assert_allclose(ran["result"], KERAS23, rtol=0, atol=2e-6)
    if LINE is KerasLine.KERAS_3:  # the worker arguments moved to the PyDataset
        assert (ran["sequence"].workers, ran["sequence"].max_queue_size) == (2, 4)
    expected = KERAS23_LOSS if LINE is KerasLine.LEGACY else MEAN_LOSS
    assert float(ran["loss"]) == pytest.approx(expected, abs=2e-6)


@pytest.mark.text
def test_predict_classes_and_predict_proba_are_keras23s_definitions() -> None:
    text = "c = model.predict_classes(x, batch_size=8)\np = model.predict_proba(x)\n"
    assert migrate(text) == (
        'c = (lambda p: p.argmax(axis=-1) if p.shape[-1] > 1 else (p > 0.5).astype("int32"))'
        "(model.predict(x, batch_size=8, verbose=0))\n"
        "p = model.predict(x, verbose=0)\n"
    )
    assert migrate(text, "keras23") == text
    assert_idempotent(text)


@pytest.mark.text
def test_add_loss_on_a_functional_model_is_an_error_on_keras3() -> None:
    text = "vae.add_loss(vae_loss)\nclass L:\n    def call(self, x):\n        self.add_loss(x)\n"
    assert severities(text, "add_loss(<tensor>)") == [Severity.ERROR]
    assert severities(text, "add_loss(<tensor>)", "tf_keras") == []


PREDICT_SOURCE = '''
import numpy as np
from keras.layers import Dense
from keras.models import Sequential

x = np.linspace(-1, 1, 12, dtype="float32").reshape(4, 3)
many = Sequential([Dense(3, input_shape=(3,), activation="softmax", kernel_initializer="ones")])
one = Sequential([Dense(1, input_shape=(3,), activation="sigmoid", kernel_initializer="ones")])
result = [many.predict_classes(x).tolist(), one.predict_classes(x).ravel().tolist()]
'''


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
@pytest.mark.core
def test_migrated_predict_classes_gives_keras23s_classes() -> None:
    # equal scores: argmax takes the first class; one sigmoid unit: the 0.5 threshold
    assert run_keras23(PREDICT_SOURCE, "predict.py")["result"] == [[0, 0, 0, 0], [0, 0, 1, 1]]


@pytest.mark.text
def test_worker_arguments_move_to_a_sequence_the_file_defines_on_keras3() -> None:
    text = """
        from keras.utils import Sequence
        class Batches(Sequence):
            pass
        train = Batches()
        history = model.fit_generator(train, 10, workers=4, use_multiprocessing=True)
    """
    assert migrate(text).endswith(
        "train = Batches()\ntrain.workers = 4\ntrain.use_multiprocessing = True\n"
        "train.max_queue_size = 10\nhistory = model.fit(train, steps_per_epoch=10)\n")
    assert severities(text, "moved to the Sequence") == [Severity.WARNING]
    assert severities(text, "dropped") == []
    assert_idempotent(text)


@requires(lines=[KerasLine.KERAS_3])
@pytest.mark.core
def test_with_one_worker_every_backend_trains_as_keras23_did() -> None:
    source = SOURCE.replace("workers=2", "workers=1")
    ran = run_keras23(source, "generators_one_worker.py")
    np.testing.assert_allclose(ran["result"], KERAS23, rtol=0, atol=2e-6)
