"""`kerasmgpu migrate`, the backend family: `keras.backend` functions on modern Keras.

The battery below computes one value per Keras 2.3 backend function the family rewrites.
On the keras23 env it runs as written and must give the recorded numbers (so they are
Keras 2.3.1's); on Keras 3 it runs migrated to `keras.ops` and on tf_keras migrated to
tf_keras's backend, and must give the same numbers.
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest
from helpers import requires
from migrate_cases import assert_idempotent, found, migrate, run_keras23, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity


@pytest.mark.text
def test_same_meaning_functions_go_to_ops_with_keras23_defaults_written() -> None:
    text = """
        from keras import backend as K
        def loss(y_true, y_pred):
            a = K.concatenate([y_true, y_pred])
            b = K.argmax(y_pred)
            c = K.mean(K.square(y_pred - y_true), axis=-1)
            return K.permute_dimensions(a, (1, 0)) + c + K.cast(b, K.floatx())
    """
    after = migrate(text)
    assert "a = keras.ops.concatenate([y_true, y_pred], axis=-1)" in after
    assert "b = keras.ops.argmax(y_pred, axis=-1)" in after
    assert "c = keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)" in after
    assert "keras.ops.transpose(a, axes=(1, 0))" in after
    assert "keras.ops.cast(b, K.floatx())" in after  # K.floatx exists in Keras 3
    assert "import keras\n" in after
    assert_idempotent(text)


@pytest.mark.text
@pytest.mark.parametrize(
    ("call", "expected"),
    [
        ("K.int_shape(x)[1]", "tuple(x.shape)[1]"),
        ("K.int_shape(a + b)", "tuple((a + b).shape)"),
        ("K.sqrt(x)", "keras.ops.sqrt(keras.ops.maximum(x, 0.0))"),
        ("K.get_value(v)", "keras.ops.convert_to_numpy(v)"),
        ("K.set_value(model.optimizer.lr, 0.1)", "model.optimizer.learning_rate.assign(0.1)"),
        ("K.variable(w)", "keras.Variable(w, dtype=keras.backend.floatx())"),
        ("K.constant(3)", "keras.ops.convert_to_tensor(3, dtype=keras.backend.floatx())"),
        ("K.placeholder(shape=(None, 3))", "keras.Input(batch_shape=(None, 3))"),
        ("K.switch(c, a, b)", "keras.ops.where(c, a, b)"),
        ("K.relu(x, alpha=0.1)", "keras.activations.relu(x, negative_slope=0.1)"),
        ("K.batch_flatten(x)", "keras.ops.reshape(x, (keras.ops.shape(x)[0], -1))"),
        ("K.tf.nn.relu(x)", "tf.nn.relu(x)"),
    ],
)
def test_other_shapes_of_the_same_thing(call: str, expected: str) -> None:
    after = migrate(f"from keras import backend as K\nimport keras\ny = {call}\n")
    assert f"y = {expected}\n" in after


@pytest.mark.text
def test_shape_is_a_warning_unless_indexed_by_a_number() -> None:
    text = "from keras import backend as K\na = K.shape(x)[0]\nb = K.shape(x)[:1] // 2\n"
    assert severities(text, "returns a tuple") == [Severity.WARNING]
    assert "a = keras.ops.shape(x)[0]" in migrate(text)


@pytest.mark.text
@pytest.mark.parametrize("name", ["function", "gradients", "learning_phase", "batch_dot",
                                  "hard_sigmoid", "rnn"])
def test_functions_without_equivalent_are_errors(name: str) -> None:
    text = f"from keras import backend as K\nf = K.{name}(a, b)\n"
    assert migrate(text) == text
    assert severities(text, f"K.{name} does not exist in Keras 3") == [Severity.ERROR]


@pytest.mark.text
def test_direct_imports_of_rewritten_functions_go() -> None:
    text = "from keras.backend import int_shape, epsilon\nn = int_shape(x)\ne = epsilon()\n"
    after = migrate(text)
    assert after.startswith("from keras.backend import epsilon\n")
    assert "n = tuple(x.shape)\n" in after


@pytest.mark.text
def test_tf_keras_keeps_its_backend_but_for_what_it_dropped() -> None:
    text = "from keras import backend as K\na = K.mean(x)\nb = K.logsumexp(x, axis=1)\n"
    after = migrate(text, "tf_keras")
    assert "a = K.mean(x)\n" in after
    assert "b = tf.math.reduce_logsumexp(x, axis=1)\n" in after
    assert "import tensorflow as tf\n" in after


@pytest.mark.text
def test_tf_keras_gradients_is_a_warning() -> None:
    text = "from keras import backend as K\ng = K.gradients(loss, x)\n"
    assert migrate(text, "tf_keras") == text.replace("from keras", "from tf_keras")
    assert severities(text, "tf.GradientTape", "tf_keras") == [Severity.WARNING]


@pytest.mark.text
def test_repeat_bias_add_cast_to_floatx_are_rewritten_on_keras3_only() -> None:
    text = ("import numpy as np\nfrom keras import backend as K\nr = K.repeat(h, n + 1)\n"
            "b = K.bias_add(x, self.bias) * 2\nc = K.bias_add(x, b, data_format='channels_last')\n"
            "f = K.cast_to_floatx(1.)\n")
    after = migrate(text)
    assert "r = keras.ops.repeat(keras.ops.expand_dims(h, 1), n + 1, axis=1)\n" in after
    assert "b = (x + self.bias) * 2\n" in after
    assert "c = x + b\n" in after
    assert "f = np.asarray(1., dtype=keras.backend.floatx())\n" in after
    assert severities(text, "K.bias_add") == [Severity.INFO, Severity.INFO]
    assert_idempotent(text)
    # tf_keras's backend still has all three
    assert migrate(text, "tf_keras") == text.replace("from keras", "from tf_keras")


@pytest.mark.text
def test_cast_to_floatx_imports_numpy_where_the_file_has_none() -> None:
    after = migrate("from keras import backend as K\nf = K.cast_to_floatx([1, 2])\n")
    assert "import numpy\n" in after
    assert "f = numpy.asarray([1, 2], dtype=keras.backend.floatx())\n" in after


@pytest.mark.text
@pytest.mark.parametrize("data_format", ["'channels_first'", "fmt"])
def test_bias_add_not_channels_last_stays_an_error(data_format: str) -> None:
    text = f"from keras import backend as K\ny = K.bias_add(x, b, {data_format})\n"
    assert migrate(text) == text
    assert severities(text, "channels_first adds the bias on axis 1") == [Severity.ERROR]


@pytest.mark.text
def test_in_train_phase_stays_an_error() -> None:
    text = "from keras import backend as K\ny = K.in_train_phase(a, b, training=t)\n"
    assert migrate(text) == text
    assert severities(text, "K.in_train_phase does not exist") == [Severity.ERROR]


@pytest.mark.text
def test_keras23_target_changes_nothing() -> None:
    text = "from keras import backend as K\nn = K.int_shape(x)\n"
    assert migrate(text, "keras23") == text


BATTERY = '''
import numpy as np
from keras import backend as K

xa = (np.arange(-6, 6, dtype="float32").reshape(2, 3, 2) / 4).astype("float32")
ya = np.linspace(0.1, 0.9, 12, dtype="float32").reshape(2, 3, 2)
x = K.constant(xa)
y = K.constant(ya)
m = K.reshape(x, (6, 2))
n = K.reshape(y, (2, 6))
probs = K.softmax(K.reshape(x, (2, 6)))
target = K.constant(np.eye(6, dtype="float32")[[1, 4]])
labels = K.constant(np.array([1, 4]), dtype="int32")
v = K.variable(np.ones((2, 2)))
K.set_value(v, np.full((2, 2), 3.0))
exprs = {
    "int_shape": lambda: K.int_shape(x),
    "shape0": lambda: K.shape(x)[0],
    "concatenate": lambda: K.concatenate([x, y]),
    "mean": lambda: K.mean(x, axis=1),
    "sum_keepdims": lambda: K.sum(x, axis=-1, keepdims=True),
    "max": lambda: K.max(x, axis=0),
    "min": lambda: K.min(x),
    "prod": lambda: K.prod(y, axis=2),
    "std": lambda: K.std(x, axis=1),
    "var": lambda: K.var(x),
    "any": lambda: K.any(K.greater(x, 1.0), axis=1),
    "all": lambda: K.all(K.greater(y, 0.0)),
    "square": lambda: K.square(x),
    "abs": lambda: K.abs(x),
    "exp": lambda: K.exp(x),
    "log": lambda: K.log(y),
    "sign": lambda: K.sign(x),
    "round": lambda: K.round(x),
    "sqrt": lambda: K.sqrt(x),
    "pow": lambda: K.pow(y, 3),
    "maximum": lambda: K.maximum(x, y),
    "minimum": lambda: K.minimum(x, y),
    "equal": lambda: K.cast(K.equal(x, K.round(x)), "float32"),
    "less_equal": lambda: K.cast(K.less_equal(x, y), "float32"),
    "clip": lambda: K.clip(x, -0.5, 0.5),
    "dot": lambda: K.dot(m, n),
    "argmax": lambda: K.argmax(x),
    "argmin": lambda: K.argmin(y),
    "expand_dims": lambda: K.expand_dims(x),
    "squeeze": lambda: K.squeeze(K.expand_dims(x, 0), 0),
    "cumsum": lambda: K.cumsum(x),
    "cumprod": lambda: K.cumprod(y, axis=1),
    "permute_dimensions": lambda: K.permute_dimensions(x, (2, 0, 1)),
    "transpose": lambda: K.transpose(m),
    "flatten": lambda: K.flatten(x),
    "batch_flatten": lambda: K.batch_flatten(x),
    "gather": lambda: K.gather(m, [0, 3]),
    "repeat_elements": lambda: K.repeat_elements(x, 2, axis=1),
    "tile": lambda: K.tile(x, (1, 2, 1)),
    "stack": lambda: K.stack([x, y], axis=1),
    "softmax": lambda: K.softmax(x),
    "sigmoid": lambda: K.sigmoid(x),
    "tanh": lambda: K.tanh(x),
    "softplus": lambda: K.softplus(x),
    "softsign": lambda: K.softsign(x),
    "elu": lambda: K.elu(x, 0.5),
    "relu": lambda: K.relu(x, alpha=0.1, max_value=1.0),
    "binary_crossentropy": lambda: K.binary_crossentropy(K.round(y), y),
    "categorical_crossentropy": lambda: K.categorical_crossentropy(target, probs),
    "sparse_categorical_crossentropy": lambda: K.sparse_categorical_crossentropy(labels, probs),
    "one_hot": lambda: K.one_hot(labels, 6),
    "arange": lambda: K.arange(0, 5),
    "logsumexp": lambda: K.logsumexp(x, axis=1),
    "zeros": lambda: K.zeros((2, 2)),
    "ones_like": lambda: K.ones_like(x),
    "switch": lambda: K.switch(K.greater(x, 0.0), x, y),
    "stop_gradient": lambda: K.stop_gradient(x),
    "constant": lambda: K.constant(3),
    "variable": lambda: v,
    "ndim": lambda: K.ndim(x),
    "reverse": lambda: K.reverse(x, axes=1),
    "slice": lambda: K.slice(x, (0, 1, 0), (2, 2, 1)),
    "size": lambda: K.size(x),
    "eye": lambda: K.eye(3),
    "l2_normalize": lambda: K.l2_normalize(x, axis=1),
    "l2_normalize_all": lambda: K.l2_normalize(x),
    "repeat": lambda: K.repeat(m, 3),
    "bias_add": lambda: K.bias_add(x, K.constant([0.5, -2.0])),
    "bias_add_2d": lambda: K.bias_add(m, K.constant([0.5, -2.0]), data_format="channels_last"),
    "cast_to_floatx": lambda: K.cast_to_floatx(np.arange(3, dtype="float64") / 3),
}
result = {}
for name, make in exprs.items():
    try:
        value = make()
        if not isinstance(value, (tuple, int, np.ndarray)):
            value = K.get_value(value) if name in ("variable", "zeros") else K.eval(value)
    except Exception as exc:
        result[name] = ("error", [type(exc).__name__])
        continue
    array = np.asarray(value)
    result[name] = (str(array.dtype), [float(a) for a in array.ravel()])
result["dtype"] = K.dtype(x)
'''
# Keras 2.3.1 (tensorflow 2.15.1), recorded by this test's own keras23 run.
KERAS23: Dict[str, List[float]] = {
    "int_shape": [2, 3, 2],
    "shape0": [2],
    "concatenate": [-1.5, -1.25, 0.1, 0.17272727, -1, -0.75, 0.24545455, 0.31818181, -0.5, -0.25, 0.39090911, 0.46363637, 0, 0.25, 0.53636366, 0.60909092, 0.5, 0.75, 0.68181819, 0.75454545, 1, 1.25, 0.82727271, 0.89999998],
    "mean": [-1, -0.75, 0.5, 0.75],
    "sum_keepdims": [-2.75, -1.75, -0.75, 0.25, 1.25, 2.25],
    "max": [0, 0.25, 0.5, 0.75, 1, 1.25],
    "min": [-1.5],
    "prod": [0.017272728, 0.078099176, 0.18123968, 0.32669425, 0.51446283, 0.7445454],
    "std": [0.40824831, 0.40824831, 0.40824831, 0.40824831],
    "var": [0.74479169],
    "any": [0, 0, 0, 1],
    "all": [1],
    "square": [2.25, 1.5625, 1, 0.5625, 0.25, 0.0625, 0, 0.0625, 0.25, 0.5625, 1, 1.5625],
    "abs": [1.5, 1.25, 1, 0.75, 0.5, 0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "exp": [0.22313017, 0.28650481, 0.36787945, 0.47236654, 0.60653067, 0.77880079, 1, 1.2840254, 1.6487212, 2.1170001, 2.7182817, 3.4903429],
    "log": [-2.3025851, -1.7560414, -1.4046435, -1.1451323, -0.93928021, -0.7686547, -0.62294286, -0.49578774, -0.38299224, -0.28163975, -0.18962088, -0.10536055],
    "sign": [-1, -1, -1, -1, -1, -1, 0, 1, 1, 1, 1, 1],
    "round": [-2, -1, -1, -1, -0, -0, 0, 0, 0, 1, 1, 1],
    "sqrt": [0, 0, 0, 0, 0, 0, 0, 0.5, 0.70710677, 0.86602539, 1, 1.118034],
    "pow": [0.001, 0.0051532681, 0.01478813, 0.032212619, 0.059734792, 0.099662662, 0.1543043, 0.22596771, 0.31696093, 0.42959204, 0.56616902, 0.72899991],
    "maximum": [0.1, 0.17272727, 0.24545455, 0.31818181, 0.39090911, 0.46363637, 0.53636366, 0.60909092, 0.68181819, 0.75454545, 1, 1.25],
    "minimum": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 0.82727271, 0.89999998],
    "equal": [0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0],
    "less_equal": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
    "clip": [-0.5, -0.5, -0.5, -0.5, -0.5, -0.25, 0, 0.25, 0.5, 0.5, 0.5, 0.5],
    "dot": [-0.8204546, -1.0204545, -1.2204546, -1.4204545, -1.6204545, -1.8204545, -0.50227273, -0.62954545, -0.75681818, -0.8840909, -1.0113636, -1.1386364, -0.18409091, -0.23863637, -0.29318184, -0.34772727, -0.40227273, -0.45681816, 0.13409092, 0.15227273, 0.17045455, 0.18863636, 0.20681818, 0.22499999, 0.45227274, 0.54318184, 0.6340909, 0.72500002, 0.81590909, 0.90681815, 0.77045459, 0.93409091, 1.0977273, 1.2613636, 1.425, 1.5886364],
    "argmax": [1, 1, 1, 1, 1, 1],
    "argmin": [0, 0, 0, 0, 0, 0],
    "expand_dims": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "squeeze": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "cumsum": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, -1.5, -1, -0.5, 0, 0.5, 1],
    "cumprod": [0.1, 0.17272727, 0.024545455, 0.054958675, 0.0095950421, 0.02548084, 0.53636366, 0.60909092, 0.36570251, 0.4595868, 0.30253571, 0.4136281],
    "permute_dimensions": [-1.5, -1, -0.5, 0, 0.5, 1, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25],
    "transpose": [-1.5, -1, -0.5, 0, 0.5, 1, -1.25, -0.75, -0.25, 0.25, 0.75, 1.25],
    "flatten": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "batch_flatten": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "gather": [-1.5, -1.25, 0, 0.25],
    "repeat_elements": [-1.5, -1.25, -1.5, -1.25, -1, -0.75, -1, -0.75, -0.5, -0.25, -0.5, -0.25, 0, 0.25, 0, 0.25, 0.5, 0.75, 0.5, 0.75, 1, 1.25, 1, 1.25],
    "tile": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, -1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "stack": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0.1, 0.17272727, 0.24545455, 0.31818181, 0.39090911, 0.46363637, 0, 0.25, 0.5, 0.75, 1, 1.25, 0.53636366, 0.60909092, 0.68181819, 0.75454545, 0.82727271, 0.89999998],
    "softmax": [0.43782353, 0.56217653, 0.43782353, 0.56217653, 0.43782353, 0.56217653, 0.43782353, 0.56217653, 0.43782353, 0.56217653, 0.43782353, 0.56217653],
    "sigmoid": [0.18242551, 0.22270015, 0.26894143, 0.32082129, 0.37754068, 0.4378235, 0.5, 0.56217653, 0.62245935, 0.67917871, 0.7310586, 0.77729982],
    "tanh": [-0.90514821, -0.84828371, -0.76159418, -0.635149, -0.46211717, -0.24491866, 0, 0.24491866, 0.46211717, 0.635149, 0.76159418, 0.84828371],
    "softplus": [0.20141326, 0.2519291, 0.31326169, 0.38687098, 0.47407699, 0.57593948, 0.69314718, 0.82593942, 0.97407699, 1.1368711, 1.3132616, 1.501929],
    "softsign": [-0.60000002, -0.55555558, -0.5, -0.42857143, -0.33333334, -0.2, 0, 0.2, 0.33333334, 0.42857143, 0.5, 0.55555558],
    "elu": [-0.38843492, -0.3567476, -0.31606027, -0.26381671, -0.19673467, -0.11059961, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "relu": [-0.15000001, -0.125, -0.1, -0.075000003, -0.050000001, -0.025, 0, 0.25, 0.5, 0.75, 1, 1],
    "binary_crossentropy": [0.1053604, 0.18962073, 0.28163961, 0.38299206, 0.49578756, 0.62294275, 0.62294269, 0.49578756, 0.38299206, 0.28163961, 0.18962073, 0.10536041],
    "categorical_crossentropy": [2.2562091, 1.5062091],
    "sparse_categorical_crossentropy": [2.2562091, 1.5062091],
    "one_hot": [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    "arange": [0, 1, 2, 3, 4],
    "logsumexp": [0.18026966, 0.43026966, 1.6802697, 1.9302697],
    "zeros": [0, 0, 0, 0],
    "ones_like": [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
    "switch": [0.1, 0.17272727, 0.24545455, 0.31818181, 0.39090911, 0.46363637, 0.53636366, 0.25, 0.5, 0.75, 1, 1.25],
    "stop_gradient": [-1.5, -1.25, -1, -0.75, -0.5, -0.25, 0, 0.25, 0.5, 0.75, 1, 1.25],
    "constant": [3],
    "variable": [3, 3, 3, 3],
    "ndim": [3],
    "reverse": [-0.5, -0.25, -1, -0.75, -1.5, -1.25, 1, 1.25, 0.5, 0.75, 0, 0.25],
    "slice": [-1, -0.5, 0.5, 1],
    "size": [12],
    "eye": [1, 0, 0, 0, 1, 0, 0, 0, 1],
    "l2_normalize": [-0.80178368, -0.84515423, -0.53452247, -0.50709254, -0.26726124, -0.16903085, 0, 0.16903085, 0.44721359, 0.50709254, 0.89442718, 0.84515423],
    "l2_normalize_all": [-0.49656352, -0.41380292, -0.33104235, -0.24828176, -0.16552117, -0.082760587, 0, 0.082760587, 0.16552117, 0.24828176, 0.33104235, 0.41380292],
    "repeat": [-1.5, -1.25, -1.5, -1.25, -1.5, -1.25, -1, -0.75, -1, -0.75, -1, -0.75, -0.5, -0.25, -0.5, -0.25, -0.5, -0.25, 0, 0.25, 0, 0.25, 0, 0.25, 0.5, 0.75, 0.5, 0.75, 0.5, 0.75, 1, 1.25, 1, 1.25, 1, 1.25],
    "bias_add": [-1, -3.25, -0.5, -2.75, 0, -2.25, 0.5, -1.75, 1, -1.25, 1.5, -0.75],
    "bias_add_2d": [-1, -3.25, -0.5, -2.75, 0, -2.25, 0.5, -1.75, 1, -1.25, 1.5, -0.75],
    "cast_to_floatx": [0, 0.33333334, 0.66666669],
}


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
@pytest.mark.core
def test_migrated_backend_calls_compute_what_keras23_computed() -> None:
    result = run_keras23(BATTERY, "battery.py")["result"]
    assert result.pop("dtype") == "float32"
    assert result["cast_to_floatx"][0] == "float32"  # rtol 1e-6 would pass float64 too
    errors = {name: value for name, value in result.items() if value[0] == "error"}
    assert not errors, errors
    assert set(result) == set(KERAS23)
    for name, (_, values) in result.items():
        np.testing.assert_allclose(values, KERAS23[name], rtol=1e-6, atol=1e-6, err_msg=name)


@pytest.mark.text
def test_unseeded_random_in_a_layer_call_warns_on_keras3() -> None:
    text = """
        from keras import backend as K
        from keras.layers import Layer
        noise = K.random_normal((2, 3))
        class Noisy(Layer):
            def call(self, inputs):
                return inputs + K.random_uniform((32, 1)) + K.random_normal((1,), seed=3)
    """
    assert severities(text, "without a seed inside a layer's call") == [Severity.WARNING]
    assert [line for line, severity, message in found(text)
            if "without a seed" in message] == [6]
    assert severities(text, "without a seed", "tf_keras") == []
