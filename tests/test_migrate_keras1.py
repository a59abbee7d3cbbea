"""`kerasmgpu migrate`, the Keras 1 and layers families.

Keras 1 calls are rewritten to what Keras 2.3's legacy interface built from them: on the
keras23 env each original call and its rewrite build layers with the same config (Keras 2.3
converting by itself, the rewrite doing it in the source); on Keras 3 and tf_keras the
rewrite builds and has the same kernel, strides, padding and units.
"""

from __future__ import annotations

from typing import Any, Dict

import pytest
from helpers import LINE, keras_module, requires
from migrate_cases import assert_idempotent, findings, migrate, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity, migrate_source

CASES = [
    ("Convolution2D(32, 3, 3, border_mode='same', init='he_normal')",
     "Convolution2D(32, (3, 3), padding='same', kernel_initializer='he_normal')"),
    ("Convolution2D(16, 5, 5, subsample=(2, 2), activation='relu')",
     "Convolution2D(16, (5, 5), strides=(2, 2), activation='relu')"),
    ("Conv2D(8, 3, nb_col=2, dim_ordering='tf')",
     "Conv2D(8, (3, 2), data_format='channels_last')"),
    ("Convolution1D(nb_filter=4, filter_length=3, border_mode='valid', subsample_length=1)",
     "Convolution1D(filters=4, kernel_size=3, padding='valid', strides=1)"),
    ("Convolution3D(4, 3, 3, 3)", "Convolution3D(4, (3, 3, 3))"),
    ("Dense(output_dim=10, init='uniform', W_regularizer=None, bias=False)",
     "Dense(units=10, kernel_initializer='uniform', kernel_regularizer=None, use_bias=False)"),
    ("Dropout(p=0.25)", "Dropout(rate=0.25)"),
    ("MaxPooling2D(pool_size=(2, 2), border_mode='same', dim_ordering='th')",
     "MaxPooling2D(pool_size=(2, 2), padding='same', data_format='channels_first')"),
    ("MaxPooling1D(pool_length=2, stride=1)", "MaxPooling1D(pool_size=2, strides=1)"),
    ("LSTM(output_dim=16, inner_activation='sigmoid', dropout_W=0.1, dropout_U=0.2,"
     " consume_less='gpu')",
     "LSTM(units=16, recurrent_activation='sigmoid', dropout=0.1, recurrent_dropout=0.2,"
     " implementation=2)"),
    ("Embedding(100, 8, init='uniform', dropout=0.2)",
     "Embedding(100, 8, embeddings_initializer='uniform')"),
    ("BatchNormalization(mode=0, axis=1, beta_init='zero')",
     "BatchNormalization(axis=1, beta_initializer='zero')"),
    ("GaussianNoise(sigma=0.1)", "GaussianNoise(stddev=0.1)"),
    ("UpSampling1D(length=2)", "UpSampling1D(size=2)"),
]


@pytest.mark.text
@pytest.mark.parametrize(("old", "new"), CASES)
def test_keras1_layer_calls(old: str, new: str) -> None:
    text = f"from keras.layers import *\nlayer = {old}\n"
    assert migrate(text) == f"from keras.layers import *\nlayer = {new}\n"
    assert migrate(text, "tf_keras").endswith(f"layer = {new}\n")
    assert migrate(text, "keras23") == text
    assert_idempotent(text)


@pytest.mark.text
def test_runtime_kernel_sizes_are_an_error_not_a_guess() -> None:
    text = "from keras.layers import Conv2D\ndef build(k):\n    return Conv2D(32, k, k)\n"
    assert migrate(text) == text
    [error] = findings(text)
    assert error.severity is Severity.ERROR
    assert "modern Keras always reads strides, silently" in error.message


@pytest.mark.text
def test_model_input_output_and_nb_epoch() -> None:
    text = "from keras.models import Model\nm = Model(input=a, output=b)\nm.fit(x, y, nb_epoch=3)\n"
    assert migrate(text) == (
        "from keras.models import Model\nm = Model(inputs=a, outputs=b)\nm.fit(x, y, epochs=3)\n"
    )


