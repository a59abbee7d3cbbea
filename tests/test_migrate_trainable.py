"""`kerasmgpu migrate`, the trainable family: `trainable` at compile, shared optimizers.

The GAN tests train a discriminator and a combined model the way Keras-GAN does (compile
D, freeze it, compile the combined model, then alternate `train_on_batch` calls) and
compare both models' weights with Keras 2.3.1's: on the keras23 env the code runs as
written and must give the recorded numbers, on Keras 3 and tf_keras it runs migrated and
must give the same ones. Without the rewrite, Keras 3 leaves the discriminator at its
initial weights (its train step is built while it is frozen), and a shared optimizer
fails on the second model (tf_keras: KeyError; JAX: a 1:1 ValueError).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
from helpers import LINE, requires
from migrate_cases import (
    assert_idempotent,
    findings,
    lines_found,
    migrate,
    run_keras23,
    severities,
)

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity

RUNS_KERAS23_CODE = requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3,
                                    KerasLine.TF_KERAS_LEGACY])

SOURCE = '''
import numpy as np
from keras.layers import Dense, Input
from keras.models import Model, Sequential
from keras.optimizers import Adam, SGD


class GAN:
    def __init__(self):
        optimizer = {optimizer}
        self.discriminator = Sequential([Dense(4, activation="tanh", input_shape=(3,)),
                                         Dense(1, activation="sigmoid")])
        self.discriminator.compile(loss="binary_crossentropy", optimizer=optimizer,
                                   metrics=["accuracy"])
        self.generator = Sequential([Dense(3, input_shape=(2,))])
        z = Input(shape=(2,))
        img = self.generator(z)
        # For the combined model we will only train the generator
        self.discriminator.trainable = False
        self.combined = Model(z, self.discriminator(img))
        self.combined.compile(loss="binary_crossentropy", optimizer={second})

    def train(self, steps):
        rng = np.random.RandomState(0)
        for model in (self.discriminator, self.generator):
            model.set_weights([rng.uniform(-1, 1, w.shape) for w in model.get_weights()])
        for step in range(steps):
            real = rng.randn(4, 3).astype("float32") + 1.0
            noise = rng.randn(4, 2).astype("float32")
            fake = self.generator.predict(noise, verbose=0)
            d_loss_real = self.discriminator.train_on_batch(real, np.ones((4, 1)))
            d_loss_fake = self.discriminator.train_on_batch(fake, np.zeros((4, 1)))
            g_loss = self.combined.train_on_batch(noise, np.ones((4, 1)))


gan = GAN()
gan.train(4)
result = [float(v) for m in (gan.discriminator, gan.generator)
          for w in m.get_weights() for v in np.ravel(w)]
'''
CASES = {
    "own": {"optimizer": "Adam(0.01, 0.5)", "second": "Adam(0.01, 0.5)"},
    "shared_sgd": {"optimizer": "SGD(0.1, 0.9)", "second": "optimizer"},
    "shared_adam": {"optimizer": "Adam(0.01, 0.5)", "second": "optimizer"},
}
# D's then G's weights after 4 GAN steps on Keras 2.3.1 (tensorflow 2.15.1), recorded by
# this test's own keras23 run.
KERAS23: Dict[str, List[float]] = {
    "own": [0.12810022, 0.41774863, 0.1890588, 0.069263481, -0.18472806, 0.28946841,
            -0.094104975, 0.8105399, 0.85115838, -0.15940239, 0.65136564, 0.13018109,
            0.16286913, 0.84982264, -0.86330551, -0.84389967, -0.88758677, 0.64357096,
            0.59595227, 0.77227885, 0.93994969, 0.5760178, -0.10589132, 0.5988996,
            -0.78577667, 0.26178727, -0.69200242, 0.92729592, 0.083442122, -0.20676425],
    "shared_sgd": [0.49113485, 0.38322449, 0.11918835, -0.05463253, -0.29085606, 0.30030283,
                   -0.035636008, 0.8733449, 0.67009085, -0.0033557005, 0.85832459, 0.4494485,
                   0.56765467, 0.84789371, -0.88112313, -0.96040374, -0.67942011, 0.34288633,
                   1.0396928, 1.1405791, 0.65075129, 0.60084009, -0.11799923, 0.61095721,
                   -0.77769387, 0.28790578, -0.73638463, 0.87372136, 0.28294215, -0.284073],
    "shared_adam": [0.13210228, 0.41610703, 0.1866208, 0.066054963, -0.18696496, 0.28614664,
                    -0.092008233, 0.81212813, 0.843647, -0.15171927, 0.65787184, 0.13772216,
                    0.16658597, 0.84905607, -0.86419117, -0.84693438, -0.87992042, 0.6403327,
                    0.60151374, 0.77671796, 0.93725038, 0.57223624, -0.11316817, 0.61205989,
                    -0.79069012, 0.25975892, -0.68922293, 0.94042772, 0.097820312,
                    -0.21868296],
}


def _source(case: str) -> str:
    return SOURCE.format(**CASES[case])


@RUNS_KERAS23_CODE
@pytest.mark.core
@pytest.mark.parametrize("case", ["own", "shared_sgd", "shared_adam"])
def test_the_gan_trains_both_models_as_keras23_did(case: str) -> None:
    result = np.array(run_keras23(_source(case), f"gan_{case}.py")["result"])
    expected = np.array(KERAS23[case])
    if case == "shared_adam" and LINE is KerasLine.KERAS_3:
        # One Adam per model now: each counts its own steps (a WARNING says so); both
        # models still train (the discriminator's weights left their initial values).
        assert np.max(np.abs(result - expected)) > 1e-4
        assert severities(_source(case), "counts its own model's steps") == [Severity.WARNING]
        return
    np.testing.assert_allclose(result, expected, rtol=0, atol=2e-6)


@pytest.mark.text
def test_the_freeze_is_set_around_the_discriminators_own_training_calls() -> None:
    out = assert_idempotent(_source("own"))
    assert ("            self.discriminator.trainable = True\n"
            "            d_loss_real = self.discriminator.train_on_batch(real, np.ones((4, 1)))\n"
            "            d_loss_fake = self.discriminator.train_on_batch(fake, np.zeros((4, 1)))\n"
            "            self.discriminator.trainable = False\n"
            "            g_loss = self.combined.train_on_batch") in out
    [info] = [f for f in findings(_source("own")) if f.rule == "trainable"]
    assert (info.line, info.col, info.severity) == (18, 9, Severity.INFO)
    assert "self.discriminator.trainable = True around each training call of " \
        "self.discriminator (compiled on line 12)" in info.message
    # tf_keras restores the compile's trainable state in train_on_batch itself.
    assert "trainable = True" not in migrate(_source("own"), "tf_keras")
    assert not [f for f in findings(_source("own"), "tf_keras") if f.rule == "trainable"]


@pytest.mark.text
def test_the_comment_above_a_wrapped_call_stays_above_it() -> None:
    text = """
        d.compile('sgd', 'mse')
        d.trainable = False
        c.compile('sgd', 'mse')
        for i in range(3):
            # the discriminator
            a = d.train_on_batch(x, y)
            c.train_on_batch(x, y)
        """
    assert ("    # the discriminator\n    d.trainable = True\n    a = d.train_on_batch(x, y)\n"
            "    d.trainable = False\n    c.train_on_batch(x, y)\n") in assert_idempotent(text)


@pytest.mark.text
def test_several_models_each_get_their_compile_state() -> None:
    """WGAN-GP: the generator frozen for the critic's model, the critic for the generator's."""
    text = """
        class W:
            def __init__(self):
                self.generator.trainable = False
                self.critic_model.compile(loss='mse', optimizer='rmsprop')
                self.critic.trainable = False
                self.generator.trainable = True
                self.generator_model.compile(loss='mse', optimizer='rmsprop')

            def train(self):
                d_loss = self.critic_model.train_on_batch(x, y)
                g_loss = self.generator_model.train_on_batch(x, y)
        """
    out = assert_idempotent(text)
    assert ("        self.critic.trainable = True\n        self.generator.trainable = False\n"
            "        d_loss = self.critic_model.train_on_batch(x, y)\n"
            "        self.critic.trainable = False\n        self.generator.trainable = True\n"
            "        g_loss = self.generator_model.train_on_batch(x, y)\n") in out


@pytest.mark.text
def test_without_training_calls_in_the_file_a_warning_names_the_fix() -> None:
    text = "d.compile('sgd', 'mse')\nd.trainable = False\nc.compile('sgd', 'mse')\n"
    [warning] = [f for f in findings(text) if f.rule == "trainable"]
    assert (warning.line, warning.severity) == (2, Severity.WARNING)
    assert "set d.trainable = True right before each d.train_on_batch/fit and back to " \
        "False right after" in warning.message


@pytest.mark.text
def test_a_return_of_a_training_call_cannot_be_wrapped() -> None:
    text = ("d.compile('sgd', 'mse')\nd.trainable = False\nc.compile('sgd', 'mse')\n"
            "def step():\n    return d.train_on_batch(x, y)\n")
    assert [f.line for f in findings(text) if f.rule == "trainable"] == [5]
    assert lines_found(text, "cannot place them around this statement") == [5]
    assert "d.trainable = True" not in migrate(text)


@pytest.mark.text
def test_frozen_before_a_compile_and_trained_by_itself_elsewhere() -> None:
    """machinelearningmastery's define_gan(g_model, d_model): d compiled in another function."""
    text = """
        def define_gan(g_model, d_model):
            d_model.trainable = False
            model = Sequential([g_model, d_model])
            model.compile(loss='binary_crossentropy', optimizer='adam')
            return model

        def train(g_model, d_model, gan_model):
            d_loss, _ = d_model.train_on_batch(x, y)
        """
    assert severities(text, "if d_model was compiled while trainable") == [Severity.WARNING]
    assert not severities(text, "if d_model was compiled while trainable", "tf_keras")


