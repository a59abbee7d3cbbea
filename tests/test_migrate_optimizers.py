"""`kerasmgpu migrate`, the optimizers family: `lr`, `decay`, changed defaults, `.lr`.

The source tests need libcst only. The trajectory tests train one small model with each
optimizer and compare its weights with Keras 2.3.1's: on the keras23 env the Keras 2.3 code
runs as written and must give the recorded numbers (so they are Keras 2.3.1's), on Keras 3
and tf_keras it runs migrated and must give the same numbers.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
from helpers import LINE, requires
from migrate_cases import assert_idempotent, findings, migrate, run_keras23, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity

RUNS_KERAS23_CODE = requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3,
                                    KerasLine.TF_KERAS_LEGACY])


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_lr_becomes_learning_rate(target: str) -> None:
    text = "from keras.optimizers import Adam\nopt = Adam(lr=1e-4, beta_1=0.9)\n"
    assert "opt = Adam(learning_rate=1e-4, beta_1=0.9)\n" in migrate(text, target)
    assert_idempotent(text, target)


@pytest.mark.text
def test_decay_becomes_the_inverse_time_schedule() -> None:
    text = "import keras\nopt = keras.optimizers.SGD(lr=0.01, momentum=0.9, decay=1e-6)\n"
    assert migrate(text) == (
        "import keras\nopt = keras.optimizers.SGD(learning_rate=keras.optimizers.schedules."
        "InverseTimeDecay(0.01, decay_steps=1, decay_rate=1e-6), momentum=0.9)\n"
    )
    [info] = findings(text)
    assert info.severity is Severity.INFO
    assert "the rate Keras 2.3 used, lr / (1 + decay * iterations)" in info.message
    assert_idempotent(text)


@pytest.mark.text
def test_decay_without_lr_uses_the_keras23_default_and_zero_decay_goes() -> None:
    text = "from keras import optimizers\na = optimizers.Adam(decay=0.1)\nb = optimizers.SGD(decay=0.)\n"
    after = migrate(text)
    assert "a = optimizers.Adam(learning_rate=keras.optimizers.schedules.InverseTimeDecay(" \
           "0.001, decay_steps=1, decay_rate=0.1))\n" in after
    assert "import keras\n" in after
    assert "b = optimizers.SGD()\n" in after


@pytest.mark.text
def test_decay_with_a_callback_that_sets_the_rate_is_a_warning() -> None:
    text = (
        "from keras.optimizers import SGD\nfrom keras.callbacks import ReduceLROnPlateau\n"
        "opt = SGD(lr=0.1, decay=1e-4)\ncb = ReduceLROnPlateau()\n"
    )
    assert severities(text, "cannot set the rate of an optimizer that has a schedule") == [
        Severity.WARNING]


@pytest.mark.text
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("Adadelta()", "Adadelta(learning_rate=1.0)"),
        ("Adamax()", "Adamax(learning_rate=0.002)"),
        ("Nadam(beta_1=0.8)", "Nadam(learning_rate=0.002, beta_1=0.8)"),
        ("Adagrad()",
         "Adagrad(learning_rate=0.01, initial_accumulator_value=0.0, epsilon=1e-7 ** 2)"),
        ("Adam()", "Adam()"),
        ("SGD()", "SGD()"),
        ("RMSprop(0.01, 0.8)", "RMSprop(learning_rate=0.01, rho=0.8, epsilon=1e-7 ** 2)"),
        ("Adam(0.01, 0.8, 0.9, True)",
         "Adam(learning_rate=0.01, beta_1=0.8, beta_2=0.9, amsgrad=True)"),
        ("Adam(epsilon=None)", "Adam(epsilon=keras.backend.epsilon())"),
        ("Nadam(lr=0.01, schedule_decay=0.004)", "Nadam(learning_rate=0.01)"),
    ],
)
def test_keras23_defaults_and_positionals_are_written_out(call: str, expected: str) -> None:
    text = f"import keras\nfrom keras.optimizers import *\nopt = {call}\n"
    assert migrate(text).endswith(f"opt = {expected}\n")


@pytest.mark.text
def test_other_schedule_decay_is_an_error() -> None:
    text = "from keras.optimizers import Nadam\nopt = Nadam(schedule_decay=0.01)\n"
    assert severities(text, "schedule_decay=0.01") == [Severity.ERROR]
    assert migrate(text) == text


@pytest.mark.text
@pytest.mark.parametrize(
    ("name", "expected"),
    [("adadelta", "keras.optimizers.Adadelta(learning_rate=1.0)"),
     ("Adagrad", "keras.optimizers.Adagrad(learning_rate=0.01, initial_accumulator_value=0.0, "
      "epsilon=1e-7 ** 2)"),
     ("nadam", "keras.optimizers.Nadam(learning_rate=0.002)"),
     ("rmsprop", "keras.optimizers.RMSprop(epsilon=1e-7 ** 2)"),
     ("adam", None), ("sgd", None)],
)
def test_optimizer_names_in_compile_keep_the_keras23_rate(name: str, expected: str) -> None:
    text = f"import keras\nmodel.compile(loss='mse', optimizer='{name}')\n"
    after = migrate(text)
    if expected is None:
        assert after == text
    else:
        assert after == f"import keras\nmodel.compile(loss='mse', optimizer={expected})\n"


@pytest.mark.text
def test_optimizer_lr_attribute_reads_and_writes() -> None:
    text = """
        import keras
        from keras import backend as K
        opt = keras.optimizers.SGD(learning_rate=0.1)
        old = K.get_value(self.model.optimizer.lr)
        model.optimizer.lr = 0.5
        opt.lr = 0.2
        layer.lr = 3  # not an optimizer: left
    """
    after = migrate(text, "tf_keras")
    assert "K.get_value(self.model.optimizer.learning_rate)" in after
    assert "model.optimizer.learning_rate = 0.5" in after
    assert "opt.learning_rate = 0.2" in after
    assert "layer.lr = 3" in after


@pytest.mark.text
def test_keras23_target_leaves_optimizers_alone() -> None:
    text = "from keras.optimizers import SGD\nopt = SGD(lr=0.1, decay=1e-6)\n"
    assert migrate(text, "keras23") == text


# --------------------------------------------------------------------------------------
# Trajectories: the migrated optimizer trains as Keras 2.3.1 did

CASES = {
    "sgd_decay": "SGD(lr=0.1, momentum=0.9, decay=0.5)",
    "adam_decay": "Adam(lr=0.05, decay=0.3)",
    "rmsprop_decay": "RMSprop(lr=0.01, decay=0.2)",
    "adadelta_default": "Adadelta()",
    "adagrad_default": "Adagrad()",
    "adamax_default": "Adamax()",
    "adadelta_string": "'adadelta'",
    "adam_positional": "Adam(0.02, 0.8, 0.9, True)",
    "nadam_default": "Nadam()",
}
# Weights after 12 steps on Keras 2.3.1 (tensorflow 2.15.1), recorded by this test's own
# keras23 run.
KERAS23: Dict[str, List[float]] = {
    "sgd_decay": [2.0193229, -3.8157086, 0.80439615, 0.45633101],
    "adam_decay": [0.21455635, -0.23659839, 0.23608361, 0.019490357],
    "rmsprop_decay": [0.1006097, -0.10535542, 0.098099753, 0.0029990943],
    "adadelta_default": [0.012558001, -0.013478557, 0.01327759, -0.00039096724],
    "adagrad_default": [0.045292579, -0.048007604, 0.047719955, -0.00099717593],
    "adamax_default": [0.011790773, -0.012983926, 0.016988883, 0.00074359612],
    "adadelta_string": [0.012558001, -0.013478557, 0.01327759, -0.00039096724],
    "adam_positional": [0.17716807, -0.19700697, 0.20231976, 0.0022737363],
    "nadam_default": [0.015185537, -0.016445348, 0.017389696, -0.00062542944],
}
SOURCE = '''
import numpy as np
import keras
from keras.layers import Dense
from keras.models import Sequential
from keras.optimizers import SGD, Adam, RMSprop, Adadelta, Adagrad, Adamax, Nadam

rng = np.random.RandomState(0)
x = rng.randn(32, 3).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5]], dtype="float32") + 0.3).astype("float32")
model = Sequential([Dense(1, input_shape=(3,), kernel_initializer="zeros",
                          bias_initializer="zeros")])
model.compile(optimizer={optimizer}, loss="mse")
model.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
result = [float(v) for w in model.get_weights() for v in np.ravel(w)]
'''


@RUNS_KERAS23_CODE
@pytest.mark.core
@pytest.mark.parametrize("case", [c for c in CASES if c != "nadam_default"])
def test_migrated_optimizer_trains_as_keras23_did(case: str) -> None:
    result = run_keras23(SOURCE.format(optimizer=CASES[case]), f"{case}.py")["result"]
    # float32 steps; Keras 3's RMSprop/Adagrad put epsilon inside the square root (3e-7).
    np.testing.assert_allclose(result, KERAS23[case], rtol=0, atol=5e-6)


# One input ~1e-4 of the others: its weight's squared-gradient average v is ~1e-9, where
# modern Keras's sqrt(v + 1e-7) made the step ~10x smaller than Keras 2.3's sqrt(v) + 1e-7;
# the migrated epsilon=1e-7 ** 2 gives Keras 2.3's step. Recorded on Keras 2.3.1 (keras23).
SMALL_GRADIENTS = {
    "RMSprop(lr=0.01)": [0.17928928, 0.066361435, 0.18407796, 0.079238035],
    "Adagrad()": [0.052234717, 0.019722108, 0.055056348, 0.023705047],
    "'rmsprop'": [0.018573267, 0.0070330719, 0.019530369, 0.0082846750],
}
SOURCE_SMALL = SOURCE.replace(
    'x = rng.randn(32, 3).astype("float32")',
    'x = rng.randn(32, 3).astype("float32") * np.array([1.0, 1e-4, 1.0], dtype="float32")')


@RUNS_KERAS23_CODE
@pytest.mark.core
@pytest.mark.parametrize("optimizer", list(SMALL_GRADIENTS))
def test_epsilon_outside_the_square_root_as_keras23_had_it(optimizer: str) -> None:
    result = run_keras23(SOURCE_SMALL.format(optimizer=optimizer), "small.py")["result"]
    # sqrt(v + eps**2) is sqrt(v) + eps to first order eps / sqrt(v) (here ~0.3%); with eps
    # itself inside (no rewrite) the small weight ends 5x lower (0.0134 for 0.0664).
    np.testing.assert_allclose(result, SMALL_GRADIENTS[optimizer], rtol=3e-3, atol=1e-7)


@pytest.mark.text
def test_epsilon_is_written_squared_once() -> None:
    text = """
        from keras.optimizers import RMSprop, Adagrad
        a = RMSprop(lr=0.01)
        b = Adagrad(epsilon=1e-6, initial_accumulator_value=0.1)
        c = RMSprop(epsilon=eps / 2)
        model.compile(optimizer="rmsprop", loss="mse")
        """
    out = assert_idempotent(text)
    assert "a = RMSprop(learning_rate=0.01, epsilon=1e-7 ** 2)" in out
    assert "b = Adagrad(learning_rate=0.01, epsilon=1e-6 ** 2, initial_accumulator_value=0.1)" \
        in out
    assert "c = RMSprop(epsilon=(eps / 2) ** 2)" in out
    assert 'model.compile(optimizer=keras.optimizers.RMSprop(epsilon=1e-7 ** 2), loss="mse")' \
        in out
    assert len(severities(text, "epsilon squared")) == 4
    assert migrate(text, "tf_keras").count("** 2") == 4  # tf_keras 2.21 also adds it inside


@RUNS_KERAS23_CODE
def test_nadam_differs_from_keras23_and_the_report_says_so() -> None:
    source = SOURCE.format(optimizer=CASES["nadam_default"])
    result = run_keras23(source, "nadam.py")["result"]
    if LINE is KerasLine.LEGACY:
        np.testing.assert_allclose(result, KERAS23["nadam_default"], rtol=0, atol=5e-6)
        return
    assert np.max(np.abs(np.array(result) - KERAS23["nadam_default"])) > 1e-4
    assert severities(source, "Nadam's update differs from Keras 2.3's") == [Severity.WARNING]


@pytest.mark.text
def test_no_keras_import_is_added_when_the_new_code_does_not_name_it() -> None:
    text = "from keras.optimizers import Adam\nopt = Adam(lr=1e-3)\n"
    assert migrate(text) == "from keras.optimizers import Adam\nopt = Adam(learning_rate=1e-3)\n"