@pytest.mark.text
@pytest.mark.parametrize(
    ("call", "new"),
    [("merge([a, b], mode='concat', concat_axis=1)", "keras.layers.concatenate([a, b], axis=1)"),
     ("merge([a, b], mode='concat')", "keras.layers.concatenate([a, b])"),
     ("merge([a, b], mode='sum')", "keras.layers.add([a, b])"),
     ("merge([a, b])", "keras.layers.add([a, b])"),
     ("merge([a, b], mode='mul', name='m')", "keras.layers.multiply([a, b], name='m')"),
     ("merge([a, b], mode='dot', dot_axes=1)", "keras.layers.dot([a, b], axes=1)"),
     ("merge([a, b], mode='cos', dot_axes=1)",
      "keras.layers.dot([a, b], axes=1, normalize=True)")],
)
def test_keras1_merge_function(call: str, new: str) -> None:
    text = f"from keras.layers import Input, merge\nout = {call}\n"
    after = migrate(text)
    assert f"out = {new}\n" in after
    assert "from keras.layers import Input\n" in after  # merge's import went


@pytest.mark.text
def test_merge_with_a_callable_mode_and_the_merge_layer_are_errors() -> None:
    text = "from keras.layers import merge, Merge\na = merge([x, y], mode=f)\nb = Merge([l, r])\n"
    assert severities(text, "merge") == [Severity.ERROR, Severity.ERROR]


KERAS23_CONFIG_KEYS = ("filters", "kernel_size", "strides", "padding", "data_format", "units",
                       "rate", "pool_size", "stddev", "size", "use_bias", "implementation",
                       "recurrent_activation", "dropout", "recurrent_dropout", "axis",
                       "output_dim", "input_dim")


def _config(keras: Any, call: str) -> Dict[str, Any]:
    namespace: Dict[str, Any] = {name: getattr(keras.layers, name) for name in dir(keras.layers)
                                 if not name.startswith("_")}
    layer = eval(call, namespace)
    config = layer.get_config()
    return {key: _plain(config[key]) for key in KERAS23_CONFIG_KEYS if key in config}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
@pytest.mark.core
@pytest.mark.parametrize(("old", "new"), CASES)
def test_the_rewrite_builds_what_keras23_built(old: str, new: str) -> None:
    keras = keras_module()
    target = {KerasLine.KERAS_3: "keras3"}.get(LINE, "tf_keras")
    text = f"from keras.layers import *\nlayer = {old}\n"
    rewritten = migrate_source(text, "f.py", target).new_source.splitlines()[-1]
    built = _config(keras, rewritten.split(" = ", 1)[1])
    if LINE is KerasLine.LEGACY:  # Keras 2.3 converts the Keras 1 call itself
        assert _config(keras, old) == built
    else:  # the same layer here: compare the arguments Keras 2.3 would have built
        assert rewritten.split(" = ", 1)[1] == new
        assert built  # it built


@pytest.mark.text
def test_kernel_sizes_from_module_constants_are_ints() -> None:
    text = """
        from keras.layers import Convolution2D
        nb_filters = 32
        nb_conv = 3
        kernel_size = (3, 3)
        a = Convolution2D(nb_filters, nb_conv, nb_conv, border_mode='valid')
        b = Convolution2D(nb_filters, kernel_size[0], kernel_size[1])
    """
    after = migrate(text)
    assert "a = Convolution2D(nb_filters, (nb_conv, nb_conv), padding='valid')" in after
    assert "b = Convolution2D(nb_filters, (kernel_size[0], kernel_size[1]))" in after
    reassigned = "from keras.layers import Conv2D\nk = 3\nk = 5\nc = Conv2D(8, k, k)\n"
    assert severities(reassigned, "always reads strides") == [Severity.ERROR]
