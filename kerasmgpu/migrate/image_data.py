"""`ImageDataGenerator`: advice, not a rewrite.

Keras 3 has no `ImageDataGenerator` (tf_keras keeps it, deprecated). Its replacement is a
different design - a dataset of files plus augmentation layers inside the model or the
pipeline - with other randomness, so no rewrite could keep what the generator produced.
The report says what each argument of each `ImageDataGenerator(...)` becomes:

* `flow_from_directory(...)` -> `keras.utils.image_dataset_from_directory(...)`; `flow(x, y)`
  -> a `keras.utils.PyDataset` or `tf.data.Dataset.from_tensor_slices`;
* `rescale` -> `keras.layers.Rescaling`, `rotation_range` (degrees) ->
  `RandomRotation(degrees / 360)`, `width_shift_range`/`height_shift_range` ->
  `RandomTranslation`, `zoom_range` -> `RandomZoom`, `horizontal_flip`/`vertical_flip` ->
  `RandomFlip`, `brightness_range` -> `RandomBrightness`, `shear_range` -> `RandomShear`
  (Keras 3.7+); `featurewise_center`/`featurewise_std_normalization` ->
  `keras.layers.Normalization` adapted on the data; the rest has no layer.

`--to keras3`: an ERROR at each import and construction (the import fails there).
`--to tf_keras`: an INFO (it still works). `--to keras23`: nothing.
"""

from __future__ import annotations

from typing import List

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Rule
from kerasmgpu.migrate.report import Target

LAYERS = {
    "rescale": "keras.layers.Rescaling(scale)",
    "rotation_range": "keras.layers.RandomRotation(degrees / 360)",
    "width_shift_range": "keras.layers.RandomTranslation(height_factor=0, width_factor=...)",
    "height_shift_range": "keras.layers.RandomTranslation(height_factor=..., width_factor=0)",
    "zoom_range": "keras.layers.RandomZoom",
    "horizontal_flip": "keras.layers.RandomFlip('horizontal')",
    "vertical_flip": "keras.layers.RandomFlip('vertical')",
    "brightness_range": "keras.layers.RandomBrightness",
    "shear_range": "keras.layers.RandomShear (Keras 3.7+)",
    "featurewise_center": "keras.layers.Normalization adapted on the training data",
    "featurewise_std_normalization": "keras.layers.Normalization adapted on the training data",
    "fill_mode": "the fill_mode= of the Random* layers",
    "validation_split": "validation_split= of image_dataset_from_directory",
    "preprocessing_function": "a map() over the dataset, or a Lambda layer",
}
MSG_IMPORT = (
    "ImageDataGenerator does not exist in Keras 3: load the files with "
    "keras.utils.image_dataset_from_directory (for flow_from_directory) or a "
    "keras.utils.PyDataset / tf.data pipeline (for flow), and augment with preprocessing "
    "layers (keras.layers.Rescaling, RandomFlip, RandomRotation, RandomZoom, "
    "RandomTranslation...); the constructor calls below say which. To keep Keras 2.3's exact "
    "generator for now: Keras 2.3's was the keras-preprocessing package's (pip install "
    "keras-preprocessing; call keras_preprocessing.set_keras_submodules(backend="
    "keras.backend, utils=keras.utils) before importing keras_preprocessing.image)"
)
MSG_CALL = "ImageDataGenerator({args}) in Keras 3: {mapping}"
MSG_TF_KERAS = (
    "ImageDataGenerator is deprecated in tf_keras (it still works); its successor is "
    "keras.utils.image_dataset_from_directory plus preprocessing layers"
)


class ImageDataRule(Rule):
    NAME = "image_data"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def is_generator(self, node: cst.CSTNode) -> bool:
        return any(name.endswith(".ImageDataGenerator") for name in self.ctx.keras_names(node))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        if any(nodes.dotted(alias.name) == "ImageDataGenerator" for alias in node.names):
            module = nodes.module_of(node)
            if self.ctx.target is Target.KERAS3 and module.split(".")[0] in (
                    "keras", "tensorflow", "tf_keras"):
                self.error(node, MSG_IMPORT)

    def visit_Call(self, node: cst.Call) -> None:
        if not self.is_generator(node.func):
            return
        if self.ctx.target is Target.TF_KERAS:
            self.info(node, MSG_TF_KERAS)
            return
        used: List[str] = [nodes.keyword(arg) or "" for arg in node.args if arg.keyword]
        mapping = [f"{key} -> {LAYERS[key]}" for key in used if key in LAYERS]
        rest = [key for key in used if key not in LAYERS]
        if rest:
            mapping.append(f"{', '.join(rest)}: no layer, write it yourself")
        args = ", ".join(used) or "no arguments"
        self.error(node, MSG_CALL.format(args=args, mapping="; ".join(mapping) or
                                         "the dataset alone (no augmentation)"))


RULE = ImageDataRule
