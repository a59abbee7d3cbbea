"""`kerasmgpu migrate`, ImageDataGenerator: Keras 2.3's own class on Keras 3, plus advice."""

from __future__ import annotations

import importlib.util

import pytest
from migrate_cases import assert_idempotent, env_target, findings, migrate, src

from kerasmgpu.migrate import Severity

TEXT = """
from keras.preprocessing.image import ImageDataGenerator
datagen = ImageDataGenerator(rescale=1. / 255, rotation_range=20, horizontal_flip=True,
                             channel_shift_range=0.1)
"""


@pytest.mark.text
def test_keras3_imports_keras_preprocessing_told_to_use_keras_3() -> None:
    # the line for ImageDataGenerator opens the file's import block: libcst's
    # AddImportsVisitor adds `import keras` after it (before the call, which needs it)
    assert migrate(TEXT) == src("""
        import keras_preprocessing
        import keras

        keras_preprocessing.set_keras_submodules(backend=keras.backend, utils=keras.utils)
        from keras_preprocessing.image import ImageDataGenerator
        datagen = ImageDataGenerator(rescale=1. / 255, rotation_range=20, horizontal_flip=True,
                                     channel_shift_range=0.1)
        """)
    assert_idempotent(TEXT)
    warning, = [f for f in findings(TEXT) if f.severity is Severity.WARNING]
    assert warning.line == 1  # of the source given
    assert "pip install keras-preprocessing" in warning.message


@pytest.mark.text
def test_keras3_other_names_of_the_module_stay_and_an_alias_is_kept() -> None:
    out = migrate("""
        import keras
        # augmentation
        from tensorflow.keras.preprocessing.image import ImageDataGenerator as IDG, img_to_array
        g = IDG()
        """)
    assert out == src("""
        import keras
        # augmentation
        import keras_preprocessing
        keras_preprocessing.set_keras_submodules(backend=keras.backend, utils=keras.utils)
        from keras.preprocessing.image import img_to_array
        from keras_preprocessing.image import ImageDataGenerator as IDG
        g = IDG()
        """)


@pytest.mark.text
def test_keras3_the_calls_map_each_argument_to_a_layer() -> None:
    calls = [f for f in findings(TEXT) if "in Keras 3:" in f.message]
    assert [(f.line, f.severity) for f in calls] == [(2, Severity.INFO)]
    call = calls[0].message
    assert "rescale -> keras.layers.Rescaling(scale)" in call
    assert "rotation_range -> keras.layers.RandomRotation(degrees / 360)" in call
    assert "horizontal_flip -> keras.layers.RandomFlip('horizontal')" in call
    assert "channel_shift_range: no layer, write it yourself" in call


@pytest.mark.text
def test_keras3_a_module_spelling_is_an_error_with_the_mapping() -> None:
    text = """
        from keras.preprocessing import image
        datagen = image.ImageDataGenerator(horizontal_flip=True)
        """
    assert migrate(text) == src(text)
    errors = [f for f in findings(text) if f.severity is Severity.ERROR]
    assert [f.line for f in errors] == [2]
    assert "horizontal_flip -> keras.layers.RandomFlip('horizontal')" in errors[0].message


@pytest.mark.text
def test_keras3_none_defaults_resolved_as_keras23s_wrapper_did() -> None:
    """cifar10_cnn.py of Keras 2.3.1 passes data_format=None; keras-preprocessing rejects it."""
    text = """
        import keras
        from keras.preprocessing.image import ImageDataGenerator
        g = ImageDataGenerator(rotation_range=0, data_format=None, dtype=None)
        """
    after = assert_idempotent(text)
    assert ("g = ImageDataGenerator(rotation_range=0, data_format=keras.config."
            "image_data_format(), dtype=keras.config.floatx())") in after
    untouched = migrate(TEXT)
    assert "channel_shift_range=0.1)" in untouched  # no None, no setting changed: left
    changed = "from keras import backend as K\nK.set_image_data_format('channels_first')\n"
    assert "data_format=keras.config.image_data_format())" in migrate(changed + src(TEXT))


@pytest.mark.text
def test_keras3_keras_imported_further_down_is_imported_before_the_call() -> None:
    text = """
        from keras.preprocessing.image import ImageDataGenerator
        import keras
        """
    after = assert_idempotent(text)
    assert after.startswith("import keras\nimport keras_preprocessing\n"
                            "keras_preprocessing.set_keras_submodules(")


@pytest.mark.text
def test_keras3_text_module_becomes_keras_preprocessing_text() -> None:
    text = """
        from keras.preprocessing.text import Tokenizer, text_to_word_sequence as words
        tokenizer = Tokenizer(num_words=10)
        """
    assert migrate(text) == src("""
        from keras_preprocessing.text import Tokenizer, text_to_word_sequence as words
        tokenizer = Tokenizer(num_words=10)
        """)
    assert [(f.line, f.severity) for f in findings(text)] == [(1, Severity.WARNING)]
    assert "pip install keras-preprocessing" in findings(text)[0].message
    assert_idempotent(text)
    kept = migrate(text, "tf_keras")
    assert kept.startswith("from tf_keras.preprocessing.text import Tokenizer")


@pytest.mark.text
def test_tf_keras_still_has_it() -> None:
    assert [f.severity for f in findings(TEXT, "tf_keras") if "ImageDataGenerator" in
            f.message] == [Severity.INFO]
    assert "from tf_keras.preprocessing.image import ImageDataGenerator" in migrate(
        TEXT, "tf_keras")


@pytest.mark.skipif(importlib.util.find_spec("keras_preprocessing") is None,
                    reason="keras-preprocessing is not installed in this env")
def test_keras3_migrated_generator_trains() -> None:
    """The migrated import runs on Keras 3: flow(x, y) is a PyDataset that fit() reads."""
    if env_target() != "keras3":
        pytest.skip("a Keras 3 env")
    code = migrate(TEXT) + src("""
        import numpy as np
        x = np.random.RandomState(0).rand(12, 6, 6, 3).astype("float32")
        y = np.arange(12, dtype="float32").reshape(12, 1)
        model = keras.Sequential([keras.Input((6, 6, 3)), keras.layers.Flatten(),
                                  keras.layers.Dense(1)])
        model.compile("sgd", "mse")
        history = model.fit(datagen.flow(x, y, batch_size=4, shuffle=False), epochs=1,
                            verbose=0)
        """)
    space: dict = {}
    exec(compile(code, "migrated.py", "exec"), space)
    assert len(space["history"].history["loss"]) == 1
