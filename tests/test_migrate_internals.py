"""`kerasmgpu migrate`, the internals family: Keras 2.3 internals rewritten.

The `_obtain_input_shape` definition migrate writes is checked against Keras 2.3.1's own
function on every case of a grid (where keras-applications is installed: the keras23
env); the `_Merge` layer runs as Keras 2.3 code on keras23 and migrated elsewhere.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import pytest
from helpers import requires
from migrate_cases import assert_idempotent, findings, migrate, run_keras23, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity
from kerasmgpu.migrate.internals import OBTAIN_INPUT_SHAPE

DENSENET = """
    import warnings

    from keras.models import Model
    from keras.utils.layer_utils import convert_all_kernels_in_model
    from keras.applications.imagenet_utils import _obtain_input_shape
    from keras import backend as K


    def DenseNet(input_shape=None, include_top=True, weights=None):
        input_shape = _obtain_input_shape(input_shape, default_size=32, min_size=8,
                                          data_format=K.image_data_format(),
                                          require_flatten=include_top)
        if K.backend() == 'theano':
            convert_all_kernels_in_model(model)
    """


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_obtain_input_shape_becomes_a_local_definition(target: str) -> None:
    out = assert_idempotent(DENSENET, target)
    assert "_obtain_input_shape\n" not in out and "import _obtain_input_shape" not in out
    assert "def _obtain_input_shape(input_shape, default_size, min_size, data_format," in out
    assert "convert_all_kernels_in_model\n" not in out.split("def ")[0]  # import gone
    assert "        convert_all_kernels_in_model(model)" in out  # dead branch kept
    assert not [f for f in findings(DENSENET, target) if f.severity is not Severity.INFO]
    compile(out, "densenet.py", "exec")
    assert migrate(DENSENET, "keras23") == migrate(DENSENET, "keras23")  # left as written


@pytest.mark.text
def test_a_live_theano_conversion_stays_an_error() -> None:
    text = ("from keras.utils.layer_utils import convert_all_kernels_in_model\n"
            "convert_all_kernels_in_model(model)\n")
    assert severities(text, "Theano") == [Severity.ERROR]


CASES = list(itertools.product(
    [None, (32, 32, 3), (3, 32, 32), (4, 4, 3), (None, None, 3), (32, 32, 1), (32, 32)],
    ["channels_last", "channels_first"], [True, False], [None, "imagenet"]))


def _outcome(function: Any, shape: Optional[Tuple[Any, ...]], data_format: str,
             flatten: bool, weights: Optional[str]) -> Tuple[str, Any, List[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result: Tuple[str, Any] = ("ok", function(
                shape, default_size=32, min_size=8, data_format=data_format,
                require_flatten=flatten, weights=weights))
        except ValueError as exc:
            result = ("ValueError", str(exc))
    return (*result, [str(w.message) for w in caught])


@requires(lines=[KerasLine.LEGACY])
def test_the_definition_computes_what_keras23s_function_computed() -> None:
    imagenet_utils = pytest.importorskip("keras_applications.imagenet_utils")
    namespace: Dict[str, Any] = {}
    exec(OBTAIN_INPUT_SHAPE, namespace)
    for case in CASES:
        assert _outcome(namespace["_obtain_input_shape"], *case) == _outcome(
            imagenet_utils._obtain_input_shape, *case), case


MERGE = '''
import numpy as np
from keras.layers import Input
from keras.layers.merge import _Merge
from keras.models import Model


class WeightedAverage(_Merge):
    """A fixed-weight average of two inputs (WGAN-GP's RandomWeightedAverage, unrandomized)."""
    def _merge_function(self, inputs):
        return (0.25 * inputs[0]) + ((1 - 0.25) * inputs[1])


a, b = Input((3,)), Input((3,))
model = Model([a, b], WeightedAverage()([a, b]))
x = np.arange(6, dtype="float32").reshape(2, 3)
result = model.predict([x, 2 * x]).tolist()
'''


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_a_merge_subclass_computes_what_it_computed() -> None:
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(run_keras23(MERGE, "merge.py")["result"], 1.75 * x, rtol=1e-6)


# WGAN-GP's RandomWeightedAverage draws for a fixed batch (32, 1, 1, 1): Keras 3 traced call
# on the unknown batch without Keras 2.3's compute_output_shape, and failed.
FIXED_BATCH = MERGE.replace("WeightedAverage", "FixedBatchAverage").replace(
    "return (0.25 * inputs[0])",
    "alpha = K.ones_like(inputs[0][:2, :1]) * 0.25\n        return (alpha * inputs[0])").replace(
    "((1 - 0.25) * inputs[1])", "((1 - alpha) * inputs[1])").replace(
    "import numpy as np\n", "import numpy as np\nfrom keras import backend as K\n").replace(
    "result = model.predict([x, 2 * x])", "shape = model.output_shape\n"
    "result = model.predict([x, 2 * x], batch_size=2)")


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_a_fixed_batch_merge_subclass_keeps_keras23s_output_shape() -> None:
    x = np.arange(6, dtype="float32").reshape(2, 3)
    ran = run_keras23(FIXED_BATCH, "fixed_batch.py")
    np.testing.assert_allclose(ran["result"], 1.75 * x, rtol=1e-6)
    assert tuple(ran["shape"]) == (None, 3)


@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_a_merge_subclass_becomes_a_layer(target: str) -> None:
    out = assert_idempotent(MERGE, target)
    keras = "keras" if target == "keras3" else "tf_keras"
    assert f"class WeightedAverage({keras}.layers.Layer):" in out and "_Merge" not in out
    assert "    def call(self, inputs):" in out
    [warning] = [f for f in findings(MERGE, target) if f.severity is not Severity.INFO]
    assert (warning.line, warning.severity) == (7, Severity.WARNING)
    kept = MERGE.replace("_merge_function", "combine")
    assert severities(kept, "defines no _merge_function", target) == [Severity.ERROR]
    assert "from keras.layers.merge import _Merge" in migrate(kept, target) or \
        "import _Merge" in migrate(kept, target)


@pytest.mark.text
def test_legacy_interfaces_and_their_decorators_go() -> None:
    text = """
        from keras.legacy import interfaces
        from keras.optimizers import Optimizer


        class AdamW(Optimizer):
            # the Keras 1 arguments
            @interfaces.legacy_get_updates_support
            def get_updates(self, loss, params):
                return []
        """
    out = assert_idempotent(text)
    assert "interfaces" not in out
    assert "    # the Keras 1 arguments\n    def get_updates(self, loss, params):" in out