@pytest.mark.text
def test_a_freeze_that_every_compile_shares_is_left() -> None:
    """Transfer learning: the base is frozen before the only compile."""
    text = "base.trainable = False\nmodel.compile('sgd', 'mse')\nmodel.fit(x, y)\n"
    assert migrate(text) == text
    assert not [f for f in findings(text) if f.rule == "trainable"]
    assert not [f for f in findings(_source("own"), "keras23") if f.rule == "trainable"]


@pytest.mark.text
def test_batchnorm_in_a_frozen_model_is_a_warning_on_both_targets() -> None:
    text = _source("own").replace("Dense(1, activation=\"sigmoid\")",
                                  "BatchNormalization(), Dense(1, activation=\"sigmoid\")")
    text = text.replace("import Dense, Input", "import BatchNormalization, Dense, Input")
    for target in ("keras3", "tf_keras"):
        assert lines_found(text, "runs a frozen BatchNormalization in inference mode",
                           target) == [18]


@pytest.mark.text
def test_a_shared_optimizer_becomes_legacy_on_tf_keras_and_copies_on_keras3() -> None:
    tf_keras = migrate(_source("shared_adam"), "tf_keras")
    assert "optimizer = tf_keras.optimizers.legacy.Adam(learning_rate=0.01, beta_1=0.5)" \
        in tf_keras
    keras3 = assert_idempotent(_source("shared_sgd"))
    assert "optimizer=type(optimizer).from_config(optimizer.get_config()))" in keras3
    assert severities(_source("shared_sgd"), "so it trains as Keras 2.3's shared one did") \
        == [Severity.INFO]
    assert_idempotent(_source("shared_adam"), "tf_keras")
