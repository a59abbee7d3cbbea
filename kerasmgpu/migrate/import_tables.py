"""Where each Keras 2.3 import lives on each target: the tables the imports family reads.

`MODULE_MOVES`: Keras 2.3 modules that are gone, each folded into a public one;
`NAME_MOVES` / `KERAS3_NAME_MOVES`: names that went elsewhere or were renamed, same
behaviour; `GONE` / `GONE_MODULES`: what a target does not have, with `GONE_ADVICE`;
`SIX_MOVES`: `six.moves` names and Python 3's. `locate` reads them for one name, `spell`
writes a module in the target's package.

The tables were made by importing every public name of every Keras 2.3.1 module and
looking it up in Keras 3.15 and tf_keras 2.21 (tests/test_migrate_imports.py checks each
entry against the installed Keras of its env).
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional, Tuple

from kerasmgpu.migrate.report import Target

_LAYERS = ("core", "merge", "convolutional", "pooling", "normalization", "recurrent",
           "embeddings", "advanced_activations", "noise", "wrappers", "local",
           "convolutional_recurrent", "cudnn_recurrent")
# Keras 2.3 modules that are gone; every name of theirs lives in this public module now.
MODULE_MOVES: Dict[str, str] = {
    **{f"keras.layers.{sub}": "keras.layers" for sub in _LAYERS},
    **{f"keras.utils.{sub}": "keras.utils"
       for sub in ("np_utils", "data_utils", "generic_utils", "vis_utils", "layer_utils",
                   "io_utils", "conv_utils", "losses_utils", "metrics_utils")},
    **{f"keras.callbacks.{sub}": "keras.callbacks"
       for sub in ("callbacks", "tensorboard_v1", "tensorboard_v2")},
    "keras.objectives": "keras.losses",
    "keras.engine": "keras.layers",
    "keras.engine.topology": "keras.layers",
    "keras.engine.base_layer": "keras.layers",
    "keras.engine.input_layer": "keras.layers",
    "keras.engine.training": "keras.models",
    "keras.engine.sequential": "keras.models",
    "keras.engine.saving": "keras.models",
    "keras.engine.network": "keras.models",
    "keras.engine.training_utils": "keras.utils",
    "keras.engine.training_generator": "keras.utils",
    "keras.engine.training_arrays": "keras.utils",
    "keras.applications.mobilenetv2": "keras.applications.mobilenet_v2",
    "keras.backend.tensorflow_backend": "keras.backend",
    "keras.backend.common": "keras.backend",
    "keras.legacy.layers": "keras.layers",
}
# (module after MODULE_MOVES, name) -> (module, name): a name that went elsewhere than its
# module, or was renamed. Same behaviour (Keras 2.3 defined these as aliases).
_SERIALIZING = ("keras.layers", "keras.optimizers", "keras.losses", "keras.metrics",
                "keras.initializers", "keras.regularizers", "keras.constraints",
                "keras.activations")
NAME_MOVES: Dict[Tuple[str, str], Tuple[str, str]] = {
    ("keras.layers", "Model"): ("keras.models", "Model"),
    ("keras.layers", "Sequential"): ("keras.models", "Sequential"),
    ("keras.layers", "get_source_inputs"): ("keras.utils", "get_source_inputs"),
    ("keras.layers", "Network"): ("keras.models", "Model"),
    ("keras.layers", "CuDNNLSTM"): ("keras.layers", "LSTM"),  # the layers family adds
    ("keras.layers", "CuDNNGRU"): ("keras.layers", "GRU"),  # GRU's reset_after=True
    ("keras.layers", "Container"): ("keras.models", "Model"),
    ("keras.models", "Network"): ("keras.models", "Model"),
    ("keras.models", "Input"): ("keras.layers", "Input"),
    ("keras.models", "InputLayer"): ("keras.layers", "InputLayer"),
    ("keras.models", "Layer"): ("keras.layers", "Layer"),
    ("keras.models", "get_source_inputs"): ("keras.utils", "get_source_inputs"),
    ("keras.utils", "Sequence"): ("keras.utils", "Sequence"),
    ("keras.utils", "Progbar"): ("keras.utils", "Progbar"),
    **{("keras.optimizers", low): ("keras.optimizers", up) for low, up in (
        ("sgd", "SGD"), ("rmsprop", "RMSprop"), ("adagrad", "Adagrad"),
        ("adadelta", "Adadelta"), ("adam", "Adam"), ("adamax", "Adamax"), ("nadam", "Nadam"))},
    **{("keras.initializers", low): ("keras.initializers", up) for low, up in (
        ("normal", "RandomNormal"), ("uniform", "RandomUniform"), ("one", "Ones"),
        ("zero", "Zeros"))},
    **{("keras.constraints", low): ("keras.constraints", up) for low, up in (
        ("maxnorm", "MaxNorm"), ("nonneg", "NonNeg"), ("unitnorm", "UnitNorm"))},
    # Keras 2.3 re-exported its serialization helpers from each module.
    **{(module, name): ("keras.utils", name) for module in _SERIALIZING
       for name in ("serialize_keras_object", "deserialize_keras_object")},
    ("keras.metrics", "cosine_similarity"): ("keras.losses", "cosine_similarity"),
    ("keras.metrics", "categorical_hinge"): ("keras.losses", "categorical_hinge"),
}
# Loss and metric aliases Keras 3 dropped (tf_keras keeps them).
_LOSS_ALIASES = {"mse": "mean_squared_error", "MSE": "mean_squared_error",
                 "mae": "mean_absolute_error", "MAE": "mean_absolute_error",
                 "mape": "mean_absolute_percentage_error",
                 "MAPE": "mean_absolute_percentage_error",
                 "msle": "mean_squared_logarithmic_error",
                 "MSLE": "mean_squared_logarithmic_error",
                 "kld": "kl_divergence", "KLD": "kl_divergence",
                 "kullback_leibler_divergence": "kl_divergence", "logcosh": "log_cosh"}
KERAS3_NAME_MOVES: Dict[Tuple[str, str], Tuple[str, str]] = {
    **{("keras.losses", old): ("keras.losses", new) for old, new in _LOSS_ALIASES.items()},
    **{("keras.metrics", old): ("keras.metrics", new) for old, new in _LOSS_ALIASES.items()},
}
# Names other families rewrite (they also drop or rewrite the import).
OWNED_ELSEWHERE = frozenset({"multi_gpu_model", "ImageDataGenerator", "merge", "Merge",
                             "set_session", "get_session"})

_ENGINE_PRIVATE = "a training internal of Keras 2.3 with no public successor: "
GONE_ADVICE: Dict[str, str] = {
    "model_from_config": "model_from_config(config) is keras.layers.deserialize(config) (what "
    "Keras 2.3's did)",
    "convert_all_kernels_in_model": "delete the call: it flipped kernels between Theano's "
    "and TensorFlow's convolution, and only TensorFlow's exists now",
    "LocallyConnected1D": "Keras 3 dropped it: tf_keras still has it, or write it as a "
    "Conv1D per position",
    "LocallyConnected2D": "Keras 3 dropped it: tf_keras still has it",
    "ThresholdedReLU": "keras.layers.ReLU(threshold=theta) is the same except at x == theta "
    "(ReLU keeps theta, ThresholdedReLU gave 0)",
    "HDF5Matrix": "read the HDF5 file with h5py and feed a keras.utils.PyDataset or tf.data",
    "KerasClassifier": "keras.wrappers.scikit_learn is gone: use the scikeras package "
    "(scikeras.wrappers.KerasClassifier)",
    "KerasRegressor": "keras.wrappers.scikit_learn is gone: use the scikeras package "
    "(scikeras.wrappers.KerasRegressor)",
    "Tokenizer": "use keras.layers.TextVectorization (Keras 3 dropped keras.preprocessing.text); "
    "Keras 2.3's Tokenizer was keras_preprocessing.text.Tokenizer (pip install "
    "keras-preprocessing), the same class",
    "text_to_word_sequence": "use keras.layers.TextVectorization or str.split",
    "print_summary": "call model.summary()",
    "model_from_yaml": "YAML model configs are gone: save the model with model.save() "
    "(.keras) or its config with model.to_json()",
    "GeneratorEnqueuer": "Keras 3 reads generators itself: pass the generator to fit()",
    "OrderedEnqueuer": "subclass keras.utils.PyDataset with workers=... instead",
    "TimeseriesGenerator": "use keras.utils.timeseries_dataset_from_array",
    "DirectoryIterator": "ImageDataGenerator's iterators are gone: see the image_data advice",
    "NumpyArrayIterator": "ImageDataGenerator's iterators are gone: see the image_data advice",
    "DataFrameIterator": "use keras.utils.image_dataset_from_directory or tf.data",
    "Highway": "a Keras 1 layer, gone since Keras 2.0: write it as a custom layer",
    "MaxoutDense": "a Keras 1 layer, gone since Keras 2.0: write it as a custom layer",
    "Node": "a graph internal of Keras 2.3 with no public successor",
    "cosine_proximity": "keras.losses.cosine_similarity (the same negative similarity)",
    "TFOptimizer": "use a keras.optimizers optimizer",
    "clip_norm": "pass clipnorm= to the optimizer",
    "normalize_tuple": "an internal of Keras 2.3: write the tuple yourself",
    "conv_output_length": "an internal of Keras 2.3: compute it yourself",
    "convert_dense_weights_data_format": "it converted Theano-era Dense weights after a "
    "Flatten between data formats: drop it (modern Keras loads weights as saved)",
}


# Helpers Keras 2.3 modules exposed that neither target has (tests/test_migrate_imports.py
# checks Keras 2.3.1's public names, tests/data/keras23_public_names.json, against each
# target: every name is either found where `locate` says or listed as gone).
_INTERNALS = frozenset(
    [("keras.models", n) for n in ("has_arg", "to_list")]
    + [("keras.losses", "is_categorical_crossentropy")]
    + [("keras.metrics", n) for n in ("Layer", "Reduce", "SensitivitySpecificityBase")]
    + [("keras.activations", "Layer"), ("keras.applications", "keras_modules_injection")]
    + [("keras.utils", n) for n in (
        "check_for_unexpected_keys", "func_dump", "func_load", "getargspec", "has_arg",
        "is_all_none", "object_list_uid", "slice_arrays", "to_list", "transpose_shape",
        "unpack_singleton", "convert_dense_weights_data_format", "get_index", "init_pool",
        "init_pool_generator", "next_sample", "validate_file", "Model", "Wrapper",
        "add_edge", "is_model", "is_wrapped_model")]
    + [("keras.layers", n) for n in ("func_dump", "func_load", "has_arg", "transpose_shape",
                                      "disable_tracking", "to_list", "object_list_uid")]
)


def _keras3_gone() -> FrozenSet[Tuple[str, str]]:
    layers = ("AtrousConvolution1D", "AtrousConvolution2D", "AtrousConv1D", "AtrousConv2D",
              "ConvLSTM2DCell", "ConvRecurrent2D", "ConvRNN2D", "Deconvolution2D",
              "Deconvolution3D", "Deconv2D", "Deconv3D", "Highway", "LocallyConnected1D",
              "LocallyConnected2D", "MaxoutDense", "Recurrent", "ThresholdedReLU", "Node")
    utils = ("GeneratorEnqueuer", "H5Dict", "HDF5Matrix", "OrderedEnqueuer",
             "SequenceEnqueuer", "convert_all_kernels_in_model", "print_summary", "count_params",
             "conv_input_length", "conv_output_length", "convert_kernel", "deconv_length",
             "normalize_padding", "normalize_tuple", "Reduction")
    return _INTERNALS | frozenset(
        [("keras.layers", n) for n in layers] + [("keras.utils", n) for n in utils]
        + [("keras.models", n) for n in ("model_from_config", "model_from_yaml", "Node")]
        + [("keras.losses", n) for n in ("cosine", "cosine_proximity", "huber_loss",
                                          "LossFunctionWrapper")]
        + [("keras.metrics", n) for n in ("cosine", "cosine_proximity", "accuracy",
                                           "clone_metric", "clone_metrics")]
        + [("keras.optimizers", n) for n in ("TFOptimizer", "clip_norm")]
        + [("keras.preprocessing.sequence", n) for n in ("TimeseriesGenerator",
                                                          "make_sampling_table", "skipgrams")]
        + [("keras.preprocessing.text", n) for n in ("Tokenizer", "hashing_trick", "one_hot",
                                                      "text_to_word_sequence",
                                                      "tokenizer_from_json")]
        + [("keras.wrappers.scikit_learn", n) for n in ("KerasClassifier", "KerasRegressor",
                                                         "BaseWrapper")]
        + [("keras.callbacks", "BaseLogger")]
        + [("keras.preprocessing.image", n) for n in (
            "DataFrameIterator", "DirectoryIterator", "Iterator", "NumpyArrayIterator",
            "apply_affine_transform", "apply_brightness_shift", "apply_channel_shift",
            "random_brightness", "random_channel_shift", "random_rotation", "random_shear",
            "random_shift", "random_zoom")]
    )


def _tf_keras_gone() -> FrozenSet[Tuple[str, str]]:
    layers = ("AtrousConvolution1D", "AtrousConvolution2D", "AtrousConv1D", "AtrousConv2D",
              "ConvLSTM2DCell", "ConvRecurrent2D", "ConvRNN2D", "Deconvolution2D",
              "Deconvolution3D", "Deconv2D", "Deconv3D", "Highway", "MaxoutDense", "Recurrent",
              "Node")
    utils = ("H5Dict", "HDF5Matrix", "convert_all_kernels_in_model", "print_summary",
             "conv_input_length", "conv_output_length", "convert_kernel", "deconv_length",
             "normalize_padding", "normalize_tuple")
    return _INTERNALS | frozenset(
        [("keras.layers", n) for n in layers] + [("keras.utils", n) for n in utils]
        + [("keras.models", "Node")] + [("keras.utils", "count_params")]
        + [("keras.losses", n) for n in ("cosine", "cosine_proximity", "huber_loss",
                                          "LossFunctionWrapper")]
        + [("keras.metrics", n) for n in ("cosine", "cosine_proximity", "accuracy",
                                           "clone_metric", "clone_metrics")]
        + [("keras.optimizers", n) for n in ("TFOptimizer", "clip_norm")]
        + [("keras.wrappers.scikit_learn", n) for n in ("KerasClassifier", "KerasRegressor",
                                                         "BaseWrapper")]
        + [("keras.preprocessing.image", "DataFrameIterator")]
    )


GONE: Dict[Target, FrozenSet[Tuple[str, str]]] = {
    Target.KERAS3: _keras3_gone(), Target.TF_KERAS: _tf_keras_gone()}
# Modules gone on a target as a whole (nothing in them is reachable there).
GONE_MODULES: Dict[Target, FrozenSet[str]] = {
    Target.KERAS3: frozenset({"keras.wrappers", "keras.wrappers.scikit_learn",
                              "keras.preprocessing.text"}),
    Target.TF_KERAS: frozenset({"keras.wrappers", "keras.wrappers.scikit_learn"}),
}

# six.moves names and what Python 3 calls them (None: a builtin, nothing to import).
SIX_MOVES: Dict[str, Optional[str]] = {
    "range": None, "zip": None, "map": None, "filter": None, "input": None,
    "reduce": "from functools import reduce", "cPickle": "import pickle as cPickle",
    "xrange": "xrange = range", "urllib": "import urllib", "queue": "import queue",
    "configparser": "import configparser",
}


def package(target: Target) -> str:
    return "tf_keras" if target is Target.TF_KERAS else "keras"


def spell(canonical: str, target: Target) -> str:
    """`keras.layers` in the target's package: `tf_keras.layers` on tf_keras."""
    return package(target) + canonical[len("keras"):]


def locate(module: str, name: str, target: Target) -> Optional[Tuple[str, str]]:
    """Where `module.name` of Keras 2.3 (canonical spelling) is on `target`; None: gone."""
    moved = MODULE_MOVES.get(module, module)
    if moved in GONE_MODULES[target] or module in GONE_MODULES[target]:
        return None
    for key in ((module, name), (moved, name)):
        if target is Target.KERAS3 and key in KERAS3_NAME_MOVES:
            return KERAS3_NAME_MOVES[key]
        if key in NAME_MOVES:
            return NAME_MOVES[key]
    if (moved, name) in GONE[target]:
        return None
    return moved, name
