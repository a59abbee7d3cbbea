"""`kerasmgpu migrate`, the training family: what a model trains, Keras 2.3 internals.

Source tests (libcst), and one run against Keras 2.3.1; the GAN pattern's `trainable` is test_migrate_trainable.py's.
"""

from __future__ import annotations

from typing import List

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
    src,
)

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity


@pytest.mark.text
def test_positional_optimizer_arguments_are_named_in_the_message() -> None:
    text = "from keras.optimizers import Adam\nopt = Adam(0.0002, 0.5)\n"
    assert "opt = Adam(learning_rate=0.0002, beta_1=0.5)\n" in migrate(text)
    assert lines_found(text, "Adam(0.0002, 0.5) -> Adam(learning_rate=0.0002, beta_1=0.5)") \
        == [2]


EMBEDDING = """
    from keras.layers import Embedding
    from keras.optimizers import Adam
    emb = Embedding(1000, 8)
    model.compile(optimizer='rmsprop', loss='mse')
    model.compile(optimizer=Adam(1e-3), loss='mse')
    """


@pytest.mark.text
def test_a_moment_optimizer_with_an_embedding_is_a_warning_on_keras3() -> None:
    assert lines_found(EMBEDDING, "sparse row updates") == [4, 5]
    assert severities(EMBEDDING, "sparse row updates") == [Severity.WARNING] * 2
    assert not lines_found(EMBEDDING, "sparse row updates", "tf_keras")
    no_embedding = "from keras.optimizers import Adam\nopt = Adam()\n"
    assert not lines_found(no_embedding, "sparse row updates")


@pytest.mark.text
def test_history_acc_follows_the_metric_name() -> None:
    text = """
        model.compile('sgd', 'mse', metrics=['accuracy'])
        h = model.fit(x, y)
        plt.plot(h.history["acc"]); plt.plot(h.history['val_acc'])
        """
    after = assert_idempotent(text)
    assert """plt.plot(h.history["accuracy"]); plt.plot(h.history['val_accuracy'])""" in after
    assert lines_found(text, "history['acc'] -> history['accuracy']") == [3]
    kept = text.replace("'accuracy'", "'acc'")
    assert migrate(kept) == src(kept)  # metrics=['acc'] names the key 'acc' everywhere


@pytest.mark.text
def test_collections_abcs_move_to_collections_abc() -> None:
    text = "from collections import Iterable, Mapping\nfrom collections import OrderedDict\n"
    assert migrate(text, "tf_keras") == (
        "from collections.abc import Iterable, Mapping\nfrom collections import OrderedDict\n")
    mixed = "from collections import Iterable, OrderedDict\n"
    assert severities(mixed, "moved to collections.abc") == [Severity.WARNING]
    assert migrate(text, "keras23") == text


@pytest.mark.text
def test_keras_shape_becomes_the_static_shape() -> None:
    text = "rows = x._keras_shape[1]\n"
    assert migrate(text) == "rows = tuple(x.shape)[1]\n"
    assert lines_found(text, "_keras_shape -> tuple(x.shape)") == [1]


@pytest.mark.text
@pytest.mark.parametrize(
    ("line", "col", "fix"),
    [
        ("from keras.layers.merge import _Merge", 32, "subclass keras.layers.Layer"),
        ("from keras.layers import merge", 26, "import the layers from keras.layers"),
        ("from keras.applications.imagenet_utils import _obtain_input_shape as shape", 47,
         "write the input shape out"),
    ],
)
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_keras23_internals_are_errors_with_the_fix(line: str, col: int, fix: str,
                                                   target: str) -> None:
    text = f"import os\n{line}\n"
    errors = [(f.line, f.col) for f in findings(text, target)
              if f.severity is Severity.ERROR and fix in f.message]
    assert errors == [(2, col)]
    assert migrate(text, target) == text  # not renamed to a name that does not exist


@pytest.mark.text
def test_tf1_mean_iou_is_an_error_naming_the_keras_metric() -> None:
    text = "import tensorflow as tf\nm = tf.metrics.mean_iou(a, b, 2)\n"
    assert severities(text, "keras.metrics.MeanIoU(num_classes)") == [Severity.ERROR]


