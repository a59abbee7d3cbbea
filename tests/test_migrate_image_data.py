"""`kerasmgpu migrate`, ImageDataGenerator: advice naming the replacement."""

from __future__ import annotations

from migrate_cases import findings, migrate

from kerasmgpu.migrate import Severity

TEXT = """
from keras.preprocessing.image import ImageDataGenerator
datagen = ImageDataGenerator(rescale=1. / 255, rotation_range=20, horizontal_flip=True,
                             channel_shift_range=0.1)
"""


def test_keras3_reports_errors_that_map_each_argument_to_a_layer() -> None:
    assert migrate(TEXT) == TEXT.lstrip("\n")
    errors = [f for f in findings(TEXT) if f.severity is Severity.ERROR]
    assert [f.line for f in errors] == [1, 2]
    assert "image_dataset_from_directory" in errors[0].message
    call = errors[1].message
    assert "rescale -> keras.layers.Rescaling(scale)" in call
    assert "rotation_range -> keras.layers.RandomRotation(degrees / 360)" in call
    assert "horizontal_flip -> keras.layers.RandomFlip('horizontal')" in call
    assert "channel_shift_range: no layer, write it yourself" in call


def test_tf_keras_still_has_it() -> None:
    assert [f.severity for f in findings(TEXT, "tf_keras") if "ImageDataGenerator" in
            f.message] == [Severity.INFO]
    assert "from tf_keras.preprocessing.image import ImageDataGenerator" in migrate(
        TEXT, "tf_keras")
