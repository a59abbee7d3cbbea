"""The renames the rule families apply, typed once: Keras 1's legacy interface as Keras 2.3
converted it (keras1), the generator methods (generators), the CuDNN layers (layers) and
the backend functions tf_keras dropped (backend). Import locations live in import_tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

# keras1: Keras 2.3's keras/legacy/interfaces.py, keyword renames per layer kind.
_WEIGHTS = {"init": "kernel_initializer", "W_regularizer": "kernel_regularizer",
            "b_regularizer": "bias_regularizer", "W_constraint": "kernel_constraint",
            "b_constraint": "bias_constraint", "bias": "use_bias"}
_CONV = {"nb_filter": "filters", "subsample": "strides", "border_mode": "padding",
         "dim_ordering": "data_format", **_WEIGHTS}
_RECURRENT = {"output_dim": "units", "init": "kernel_initializer",
              "inner_init": "recurrent_initializer", "inner_activation": "recurrent_activation",
              "W_regularizer": "kernel_regularizer", "b_regularizer": "bias_regularizer",
              "U_regularizer": "recurrent_regularizer", "dropout_W": "dropout",
              "dropout_U": "recurrent_dropout", "consume_less": "implementation"}
DIM_ORDERING = {"tf": "channels_last", "th": "channels_first", "default": None}
CONSUME_LESS = {"cpu": 0, "mem": 1, "gpu": 2}


@dataclass(frozen=True)
class Spec:
    """Keras 2.3's legacy interface of one layer: keyword renames and its preprocessor."""

    renames: Dict[str, str]
    kernel: int = 0  # conv: how many kernel dimensions positionals may carry
    input_shape: bool = False  # input_dim/input_length -> input_shape
    dropped: Dict[str, Optional[str]] = field(default_factory=dict)  # kw -> allowed value


_POOL2D = {"border_mode": "padding", "dim_ordering": "data_format"}
SPECS: Dict[str, Spec] = {
    "Dense": Spec({"output_dim": "units", **_WEIGHTS}),
    "Dropout": Spec({"p": "rate"}),
    "SpatialDropout1D": Spec({"p": "rate"}),
    "SpatialDropout2D": Spec({"p": "rate", "dim_ordering": "data_format"}),
    "SpatialDropout3D": Spec({"p": "rate", "dim_ordering": "data_format"}),
    "GaussianDropout": Spec({"p": "rate"}),
    "GaussianNoise": Spec({"sigma": "stddev"}),
    "PReLU": Spec({"init": "alpha_initializer"}),
    "Embedding": Spec({"init": "embeddings_initializer", "W_regularizer": "embeddings_regularizer",
                       "W_constraint": "embeddings_constraint"}, dropped={"dropout": "*"}),
    "MaxPooling1D": Spec({"pool_length": "pool_size", "stride": "strides",
                          "border_mode": "padding"}),
    "AveragePooling1D": Spec({"pool_length": "pool_size", "stride": "strides",
                              "border_mode": "padding"}),
    **{f"{kind}Pooling{d}D": Spec(_POOL2D) for kind in ("Max", "Average") for d in (2, 3)},
    **{f"Global{kind}Pooling{d}D": Spec({"dim_ordering": "data_format"})
       for kind in ("Max", "Average") for d in (1, 2, 3)},
    "UpSampling1D": Spec({"length": "size"}),
    **{f"{name}{d}D": Spec({"dim_ordering": "data_format"})
       for name in ("UpSampling", "ZeroPadding", "Cropping") for d in (2, 3)},
    "Conv1D": Spec({"nb_filter": "filters", "filter_length": "kernel_size",
                    "subsample_length": "strides", "border_mode": "padding", **_WEIGHTS},
                   input_shape=True),
    "Conv2D": Spec(_CONV, kernel=2),
    "SeparableConv2D": Spec({k: v for k, v in _CONV.items()
                             if not k.startswith("W_") and k != "init"}, kernel=2),
    "Conv2DTranspose": Spec(_CONV, kernel=2, dropped={"output_shape": "*"}),
    "Conv3D": Spec(_CONV, kernel=3),
    "ConvLSTM2D": Spec({**_CONV, **_RECURRENT}, kernel=2),
    "LSTM": Spec(_RECURRENT, input_shape=True),
    "GRU": Spec(_RECURRENT, input_shape=True),
    "SimpleRNN": Spec(_RECURRENT, input_shape=True),
    "BatchNormalization": Spec({"beta_init": "beta_initializer",
                                "gamma_init": "gamma_initializer"}, dropped={"mode": "0"}),
}
ALIASES = {"Convolution1D": "Conv1D", "Convolution2D": "Conv2D", "Convolution3D": "Conv3D",
           "Deconvolution2D": "Conv2DTranspose", "Deconv2D": "Conv2DTranspose",
           "SeparableConvolution2D": "SeparableConv2D"}
KERNEL_KEYS = {2: ("nb_row", "nb_col"), 3: ("kernel_dim1", "kernel_dim2", "kernel_dim3")}
MERGE_MODES = {"concat": "concatenate", "sum": "add", "mul": "multiply", "ave": "average",
               "max": "maximum", "dot": "dot", "cos": "dot"}

# generators: the *_generator methods and what replaced them.
METHODS = {"fit_generator": "fit", "evaluate_generator": "evaluate",
           "predict_generator": "predict"}

# layers: the CuDNN layers and the plain layer that runs cuDNN kernels itself today.
CUDNN = {"CuDNNLSTM": "LSTM", "CuDNNGRU": "GRU"}

# tf_keras dropped these from its backend; TensorFlow has them under these names.
TF_KERAS_TO_TF = {"logsumexp": "math.reduce_logsumexp", "size": "size", "slice": "slice",
                  "identity": "identity", "is_tensor": "is_tensor",
                  "control_dependencies": "control_dependencies"}