@pytest.mark.text
@pytest.mark.parametrize(
    ("call", "fix"),
    [
        ("K.bias_add(x, b, data_format='channels_first')",
         "x + keras.ops.reshape(bias, (1, -1) + (1,) * (len(x.shape) - 2))"),
        ("K.depthwise_conv2d(x, k)", "keras.ops.depthwise_conv(x, kernel"),
    ],
)
def test_backend_errors_name_their_one_line_replacement(call: str, fix: str) -> None:
    text = f"from keras import backend as K\ny = {call}\n"
    assert severities(text, fix) == [Severity.ERROR]


@pytest.mark.text
def test_gone_model_helpers_name_their_replacement() -> None:
    text = ("from keras.models import model_from_config\n"
            "from keras.utils import convert_all_kernels_in_model\n"
            "model = model_from_config(config)\nconvert_all_kernels_in_model(model)\n")
    messages: List[str] = [f.message for f in findings(text)]
    assert any("keras.layers.deserialize(config)" in m for m in messages)
    assert any("delete the call" in m and "Theano" in m for m in messages)


MULTI_OUTPUT = """
    from keras.layers import Dense, Input
    from keras.models import Model
    a = Input((3,))
    model = Model(a, [Dense(1, name="v")(a), Dense(4, name="c")(a)])
    model.compile("adam", ["binary_crossentropy", "sparse_categorical_crossentropy"],
                  metrics=['accuracy'])
    """


@pytest.mark.text
def test_flat_metrics_of_a_multi_output_model_become_one_list_per_output() -> None:
    out = assert_idempotent(MULTI_OUTPUT)
    assert "metrics=[['accuracy']] * len(model.outputs))" in out
    assert lines_found(MULTI_OUTPUT, "one list per output") == [6]
    assert migrate(MULTI_OUTPUT, "tf_keras").count("metrics=['accuracy']") == 1
    single = MULTI_OUTPUT.replace('[Dense(1, name="v")(a), Dense(4, name="c")(a)]', "a")
    assert "metrics=['accuracy']" in migrate(single)


PER_OUTPUT_RUN = '''
import numpy as np
from keras.layers import Dense, Input
from keras.models import Model

a = Input((3,))
model = Model(a, [Dense(1, activation="sigmoid", kernel_initializer="ones", name="v")(a),
                  Dense(4, activation="softmax", kernel_initializer="ones", name="c")(a)])
model.compile("sgd", ["binary_crossentropy", "sparse_categorical_crossentropy"],
              metrics=["accuracy"])
x = np.linspace(-1, 1, 24).reshape(8, 3).astype("float32")
y = [(x[:, :1] > 0).astype("float32"), np.arange(8) % 4]
result = [float(v) for v in model.train_on_batch(x, y)]
'''


KERAS23_PER_OUTPUT = [1.631477, 0.24518259, 1.3862944, 1.0, 0.25]


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_per_output_metrics_come_back_in_keras23s_order() -> None:
    # [loss, v_loss, c_loss, v_accuracy, c_accuracy] on Keras 2.3.1 (recorded on keras23);
    # Keras 3 returns the per-output metrics by name (c_accuracy first: the WARNING says so).
    result = run_keras23(PER_OUTPUT_RUN, "per_output.py")["result"]
    expected = list(KERAS23_PER_OUTPUT)
    if LINE is KerasLine.KERAS_3:
        expected[3:] = expected[:2:-1]
    np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)


BRANCH = """
    from keras import backend as K

    def masked_accuracy(y_true, y_pred):
        if K.sum(y_true) == 0:
            return K.mean(y_pred) * 0
        return K.mean(y_pred)
    """


@pytest.mark.text
def test_a_python_branch_on_a_tensor_in_a_metric_is_reported() -> None:
    assert [(f.line, f.col, f.severity) for f in findings(BRANCH)
            if "a Python branch on a tensor" in f.message] == [(4, 8, Severity.ERROR)]
    assert severities(BRANCH, "tf_keras's autograph makes it a real condition",
                      "tf_keras") == [Severity.WARNING]
    plain = "def f(y_true, y_pred, n=2):\n    if n > 1:\n        return y_pred\n"
    assert not lines_found(plain, "a Python branch")


