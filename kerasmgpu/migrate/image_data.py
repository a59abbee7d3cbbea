"""`ImageDataGenerator` on Keras 3: Keras 2.3's own class, plus the advice to move off it.

Keras 3 has no `ImageDataGenerator` (tf_keras keeps it, deprecated). Keras 2.3's was the
`keras-preprocessing` package's (keras/preprocessing/image.py of 2.3.1 only subclasses it),
and that package runs on Keras 3 once it is told which Keras to use:
`keras_preprocessing.set_keras_submodules(backend=keras.backend, utils=keras.utils)` before
`keras_preprocessing.image` is imported makes its iterators `keras.utils.PyDataset`s that
Keras 3's `fit` reads (checked on TensorFlow and JAX). So `--to keras3` rewrites

    from keras.preprocessing.image import ImageDataGenerator

into those three lines (`import keras_preprocessing`, the call, `from
keras_preprocessing.image import ImageDataGenerator`): the same augmentation, the same
random draws, with a WARNING - the project needs `pip install keras-preprocessing` (a
package unmaintained since 2020). Other spellings (`image.ImageDataGenerator` through a
module) stay, with an ERROR.

`from keras.preprocessing.text import Tokenizer` (and the module's other functions) becomes
`from keras_preprocessing.text import ...` the same way (that module needs no Keras).

Keras 3's own successor is a different design - a dataset of files plus augmentation
layers inside the model or the pipeline - with other randomness, so no rewrite could keep
what the generator produced. The report says what each argument of each
`ImageDataGenerator(...)` becomes (an INFO where the import was rewritten, an ERROR where
it was not):

* `flow_from_directory(...)` -> `keras.utils.image_dataset_from_directory(...)`; `flow(x, y)`
  -> a `keras.utils.PyDataset` or `tf.data.Dataset.from_tensor_slices`;
* `rescale` -> `keras.layers.Rescaling`, `rotation_range` (degrees) ->
  `RandomRotation(degrees / 360)`, `width_shift_range`/`height_shift_range` ->
  `RandomTranslation`, `zoom_range` -> `RandomZoom`, `horizontal_flip`/`vertical_flip` ->
  `RandomFlip`, `brightness_range` -> `RandomBrightness`, `shear_range` -> `RandomShear`
  (Keras 3.7+); `featurewise_center`/`featurewise_std_normalization` ->
  `keras.layers.Normalization` adapted on the data; the rest has no layer.

`--to tf_keras`: an INFO (it still works). `--to keras23`: nothing.
"""

from __future__ import annotations

import functools
import re
from typing import List, Set

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule, canonical_keras_name
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
MSG_PORTED = (
    "ImageDataGenerator -> keras_preprocessing's ImageDataGenerator, Keras 2.3's own class "
    "(the same augmentation and random draws), told to use this Keras: the project now needs "
    "`pip install keras-preprocessing` (unmaintained since 2020). Keras 3's own successor: "
    "keras.utils.image_dataset_from_directory plus preprocessing layers (the constructor "
    "calls below say which)"
)
MSG_CALL = "ImageDataGenerator({args}) in Keras 3: {mapping}"
# keras.preprocessing.text of Keras 2.3.1: keras_preprocessing.text's functions, as they are.
TEXT_NAMES = frozenset({"Tokenizer", "hashing_trick", "one_hot", "text_to_word_sequence",
                        "tokenizer_from_json"})
MSG_TEXT = (
    "keras.preprocessing.text -> keras_preprocessing.text ({names}): Keras 2.3's own code "
    "(Keras 3 dropped the module), the same results: the project now needs `pip install "
    "keras-preprocessing` (unmaintained since 2020). Keras 3's own successor: "
    "keras.layers.TextVectorization (another API)"
)
MSG_CALL_LATER = "when you move off keras-preprocessing, " + MSG_CALL
MSG_TF_KERAS = (
    "ImageDataGenerator is deprecated in tf_keras (it still works); its successor is "
    "keras.utils.image_dataset_from_directory plus preprocessing layers"
)


