"""`kerasmgpu migrate`, the imports family: moved modules, renamed names, the package.

The source tests need libcst only; the table tests check every entry of the tables
against the Keras installed in this env (Keras 3, tf_keras or Keras 2.3.1).
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers import LINE, requires
from migrate_cases import assert_idempotent, findings, migrate, severities, src

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity, Target
from kerasmgpu.migrate.import_tables import (
    GONE,
    KERAS3_NAME_MOVES,
    MODULE_MOVES,
    NAME_MOVES,
    locate,
    spell,
)


@pytest.mark.text
@pytest.mark.parametrize(
    ("line", "keras3", "tf_keras"),
    [
        ("from keras.layers.core import Dense, Lambda",
         "from keras.layers import Dense, Lambda", "from tf_keras.layers import Dense, Lambda"),
        ("from keras.layers.merge import concatenate",
         "from keras.layers import concatenate", "from tf_keras.layers import concatenate"),
        ("from keras.utils.np_utils import to_categorical",
         "from keras.utils import to_categorical", "from tf_keras.utils import to_categorical"),
        ("from keras.utils.data_utils import get_file, Sequence",
         "from keras.utils import get_file, Sequence",
         "from tf_keras.utils import get_file, Sequence"),
        ("from keras.applications.mobilenetv2 import MobileNetV2",
         "from keras.applications.mobilenet_v2 import MobileNetV2",
         "from tf_keras.applications.mobilenet_v2 import MobileNetV2"),
        ("from keras.engine.training import Model", "from keras.models import Model",
         "from tf_keras.models import Model"),
        ("from keras.objectives import categorical_crossentropy",
         "from keras.losses import categorical_crossentropy",
         "from tf_keras.losses import categorical_crossentropy"),
        ("from tensorflow.keras.layers import Conv2D", "from keras.layers import Conv2D",
         "from tf_keras.layers import Conv2D"),
        ("from tensorflow.python.keras.layers import Dense", "from keras.layers import Dense",
         "from tf_keras.layers import Dense"),
        ("import keras", "import keras", "import tf_keras as keras"),
        ("import keras.backend as K", "import keras.backend as K",
         "import tf_keras.backend as K"),
        ("import keras.engine as KE", "import keras.layers as KE", "import tf_keras.layers as KE"),
        ("from tensorflow import keras", "import keras", "import tf_keras as keras"),
        ("from keras import backend as K", "from keras import backend as K",
         "from tf_keras import backend as K"),
    ],
)
def test_import_lines(line: str, keras3: str, tf_keras: str) -> None:
    assert migrate(f"{line}\n") == f"{keras3}\n"
    assert migrate(f"{line}\n", "tf_keras") == f"{tf_keras}\n"
    assert migrate(f"{line}\n", "keras23") == f"{line}\n"


@pytest.mark.text
def test_an_import_of_two_moved_modules_is_split_one_line_each() -> None:
    text = "from keras.engine.topology import Input, Network, get_source_inputs\n"
    assert migrate(text) == (
        "from keras.layers import Input\nfrom keras.models import Model\n"
        "from keras.utils import get_source_inputs\n"
    )


@pytest.mark.text
def test_renamed_names_are_renamed_where_the_file_uses_them() -> None:
    text = """
        from keras.engine.topology import Network
        from keras.optimizers import adam
        from keras.initializers import normal
        d = Network(inputs, outputs, name="d")
        opt = adam(0.001)
        init = normal(stddev=0.02)
    """
    after = migrate(text)
    assert "d = Model(inputs, outputs, name=\"d\")" in after
    assert "opt = Adam(0.001)" in after
    assert "init = RandomNormal(stddev=0.02)" in after
    assert_idempotent(text)


@pytest.mark.text
def test_loss_aliases_keras3_dropped() -> None:
    text = "from keras.losses import mse, binary_crossentropy\nl = mse(a, b)\n"
    assert migrate(text) == (
        "from keras.losses import mean_squared_error, binary_crossentropy\n"
        "l = mean_squared_error(a, b)\n"
    )
    assert migrate(text, "tf_keras").startswith("from tf_keras.losses import mse,")


@pytest.mark.text
def test_module_chains_in_code() -> None:
    text = """
        import keras
        import tensorflow as tf
        x = keras.layers.core.Dense(3)
        y = keras.utils.np_utils.to_categorical(labels)
        z = tf.keras.layers.Conv2D(3, 3)
    """
    after = migrate(text)
    assert "x = keras.layers.Dense(3)" in after
    assert "y = keras.utils.to_categorical(labels)" in after
    assert "z = keras.layers.Conv2D(3, 3)" in after
    after_tf = migrate(text, "tf_keras")
    assert "import tf_keras as keras\n" in after_tf
    assert "z = keras.layers.Conv2D(3, 3)" in after_tf


@pytest.mark.text
@pytest.mark.parametrize(
    ("line", "target"),
    [("from keras.layers import LocallyConnected2D", "keras3"),
     ("from keras.wrappers.scikit_learn import KerasClassifier", "keras3"),
     ("from keras.wrappers.scikit_learn import KerasClassifier", "tf_keras"),
     ("from keras.utils import HDF5Matrix", "tf_keras"),
     ("from keras.preprocessing.text import Tokenizer, Kerasless", "keras3")],  # not ported
)
def test_names_the_target_does_not_have_are_errors(line: str, target: str) -> None:
    # The file uses what it imports (an unused import of a gone name is dropped, INFO).
    used = f"{line}\nused = [{line.split(' import ')[1]}]\n"
    errors = [f for f in findings(used, target) if f.severity is Severity.ERROR]
    assert errors and all("does not exist in" in error.message for error in errors)


@pytest.mark.text
def test_six_moves_become_python3_names() -> None:
    text = "from six.moves import range\nfrom six.moves import cPickle, reduce\nx = 1\n"
    assert migrate(text) == "import pickle as cPickle\nfrom functools import reduce\nx = 1\n"


@pytest.mark.text
def test_package_explicit_on_tf_keras_and_the_report_says_why() -> None:
    [info] = [f for f in findings("import keras\n", "tf_keras")]
    assert "no TF_USE_LEGACY_KERAS needed: `import keras` would be Keras 3" in info.message


@pytest.mark.text
def test_star_import_of_a_moved_module() -> None:
    assert migrate("from keras.layers.core import *\n") == "from keras.layers import *\n"


# --------------------------------------------------------------------------------------
# The tables, checked against the installed Keras

def _module(name: str) -> Optional[Any]:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


MODERN = {KerasLine.KERAS_3: Target.KERAS3, KerasLine.TF_KERAS_LEGACY: Target.TF_KERAS}


@requires(lines=list(MODERN))
@pytest.mark.core
def test_every_destination_exists_in_this_keras() -> None:
    target = MODERN[LINE]
    missing = [new for new in set(MODULE_MOVES.values()) if _module(spell(new, target)) is None]
    moves = dict(NAME_MOVES)
    if target is Target.KERAS3:
        moves.update(KERAS3_NAME_MOVES)
    for module, name in moves.values():
        found = _module(spell(module, target))
        if found is None or not hasattr(found, name):
            missing.append(f"{module}.{name}")
    assert not missing, missing


@requires(lines=list(MODERN))
@pytest.mark.core
def test_every_gone_name_is_gone_in_this_keras() -> None:
    target = MODERN[LINE]
    present = []
    for module, name in GONE[target]:
        found = _module(spell(module, target))
        if found is not None and hasattr(found, name):
            present.append(f"{module}.{name}")
    assert not present, present


# Modules of Keras 2.0-2.2 that Keras 2.3.1 no longer has (kept: projects still import them).
BEFORE_KERAS23 = {"keras.applications.mobilenetv2"}


@requires(legacy=True)
@pytest.mark.core
def test_every_moved_module_existed_in_keras23() -> None:
    missing = [old for old in MODULE_MOVES
               if old not in BEFORE_KERAS23 and _module(old) is None]
    assert not missing, missing


@pytest.mark.text
def test_keras23_target_leaves_imports() -> None:
    text = src("from keras.layers.core import Dense\nimport keras\n")
    assert migrate(text, "keras23") == text
    assert severities(text, "->", "keras23") == []


@pytest.mark.text
def test_a_moved_module_imported_by_name_keeps_its_local_name() -> None:
    text = "from keras.utils import np_utils\ny = np_utils.to_categorical(y, 10)\n"
    assert migrate(text) == "from keras import utils as np_utils\ny = np_utils.to_categorical(y, 10)\n"
    text = "from keras.layers import recurrent, Dense\nRNN = recurrent.LSTM\n"
    assert migrate(text, "tf_keras") == (
        "from tf_keras import layers as recurrent\nfrom tf_keras.layers import Dense\n"
        "RNN = recurrent.LSTM\n")


# Names other families own (they rewrite or report them before the imports family would).
OWNED_BY_FAMILIES = frozenset({("keras.utils", "multi_gpu_model"),
                               ("keras.preprocessing.image", "ImageDataGenerator")})


@requires(lines=[KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
def test_the_tables_match_the_target_api_for_every_keras23_public_name() -> None:
    """Each public name of Keras 2.3.1's modules (tests/data/keras23_public_names.json,
    read from keras 2.3.1 on the keras23 env) is either found on this env's Keras where
    `locate` sends it, or in the table of names the target lacks (an ERROR with the fix)."""
    target = Target.KERAS3 if LINE is KerasLine.KERAS_3 else Target.TF_KERAS
    data = json.loads((Path(__file__).parent / "data" / "keras23_public_names.json")
                      .read_text())
    missing = []
    for module, names in data.items():
        for name in names:
            where = locate(module, name, target)
            if where is None or (module, name) in OWNED_BY_FAMILIES:
                continue
            found = importlib.import_module(spell(where[0], target))
            if not hasattr(found, where[1]):
                missing.append(f"{module}.{name} -> {spell(where[0], target)}.{where[1]}")
    assert sum(len(names) for names in data.values()) > 600
    assert not missing, missing


@pytest.mark.text
def test_an_unused_import_of_a_gone_name_goes() -> None:
    text = ("from keras.wrappers.scikit_learn import KerasClassifier\n"
            "from keras.utils.layer_utils import convert_dense_weights_data_format, get_file\n"
            "path = get_file('x', 'url')\n")
    assert migrate(text) == "from keras.utils import get_file\npath = get_file('x', 'url')\n"
    assert severities(text, "never uses it") == [Severity.INFO] * 2
    used = text + "clf = KerasClassifier(build)\n"
    assert severities(used, "keras.wrappers.scikit_learn") == [Severity.ERROR]