SPARSE_RUN = '''
import numpy as np
from keras.layers import Dense, Embedding, Flatten
from keras.models import Sequential
from keras.optimizers import Adam

model = Sequential([Embedding(6, 2, input_length=2), Flatten(), Dense(1)])
model.build((None, 2))
rng = np.random.RandomState(0)
model.set_weights([rng.uniform(-1, 1, w.shape) for w in model.get_weights()])
model.compile(Adam(0.1), "mse")
batches = [np.array([[3, 4], [5, 0], [1, 2], [0, 1]])] + [
    np.array([[step % 2, 2]] * 4) for step in range(1, 10)]
for ids in batches:  # rows 3 - 5 only in the first batch
    model.train_on_batch(ids, np.ones((4, 1)))
result = model.get_weights()[0].ravel().tolist()
'''
# The Embedding's weights after 10 Adam steps on Keras 2.3.1 (recorded on keras23).
KERAS23_SPARSE = [0.02482, 0.59661, 0.24577, 0.59954, -0.86192, -0.44497, 0.29393, 1.20231,
                  0.50857, -0.65188, 1.0022, 0.47655]


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_sparse_embedding_updates_differ_only_where_the_warning_says() -> None:
    result = run_keras23(SPARSE_RUN, "sparse.py")["result"]
    from helpers import BACKEND

    if LINE is KerasLine.KERAS_3 and BACKEND == "tensorflow":
        # Keras 3 on TensorFlow: sparse row updates (the WARNING); the rows the later
        # batches did not touch keep Keras 2.3's values, the others end elsewhere.
        assert np.max(np.abs(np.array(result) - KERAS23_SPARSE)) > 0.1
        assert severities(SPARSE_RUN, "sparse row updates") == [Severity.WARNING]
        return
    np.testing.assert_allclose(result, KERAS23_SPARSE, rtol=0, atol=2e-5)


CLASS_WEIGHTS_RUN = '''
import numpy as np
from keras.layers import Dense, Input
from keras.models import Model
from keras.utils import to_categorical

a = Input((3,))
model = Model(a, [Dense(1, activation="sigmoid")(a), Dense(3, activation="softmax")(a)])
single = Model(a, Dense(1, activation="sigmoid")(a))
rng = np.random.RandomState(0)
for m in (model, single):
    m.set_weights([rng.uniform(-1, 1, w.shape) for w in m.get_weights()])
model.compile("sgd", ["binary_crossentropy", "categorical_crossentropy"])
single.compile("sgd", "binary_crossentropy")
cw1 = {0: 1, 1: 3}
cw2 = {0: 0.5, 1: 2, 2: 1}
x = rng.rand(6, 3)
valid = (x[:, :1] > 0.5).astype("float32")
labels = to_categorical(np.arange(6) % 3, num_classes=3)
for step in range(3):
    model.train_on_batch(x, [valid, labels], class_weight=[cw1, cw2])
    single.train_on_batch(x, valid, class_weight=[cw1, cw2])  # Keras 2.3 ignored the list
result = [float(v) for m in (model, single) for w in m.get_weights() for v in np.ravel(w)]
'''
# Both models' weights after 3 steps on Keras 2.3.1 (recorded on keras23).
KERAS23_CLASS_WEIGHTS = [
    0.10787446, 0.43307582, 0.21119902, 0.09741916, -0.16418819, 0.30105031, -0.12258988,
    0.77281159, 0.93141687, -0.22647391, 0.57459015, 0.06213457, 0.14060424, 0.82932705,
    -0.84340173, -0.81840128, -0.95897281, 0.66107166, 0.55430841, 0.73421067]


@pytest.mark.text
def test_per_output_class_weights_become_keras23s_sample_weights() -> None:
    out = assert_idempotent(CLASS_WEIGHTS_RUN, "tf_keras")
    assert ("model.train_on_batch(x, [valid, labels], sample_weight="
            "_class_weights_as_sample_weights([valid, labels], [cw1, cw2]))") in out
    assert out.count("def _class_weights_as_sample_weights(ys, class_weights):") == 1
    keep = CLASS_WEIGHTS_RUN.replace("class_weight=[cw1, cw2])  #", "class_weight=[cw1, cw2], "
                                     "sample_weight=w)  #")
    assert severities(keep, "class_weight as a list") == [Severity.ERROR]


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_per_output_class_weights_train_as_keras23() -> None:
    result = run_keras23(CLASS_WEIGHTS_RUN, "class_weights.py")["result"]
    np.testing.assert_allclose(result, KERAS23_CLASS_WEIGHTS, rtol=0, atol=2e-6)