class ImageDataRule(Rule):
    NAME = "image_data"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.ported: Set[str] = set()  # local names now bound to keras_preprocessing's class

    def is_generator(self, node: cst.CSTNode) -> bool:
        return any(name.endswith(".ImageDataGenerator") for name in self.ctx.keras_names(node))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        if self.ctx.target is Target.KERAS3 and self.port_text(node):
            return
        if any(nodes.dotted(alias.name) == "ImageDataGenerator" for alias in node.names):
            module = nodes.module_of(node)
            if self.ctx.target is Target.KERAS3 and module.split(".")[0] in (
                    "keras", "tensorflow", "tf_keras"):
                if not self.port(node):
                    self.error(node, MSG_IMPORT)

    def port_text(self, node: cst.ImportFrom) -> bool:
        """`from keras.preprocessing.text import Tokenizer` -> keras_preprocessing.text's."""
        if canonical_keras_name(nodes.module_of(node)) != "keras.preprocessing.text":
            return False
        assert not isinstance(node.names, cst.ImportStar)
        names = [nodes.dotted(alias.name) or "" for alias in node.names]
        if not set(names) <= TEXT_NAMES:
            return False  # the imports family reports what Keras 3 lacks
        for alias in node.names:  # the imports family leaves them to this rewrite
            self.ctx.claimed.add(nodes.dotted(alias.asname.name if alias.asname else alias.name)
                                 or "")
        self.ctx.edit(node, lambda updated: updated.with_changes(
            module=nodes.attr_chain("keras_preprocessing.text")))
        self.warning(node, MSG_TEXT.format(names=", ".join(names)))
        return True

    def port(self, node: cst.ImportFrom) -> bool:
        """`from keras.preprocessing.image import ImageDataGenerator` -> keras_preprocessing's."""
        line = self.ctx.parent(node)
        if (canonical_keras_name(nodes.module_of(node)) != "keras.preprocessing.image"
                or not isinstance(line, cst.SimpleStatementLine) or len(line.body) != 1):
            return False
        assert not isinstance(node.names, cst.ImportStar)
        alias = next(a for a in node.names if nodes.dotted(a.name) == "ImageDataGenerator")
        local = nodes.dotted(alias.asname.name) if alias.asname else "ImageDataGenerator"
        self.ctx.claimed.add(local or "ImageDataGenerator")  # the imports family drops it
        self.ported.add(local or "ImageDataGenerator")
        keras = self.ctx.keras_module(node)
        suffix = f" as {local}" if local != "ImageDataGenerator" else ""
        # The call needs Keras bound by then: a file importing keras only further down
        # (after its preprocessing import) gets its own `import keras` here.
        before = self.ctx.module.body[:self.ctx.top_level_index(node)]
        bound_before = any(re.search(rf"^\s*(import .*\bas {keras}\b|import {keras}\s*$|from "
                                     rf"\S+ import .*\b{keras}\b)", self.ctx.code(stmt), re.M)
                           for stmt in before)
        added = [
            *([f"import {keras}"] if keras == "keras" and keras in self.ctx.bindings
              and not bound_before and not self.ctx.enclosing(node, cst.FunctionDef) else []),
            "import keras_preprocessing",
            f"keras_preprocessing.set_keras_submodules(backend={keras}.backend, "
            f"utils={keras}.utils)",
            f"from keras_preprocessing.image import ImageDataGenerator{suffix}",
        ]
        self.ctx.edit(line, functools.partial(_ported_lines, added=added))
        self.warning(node, MSG_PORTED)
        return True

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
        ported = isinstance(node.func, cst.Name) and node.func.value in self.ported
        message = (MSG_CALL_LATER if ported else MSG_CALL).format(
            args=args, mapping="; ".join(mapping) or "the dataset alone (no augmentation)")
        (self.info if ported else self.error)(node, message)
        if ported:
            self.resolve_defaults(node)

    def resolve_defaults(self, node: cst.Call) -> None:
        """`data_format=None` / `dtype=None` as Keras 2.3's wrapper resolved them.

        keras/preprocessing/image.py of 2.3.1 replaced None by the backend's
        image_data_format() / floatx() before calling keras_preprocessing's class, which
        rejects None. Written also when absent if the file changes either setting.
        """
        keras = None
        changes = self.ctx.source
        for key, getter, setter in (("data_format", "image_data_format", "set_image_"),
                                    ("dtype", "floatx", "set_floatx")):
            arg = next((a for a in node.args if nodes.keyword(a) == key), None)
            explicit_none = arg is not None and isinstance(arg.value, cst.Name) and (
                arg.value.value == "None")
            if explicit_none or (arg is None and setter in changes):
                keras = keras or self.ctx.keras_module(node)
                value = nodes.expr(f"{keras}.config.{getter}()")
                self.ctx.edit(node, functools.partial(_set_kwarg, key=key, value=value))
                self.info(node, f"ImageDataGenerator({key}=None) -> {key}={keras}.config."
                          f"{getter}(): Keras 2.3's wrapper resolved None so, "
                          "keras-preprocessing's class rejects it")


def _set_kwarg(updated: cst.CSTNode, key: str, value: cst.BaseExpression) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    args = [a for a in updated.args if nodes.keyword(a) != key]
    kept = next((a for a in updated.args if nodes.keyword(a) == key), None)
    new = kept.with_changes(value=value) if kept is not None else nodes.kwarg(key, value)
    if kept is not None:
        args.insert(list(updated.args).index(kept), new)
    else:
        args.append(new)
    return nodes.with_args(updated, args)


def _ported_lines(updated: cst.CSTNode, added: List[str]) -> cst.FlattenSentinel:
    """The import line, less the names other families took, after the three new lines."""
    assert isinstance(updated, cst.SimpleStatementLine)
    new = [cst.parse_statement(code + "\n") for code in added]
    new[0] = new[0].with_changes(leading_lines=updated.leading_lines)
    if updated.body:  # other names of the module stay on their (moved) import
        new.insert(len(new) - 1, updated.with_changes(leading_lines=()))
    return cst.FlattenSentinel(new)


RULE = ImageDataRule
