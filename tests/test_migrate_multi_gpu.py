"""`kerasmgpu migrate`, the multi-GPU family: multi_gpu_model and make_parallel.

`--to keras23` moves them to the drop-ins of `kerasmgpu.legacy` (the project stays on Keras
2.3.1); `--to keras3` / `--to tf_keras` to `kerasmgpu.parallelize`. Both report what needs a
human (CPU template scopes, batch arithmetic, vendored copies, removed modules).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest
from helpers import ON_LEGACY
from migrate_cases import src

from kerasmgpu.migrate import Finding, MigrationError, Severity
from kerasmgpu.migrate import migrate_source as _migrate_source
from kerasmgpu.migrate.report import MigrationResult

# Notes of what was rewritten; the rest of the findings is the advice of the old command.
REWRITE_NOTES = (" -> kerasmgpu", "now comes from kerasmgpu.legacy",
                 "import kerasmgpu.keras23 added")


def migrate_source(source: str, filename: str = "<string>",
                   target: str = "keras23") -> MigrationResult:
    return _migrate_source(source, filename, target)


def advice(result: MigrationResult) -> List[Finding]:
    return [f for f in result.findings
            if not any(n in f.message for n in REWRITE_NOTES) and not (
                f.message.startswith("import of ") and " removed" in f.message)]


def migrate(text: str, target: str = "keras23") -> str:
    return migrate_source(src(text), "f.py", target).new_source


def advice_of(text: str, target: str = "keras23") -> List[Tuple[int, str]]:
    return [(a.line, a.message) for a in advice(migrate_source(src(text), "f.py", target))]


def lines_advised(text: str, needle: str, target: str = "keras23") -> List[int]:
    return [line for line, message in advice_of(text, target) if needle in message]


# --------------------------------------------------------------------------------------
# Imports of multi_gpu_model


@pytest.mark.text
@pytest.mark.parametrize(
    "module",
    [
        "keras.utils",
        "keras.utils.multi_gpu_utils",
        "keras.utils.training_utils",
        "tensorflow.keras.utils",
        "tensorflow.python.keras.utils",
        "tensorflow.python.keras.utils.multi_gpu_utils",
        "tensorflow.compat.v1.keras.utils",
        "tensorflow.compat.v2.keras.utils",
        "tensorflow._api.v1.keras.utils",
        "tensorflow._api.v2.keras.utils",
        "tensorflow._api.v2.compat.v1.keras.utils",
        "tensorflow_core.python.keras.utils.multi_gpu_utils",  # TF 1.15-2.1, IDE auto-import
    ],
)
def test_each_import_form_is_rewritten(module: str) -> None:
    before = f"from {module} import multi_gpu_model\n\npmodel = multi_gpu_model(model, gpus=2)\n"
    result = migrate_source(before)
    assert result.changed
    assert result.new_source == (
        "from kerasmgpu.legacy import multi_gpu_model\n\npmodel = multi_gpu_model(model, gpus=2)\n"
    )


@pytest.mark.text
def test_multi_name_import_is_split_and_keeps_its_comment() -> None:
    before = """
        from keras.utils import to_categorical, multi_gpu_model  # both from keras
        import numpy as np
    """
    assert migrate(before) == src(
        """
        from keras.utils import to_categorical  # both from keras
        from kerasmgpu.legacy import multi_gpu_model
        import numpy as np
        """
    )


@pytest.mark.text
def test_multi_name_import_split_when_multi_gpu_model_is_first_or_middle() -> None:
    assert migrate("from keras.utils import multi_gpu_model, to_categorical\n") == (
        "from keras.utils import to_categorical\nfrom kerasmgpu.legacy import multi_gpu_model\n"
    )
    assert migrate("from keras.utils import a, multi_gpu_model, b\n") == (
        "from keras.utils import a, b\nfrom kerasmgpu.legacy import multi_gpu_model\n"
    )


@pytest.mark.text
def test_parenthesized_multi_name_import_keeps_its_layout() -> None:
    before = """
        from keras.utils import (
            plot_model,
            to_categorical,
            multi_gpu_model,
        )
    """
    assert migrate(before) == src(
        """
        from keras.utils import (
            plot_model,
            to_categorical,
        )
        from kerasmgpu.legacy import multi_gpu_model
        """
    )


@pytest.mark.text
def test_alias_is_kept_both_alone_and_when_split() -> None:
    assert migrate("from keras.utils import multi_gpu_model as mgm\n") == (
        "from kerasmgpu.legacy import multi_gpu_model as mgm\n"
    )
    assert migrate("from keras.utils import to_categorical, multi_gpu_model as mgm\n") == (
        "from keras.utils import to_categorical\n"
        "from kerasmgpu.legacy import multi_gpu_model as mgm\n"
    )


@pytest.mark.text
def test_import_fallback_in_try_block_is_rewritten_with_its_indentation() -> None:
    before = """
        try:
            from keras.utils import np_utils, multi_gpu_model
        except ImportError:  # tf.keras only
            from tensorflow.keras.utils import multi_gpu_model
    """
    assert migrate(before) == src(
        """
        try:
            from keras.utils import np_utils
            from kerasmgpu.legacy import multi_gpu_model
        except ImportError:  # tf.keras only
            from kerasmgpu.legacy import multi_gpu_model
        """
    )


@pytest.mark.text
def test_one_line_suite_gets_the_new_import_after_a_semicolon() -> None:
    before = "if USE_KERAS: from keras.utils import to_categorical, multi_gpu_model\n"
    assert migrate(before) == (
        "if USE_KERAS: from keras.utils import to_categorical; "
        "from kerasmgpu.legacy import multi_gpu_model\n"
    )


@pytest.mark.text
@pytest.mark.parametrize(
    "line",
    [
        "from mypkg.utils import multi_gpu_model\n",  # someone's own helper
        "from .utils import multi_gpu_model\n",
        "from keras.utils import to_categorical\n",
        "from kerasmgpu.legacy import multi_gpu_model\n",
    ],
)
def test_other_imports_are_left_alone(line: str) -> None:
    result = migrate_source(line)
    assert not result.changed
    assert result.new_source == line


@pytest.mark.text
@pytest.mark.parametrize(
    "line",
    [
        "from utils.multi_gpu_model import multi_gpu_model",
        "from mypkg.multi_gpu_utils import multi_gpu_model as mgm",
        "from .utils import multi_gpu_model",
    ],
)
def test_import_of_a_vendored_multi_gpu_model_is_advised_not_rewritten(line: str) -> None:
    text = f"import os\n{line}\n"
    result = migrate_source(text, "f.py")
    assert not result.changed
    [found] = advice(result)
    assert found.line == 2
    module = line.split()[1]
    assert found.message.startswith(f"multi_gpu_model imported from {module}, ")
    assert "vendored copy of Keras's multi_gpu_model" in found.message
    assert "`from kerasmgpu.legacy import multi_gpu_model`" in found.message


# --------------------------------------------------------------------------------------
# multi_gpu_model reached through a module


@pytest.mark.text
@pytest.mark.parametrize(
    ("imports", "call"),
    [
        ("import tensorflow as tf", "tf.keras.utils.multi_gpu_model(model, gpus=2)"),
        ("import tensorflow", "tensorflow.keras.utils.multi_gpu_model(model, gpus=2)"),
        ("import tensorflow as tf", "tf.compat.v2.keras.utils.multi_gpu_model(model, gpus=2)"),
        ("import tensorflow as tf", "tf.compat.v1.keras.utils.multi_gpu_model(model, gpus=2)"),
        ("from tensorflow.compat import v1", "v1.keras.utils.multi_gpu_model(model, gpus=2)"),
        ("import keras", "keras.utils.multi_gpu_model(model, gpus=2)"),
        ("from tensorflow import keras", "keras.utils.multi_gpu_model(model, gpus=2)"),
        ("import keras", "keras.utils.multi_gpu_utils.multi_gpu_model(model, gpus=2)"),
        ("import keras", "keras.utils.training_utils.multi_gpu_model(model, gpus=2)"),
        ("import keras.utils", "keras.utils.multi_gpu_model(model, gpus=2)"),
        ("from keras import utils", "utils.multi_gpu_model(model, gpus=2)"),
        ("import keras as K", "K.utils.multi_gpu_model(model, gpus=2)"),
    ],
)
def test_attribute_calls_are_rewritten_and_import_added(imports: str, call: str) -> None:
    before = f"import os\n{imports}\n\n# two GPUs\npmodel = {call}\n"
    assert migrate_source(before).new_source == (
        f"import os\n{imports}\nimport kerasmgpu.legacy\n\n# two GPUs\n"
        "pmodel = kerasmgpu.legacy.multi_gpu_model(model, gpus=2)\n"
    )


@pytest.mark.text
def test_import_added_once_for_many_calls_and_not_when_present() -> None:
    before = """
        import keras
        import tensorflow as tf
        a = keras.utils.multi_gpu_model(m, 2)
        b = tf.keras.utils.multi_gpu_model(m, 2)
    """
    after = migrate(before)
    assert after.count("import kerasmgpu.legacy\n") == 1
    assert after.count("kerasmgpu.legacy.multi_gpu_model(m, 2)") == 2

    present = """
        import keras
        import kerasmgpu.legacy
        a = keras.utils.multi_gpu_model(m, 2)
    """
    assert migrate(present).count("import kerasmgpu.legacy\n") == 1


@pytest.mark.text
def test_import_lands_after_the_imports_that_precede_first_use() -> None:
    # CUDA_VISIBLE_DEVICES must be set before the framework starts: the new import goes
    # with the keras import below it, never above the environment line.
    before = '''
        """Train."""
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
        import keras

        def build():
            return keras.utils.multi_gpu_model(make(), 2)

        import matplotlib  # late import, after the first use
    '''
    assert migrate(before) == src(
        '''
        """Train."""
        import os
        os.environ["CUDA_VISIBLE_DEVICES"] = "0,1"
        import keras
        import kerasmgpu.legacy

        def build():
            return keras.utils.multi_gpu_model(make(), 2)

        import matplotlib  # late import, after the first use
        '''
    ).replace("keras.utils.multi_gpu_model", "kerasmgpu.legacy.multi_gpu_model")


@pytest.mark.text
def test_import_after_docstring_when_keras_is_imported_locally() -> None:
    before = '''
        """Only local imports."""

        def build(m):
            import keras
            return keras.utils.multi_gpu_model(m, 2)
    '''
    assert migrate(before) == src(
        '''
        """Only local imports."""
        import kerasmgpu.legacy

        def build(m):
            import keras
            return kerasmgpu.legacy.multi_gpu_model(m, 2)
        '''
    )


@pytest.mark.text
def test_import_after_a_try_except_import_block() -> None:
    before = """
        try:
            import keras
        except ImportError:
            from tensorflow import keras
        p = keras.utils.multi_gpu_model(m, 2)
    """
    assert migrate(before) == src(
        """
        try:
            import keras
        except ImportError:
            from tensorflow import keras
        import kerasmgpu.legacy

        p = kerasmgpu.legacy.multi_gpu_model(m, 2)
        """
    )


@pytest.mark.text
def test_untraceable_attribute_is_left_alone_with_advice() -> None:
    before = """
        import keras
        p = helpers.multi_gpu_model(m, 2)
        q = keras.utils.multi_gpu_model
        keras.utils.multi_gpu_model = patched
    """
    result = migrate_source(src(before), "t.py")
    assert "p = helpers.multi_gpu_model(m, 2)\n" in result.new_source
    # A load is moved; an assignment to Keras' attribute (a monkeypatch) is not.
    assert "q = kerasmgpu.legacy.multi_gpu_model\n" in result.new_source
    assert "keras.utils.multi_gpu_model = patched\n" in result.new_source
    assert [(a.line, "helpers.multi_gpu_model" in a.message) for a in advice(result)] == [(2, True)]


@pytest.mark.text
def test_parenthesized_reference_keeps_its_parentheses() -> None:
    before = "import keras\np = (keras.utils.multi_gpu_model)(m, 2)\n"
    assert "p = (kerasmgpu.legacy.multi_gpu_model)(m, 2)\n" in migrate(before)


@pytest.mark.text
def test_crlf_newlines_are_kept() -> None:
    before = "import keras\r\n\r\np = keras.utils.multi_gpu_model(m, 2)\r\n"
    assert migrate_source(before).new_source == (
        "import keras\r\nimport kerasmgpu.legacy\r\n\r\n"
        "p = kerasmgpu.legacy.multi_gpu_model(m, 2)\r\n"
    )


# --------------------------------------------------------------------------------------
# Comments, formatting, idempotence

LEGACY_SCRIPT = src(
    '''
    #!/usr/bin/env python
    # -*- coding: utf-8 -*-
    """Keras 2.3 training script, 2 GPUs."""
    from __future__ import print_function

    import argparse   # odd   spacing kept
    import tensorflow as tf
    from keras.utils import to_categorical, multi_gpu_model
    from keras.models import Sequential


    G = 2


    def make_parallel(model, gpu_count):
        """keras-extras."""

        def get_slice(data, idx, parts):
            return data

        return model


    # The template lives on the CPU.
    with tf.device("/cpu:0"):
        model = Sequential()   # template


    batch_size = 64 * G
    parallel = multi_gpu_model(model, gpus=G)  # keep me
    other = make_parallel(model, G)
    again = tf.keras.utils.multi_gpu_model(  model,   gpus = G )
    parallel.fit_generator(gen(), steps_per_epoch=10)
    '''
)

LEGACY_SCRIPT_MIGRATED = src(
    '''
    #!/usr/bin/env python
    # -*- coding: utf-8 -*-
    """Keras 2.3 training script, 2 GPUs."""
    from __future__ import print_function
    import kerasmgpu.keras23

    import argparse   # odd   spacing kept
    import tensorflow as tf
    from keras.utils import to_categorical
    from kerasmgpu.legacy import multi_gpu_model
    from keras.models import Sequential
    import kerasmgpu.legacy


    G = 2


    def make_parallel(model, gpu_count):
        """keras-extras."""

        def get_slice(data, idx, parts):
            return data

        return model


    # The template lives on the CPU.
    with tf.device("/cpu:0"):
        model = Sequential()   # template


    batch_size = 64 * G
    parallel = multi_gpu_model(model, gpus=G)  # keep me
    other = kerasmgpu.legacy.make_parallel(model, G)
    again = kerasmgpu.legacy.multi_gpu_model(  model,   gpus = G )
    parallel.fit_generator(gen(), steps_per_epoch=10)
    '''
)


@pytest.mark.text
def test_comments_blank_lines_and_spacing_survive_exactly() -> None:
    result = migrate_source(LEGACY_SCRIPT)
    assert result.changed
    assert result.new_source == LEGACY_SCRIPT_MIGRATED


SAMPLES = [
    LEGACY_SCRIPT,
    "from keras.utils import to_categorical, multi_gpu_model as mgm\n",
    "import tensorflow as tf\nx = tf.keras.utils.multi_gpu_model(m, 2)\n",
    '"""Doc."""\n\ndef f(m):\n    import keras\n    return keras.utils.multi_gpu_model(m, 2)\n',
    "def make_parallel(model, gpu_count):\n    return model\n\n\np = make_parallel(m, 2)\n",
    "if x: from keras.utils import a, multi_gpu_model\n",
]


@pytest.mark.text
@pytest.mark.parametrize("sample", SAMPLES)
def test_idempotent(sample: str) -> None:
    once = migrate_source(sample)
    twice = migrate_source(once.new_source)
    assert once.changed
    assert not twice.changed
    assert twice.new_source == once.new_source
    # The advice is about the code, not about the run: a second run says the same things
    # (on lines shifted by any import the first run added).
    assert [a.message for a in advice(twice)] == [a.message for a in advice(once)]


@pytest.mark.text
def test_unchanged_source_reports_unchanged() -> None:
    text = "import keras\n\nmodel = keras.Sequential()  # nothing to do\n"
    assert migrate_source(text) == MigrationResult(new_source=text, changed=False, findings=[])


@pytest.mark.text
def test_unparsable_source_raises_migration_error() -> None:
    with pytest.raises(MigrationError) as info:
        migrate_source('print "python 2"\n', "old.py")
    assert isinstance(info.value, ValueError)
    assert info.value.filename == "old.py"
    assert "line 1" in info.value.reason
    message = str(info.value)
    assert "old.py" in message and "cannot parse" in message and "2to3" in message


@pytest.mark.text
def test_parse_error_cites_the_line_and_column_of_the_error() -> None:
    # libcst's own position is off when lines follow the error; the report must not be.
    text = 'import os\nimport keras\nprint "hello"\nx = 1\n'
    with pytest.raises(MigrationError) as info:
        migrate_source(text, "old.py")
    assert "(line 3, column 1)" in info.value.reason
    assert "line 4" not in info.value.reason


# --------------------------------------------------------------------------------------
# make_parallel


@pytest.mark.text
def test_make_parallel_call_sites_move_and_definition_stays() -> None:
    before = """
        def make_parallel(model, gpu_count):
            def get_slice(data, idx, parts):
                return data
            return model

        def build(m):
            return make_parallel(m, gpu_count=4)

        p = make_parallel(model, 2)
    """
    result = migrate_source(src(before), "mp.py")
    assert result.new_source == src(
        """
        import kerasmgpu.legacy

        def make_parallel(model, gpu_count):
            def get_slice(data, idx, parts):
                return data
            return model

        def build(m):
            return kerasmgpu.legacy.make_parallel(m, gpu_count=4)

        p = kerasmgpu.legacy.make_parallel(model, 2)
        """
    )
    assert [(a.line, a.message.split(";")[0]) for a in advice(result)] == [
        (1, "this local make_parallel is no longer used by this file"),
        (2, "get_slice is keras-extras' batch splitter for make_parallel"),
    ]
    assert "dropped the batch remainder and reduced gradients on one device" in (
        advice(result)[0].message
    )


@pytest.mark.text
@pytest.mark.parametrize(
    "before",
    [
        # Not keras-extras' signature: a third parameter.
        "def make_parallel(model, gpu_count, batch):\n    return model\n\n"
        "p = make_parallel(m, 2, 8)\n",
        # A call that passes something else than (model, gpu_count).
        "def make_parallel(model, gpu_count):\n    return model\n\np = make_parallel(m, 2, x=1)\n",
        "def make_parallel(model, gpu_count):\n    return model\n\np = make_parallel(*args)\n",
    ],
)
def test_make_parallel_with_other_shape_is_left_alone_with_advice(before: str) -> None:
    result = migrate_source(before)
    assert not result.changed
    assert [a.line for a in advice(result)] == [1]
    assert "calls were left alone" in advice(result)[0].message


@pytest.mark.text
def test_make_parallel_method_is_not_rewritten() -> None:
    before = (
        "class Trainer:\n"
        "    def make_parallel(self, model):\n"
        "        return model\n\n"
        "    def run(self):\n"
        "        return self.make_parallel(m)\n"
    )
    result = migrate_source(before)
    assert not result.changed
    assert "it is a method" in advice(result)[0].message


@pytest.mark.text
def test_make_parallel_imported_from_elsewhere_is_advised() -> None:
    assert lines_advised(
        "import os\nfrom utils.multi_gpu import make_parallel\n", "import it from kerasmgpu"
    ) == [2]
    assert advice_of("from kerasmgpu.legacy import make_parallel\n") == []


MAKE_PARALLEL_THEN_LOAD = src(
    """
    def make_parallel(model, gpu_count):
        return model

    parallel = make_parallel(model, 1)
    parallel.load_weights("weights.h5")
    model.load_weights("template.h5")
    """
)


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras23", "keras3", "tf_keras"])
def test_load_weights_into_a_make_parallel_result_keeps_the_calls_with_an_error(
        target: str) -> None:
    # The wrong rewrite of the old command: the weight file holds keras-extras' wrapper
    # layout, so moving the call breaks the load. The calls stay; the load is an ERROR.
    result = migrate_source(MAKE_PARALLEL_THEN_LOAD, "mp.py", target)
    assert not result.changed
    loads = [a for a in result.findings if "load_weights" in a.message]
    assert [(a.line, a.severity) for a in loads] == [(5, Severity.ERROR)]  # not line 6
    message = loads[0].message
    assert message.startswith("parallel.load_weights loads into what make_parallel returned")
    assert "saved from keras-extras' make_parallel holds its wrapper's layout" in message
    assert "for gpu_count=1 it returns the template itself" in message
    assert "it was left unchanged: convert it once where the old code runs" in message
    assert "load it into the old wrapper, save the template's weights" in message
    [kept] = [a for a in result.findings if a.line == 1]
    assert "a weight file is loaded into what it returns" in kept.message
    assert kept.severity is (Severity.WARNING if target == "keras23" else Severity.ERROR)


@pytest.mark.text
@pytest.mark.parametrize(
    "text",
    [
        "from utils import make_parallel\nmake_parallel(m, 4).load_weights(path)\n",
        "import kerasmgpu.legacy\n"
        "self.pmodel.load_weights(path)\n"
        "self.pmodel = kerasmgpu.legacy.make_parallel(m, 2)\n",
    ],
    ids=["chained-on-the-call", "attribute-assigned-later"],
)
def test_load_weights_on_any_make_parallel_result_is_advised(text: str) -> None:
    assert lines_advised(text, "loads into what make_parallel returned") == [2]


@pytest.mark.text
def test_load_weights_without_make_parallel_is_not_advised() -> None:
    assert advice_of("parallel = multi_gpu(m, 2)\nparallel.load_weights(p)\n") == []


@pytest.mark.text
def test_get_slice_alone_in_an_unrelated_file_is_not_advised() -> None:
    assert advice_of("def get_slice(a, i):\n    return a[i]\n") == []


# --------------------------------------------------------------------------------------
# Advice-only patterns and their line numbers


@pytest.mark.text
@pytest.mark.parametrize(
    "device",
    ["'/cpu:0'", '"/cpu:0"', "'/CPU:0'", '"cpu:0"', "'/device:CPU:0'"],
)
def test_cpu_template_scope_is_advised(device: str) -> None:
    text = f"import tensorflow as tf\n\nwith tf.device({device}):\n    model = build()\n"
    assert lines_advised(text, "the template no longer needs to live on the CPU") == [3]
    assert not migrate_source(text).changed


@pytest.mark.text
def test_cpu_scope_through_tensorflow_alias_and_gpu_scope() -> None:
    assert lines_advised(
        "from tensorflow import device\nwith device('/cpu:0'):\n    m = build()\n",
        "live on the CPU",
    ) == [2]
    assert advice_of("import tensorflow as tf\nwith tf.device('/gpu:0'):\n    m = b()\n") == []


@pytest.mark.text
@pytest.mark.parametrize(
    "device",
    [
        '"/cpu:0" if n > 1 else "/gpu:0"',
        '"/gpu:0" if single else "/cpu:0"',
        '"/gpu:0" if a else ("/cpu:0" if b else "/gpu:1")',
    ],
)
def test_conditional_cpu_device_is_advised_like_the_plain_string(device: str) -> None:
    text = f"import tensorflow as tf\n\nwith tf.device({device}):\n    model = build()\n"
    [(line, message)] = advice_of(text)
    assert line == 3
    assert message.startswith(f"with tf.device({device}): ")
    assert "the template no longer needs to live on the CPU" in message


@pytest.mark.text
def test_conditional_device_without_cpu_is_not_advised() -> None:
    text = "import tensorflow as tf\nwith tf.device('/gpu:0' if a else '/gpu:1'):\n    m = b()\n"
    assert advice_of(text) == []


@pytest.mark.text
@pytest.mark.parametrize(
    "line",
    [
        "batch_size = 64 * gpus",
        "batch_size = 64 * gpu_count",
        "batch_size = per_gpu * n_gpus",
        "batch_size = 32 * num_gpus",
        "batch_size = 64 * G",
        "BATCH_SIZE = 64 * NUM_GPUS",
        "batch_size = 64 * len(gpu_ids)",
        "batch_size = args.batch_size * args.gpus",
        "batch_size = 64 * int(args['gpus'])",
        "batch_size *= gpus",
        "batch_size: int = 16 * gpus",
        "model.fit(x, y, batch_size=32 * gpus)",
    ],
)
def test_batch_size_times_gpu_count_is_advised(line: str) -> None:
    text = f"import keras\n\n{line}\n"
    assert lines_advised(text, "batch_size is the global batch in kerasmgpu") == [3]


@pytest.mark.text
def test_batch_size_times_a_gpu_count_alias_is_advised() -> None:
    text = "n = len(gpu_list)\nbatch_size = 64 * n\n"
    assert lines_advised(text, "global batch") == [2]


@pytest.mark.text
@pytest.mark.parametrize(
    "line",
    [
        "batch_size = 64 * epochs",
        "batch_size = 64",
        "steps = n // (batch * gpus)",
        "lr = 0.1 * gpus",
    ],
)
def test_unrelated_products_are_not_advised(line: str) -> None:
    assert lines_advised(f"{line}\n", "global batch") == []


@pytest.mark.text
@pytest.mark.parametrize(
    ("method", "base"),
    [
        ("fit_generator", "fit"),
        ("evaluate_generator", "evaluate"),
        ("predict_generator", "predict"),
    ],
)
def test_generator_methods_are_advised(method: str, base: str) -> None:
    text = f"model.compile('sgd')\nout = (model\n    .{method}(gen, steps=3))\n"
    advised = advice_of(text)
    assert [line for line, _ in advised] == [3]
    assert f"{method} is deprecated" in advised[0][1]
    assert f"{base}() accepts generators" in advised[0][1]


@pytest.mark.text
def test_advice_for_the_whole_legacy_script_with_line_numbers() -> None:
    advised = advice(migrate_source(LEGACY_SCRIPT, "train.py"))
    assert all(isinstance(a, Finding) and a.filename == "train.py" for a in advised)
    assert [(a.line, a.message.split(" ")[0]) for a in advised] == [
        (15, "this"),  # def make_parallel
        (18, "get_slice"),  # def get_slice
        (25, "with"),  # with tf.device("/cpu:0")
        (29, "batch_size"),  # batch_size = 64 * G
        (33, "fit_generator"),
    ]
    assert str(advised[3]).startswith("train.py:29:1: INFO: batch_size is multiplied")


@pytest.mark.text
def test_star_import_with_bare_use_is_advised() -> None:
    text = "from keras.utils import *\n\np = multi_gpu_model(m, 2)\n"
    assert lines_advised(text, "star import") == [1]
    assert lines_advised("from keras.utils import *\n", "star import") == []


@pytest.mark.text
@pytest.mark.parametrize(
    "line",
    [
        "import keras.utils.multi_gpu_utils as mgu",
        "from keras.utils import multi_gpu_utils",
        "from keras.utils.multi_gpu_utils import get_slice, multi_gpu_model",
        "import tensorflow.python.keras.utils.multi_gpu_utils",
    ],
)
def test_imports_of_removed_modules_are_advised(line: str) -> None:
    assert lines_advised(f"import os\n{line}\n", "does not exist in TF >= 2.4") == [2]


KERAS_EXTRAS = src(
    """
    from keras.layers.core import Lambda
    from keras.models import Model
    import tensorflow as tf

    def make_parallel(model, gpu_count):
        def get_slice(data, idx, parts):
            shape = tf.shape(data)
            return tf.slice(data, shape[:1] // parts * idx, shape[:1] // parts)

        outputs_all = [[] for _ in model.outputs]
        for i in range(gpu_count):
            with tf.device('/gpu:%d' % i):
                pass
        # merge outputs on CPU
        with tf.device('/cpu:0'):
            return Model(input=model.inputs, output=outputs_all)
    """
)


@pytest.mark.text
def test_keras_extras_module_gets_def_advice_but_no_template_advice() -> None:
    result = migrate_source(KERAS_EXTRAS, "multi_gpu.py")
    assert not result.changed
    assert [(a.line, a.message.split(" ")[0]) for a in advice(result)] == [
        (5, "this"),
        (6, "get_slice"),
    ]


@pytest.mark.text
def test_vendored_multi_gpu_model_definition_is_advised() -> None:
    text = (
        "import tensorflow as tf\n\n"
        "def multi_gpu_model(model, gpus=None, cpu_merge=True, cpu_relocation=False):\n"
        "    with tf.device('/cpu:0'):\n"
        "        return model\n"
    )
    assert [line for line, _ in advice_of(text)] == [3]
    assert "copy of Keras'" in advice_of(text)[0][1]


# A vendored keras/utils/multi_gpu_utils.py, cut down: Keras's own get_slice and CPU scopes.
KERAS_OWN_COPY = src(
    '''
    """Multi-GPU training utilities (vendored from Keras 2.2)."""
    from __future__ import absolute_import

    from ..layers.merge import concatenate
    from .. import backend as K
    from ..layers.core import Lambda
    from ..engine.training import Model
    from ..models import clone_model


    def _get_available_devices():
        return [x.name for x in K.get_session().list_devices()]


    def multi_gpu_model(model, gpus, cpu_merge=True, cpu_relocation=False):
        import tensorflow as tf

        def get_slice(data, i, parts):
            shape = K.shape(data)
            step = shape[:1] // parts
            return K.slice(data, step * i, step)

        if cpu_relocation:
            with tf.device('/cpu:0'):
                model = clone_model(model)

        outputs = []
        for i in range(gpus):
            with tf.device('/gpu:%d' % i):
                x = Lambda(get_slice, arguments={'i': i, 'parts': gpus})(model.inputs[0])
                outputs.append(model(x))

        with tf.device('/cpu:0' if cpu_merge else '/gpu:0'):
            return Model(model.inputs, concatenate(outputs, axis=0))
    '''
)


@pytest.mark.text
def test_copy_of_keras_multi_gpu_model_gets_keras_advice_not_keras_extras() -> None:
    result = migrate_source(KERAS_OWN_COPY, "multi_gpu_utils.py")
    assert not result.changed
    [found] = advice(result)
    assert found.line == 15
    assert "copy of Keras's multi_gpu_model" in found.message
    assert "kerasmgpu.legacy.multi_gpu_model replaces it" in found.message
    assert "from kerasmgpu.legacy import multi_gpu_model" in found.message
    assert "keras-extras" not in found.message


@pytest.mark.text
def test_module_level_get_slice_beside_a_multi_gpu_model_copy_is_keras_not_keras_extras() -> None:
    text = (
        "def get_slice(data, i, parts):\n    return data\n\n\n"
        "def multi_gpu_model(model, gpus):\n    return model\n"
    )
    assert [line for line, _ in advice_of(text)] == [5]
    # Beside a make_parallel, the same get_slice is keras-extras' again.
    assert lines_advised(text + "\np = make_parallel(m, 2)\n", "keras-extras") == [1]


@pytest.mark.text
@pytest.mark.parametrize("line", ["import kerasmgpu.keras23", "from kerasmgpu import keras23"])
def test_the_keras23_runtime_import_goes_on_the_modern_targets(line: str) -> None:
    text = f"{line}\nimport keras\n"
    assert migrate(text, "keras3") == "import keras\n"
    assert migrate(text, "keras23") == text


@pytest.mark.text
def test_parallelize_reuses_an_existing_kerasmgpu_binding() -> None:
    text = "import kerasmgpu.legacy\nimport keras\np = keras.utils.multi_gpu_model(m, 2)\n"
    assert migrate(text, "keras3") == (
        "import kerasmgpu.legacy\nimport keras\np = kerasmgpu.parallelize(m, gpus=2)\n")


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_modern_targets_call_parallelize_and_drop_the_import(target: str) -> None:
    text = """
        from keras.utils import multi_gpu_model, to_categorical
        parallel = multi_gpu_model(model, gpus=4, cpu_relocation=True)
        parallel.compile("sgd", "mse")
        model.save("template.h5")
    """
    after = migrate(text, target)
    assert "parallel = kerasmgpu.parallelize(model, gpus=4)\n" in after
    assert "multi_gpu_model" not in after
    assert "import kerasmgpu\n" in after
    [info] = [f for f in migrate_source(src(text), "f.py", target).findings
              if "parallelize" in f.message]
    assert "cpu_relocation dropped" in info.message
    assert "save the template" in info.message


@pytest.mark.text
def test_a_non_call_reference_keeps_the_drop_in_on_modern_targets() -> None:
    text = "from keras.utils import multi_gpu_model\nwrap = multi_gpu_model\n"
    assert migrate(text, "keras3") == (
        "from kerasmgpu.legacy import multi_gpu_model\nwrap = multi_gpu_model\n")


@pytest.mark.text
def test_privates_of_multi_gpu_utils_are_errors_on_modern_targets() -> None:
    text = ("from keras.utils.multi_gpu_utils import _get_available_devices\n"
            "import keras.utils.multi_gpu_utils as mgu\nn = mgu._normalize_device_name(d)\n")
    found = migrate_source(text, "f.py", "keras3").findings
    errors = [f for f in found if f.severity is Severity.ERROR]
    assert [f.line for f in errors] == [1, 2, 3]
    assert "tf.config.list_logical_devices()" in errors[0].message
    assert "kerasmgpu takes GPU ids" in errors[2].message


SCRIPT_WITH_FUTURE = '''"""Trains a small model (Keras 2.3.1's examples open like this)."""
from __future__ import print_function
import keras

print(keras.__version__)
model = keras.models.Sequential([keras.layers.Dense(1, input_shape=(2,))])
model.compile("sgd", "mse")
'''


@pytest.mark.text
def test_keras23_puts_the_runtime_import_after_the_docstring_and_future_lines() -> None:
    out = migrate(SCRIPT_WITH_FUTURE)
    assert out.startswith('"""Trains a small model (Keras 2.3.1\'s examples open like this)."""'
                          "\nfrom __future__ import print_function\nimport kerasmgpu.keras23\n"
                          "import keras\n")
    assert migrate(out) == out
    assert [f.line for f in migrate_source(SCRIPT_WITH_FUTURE).findings
            if "import kerasmgpu.keras23 added" in f.message] == [3]
    late = SCRIPT_WITH_FUTURE.replace("import keras\n", "import keras\nimport kerasmgpu.keras23\n")
    assert migrate(late) == out  # after `import keras` it raised TooLateError: moved
    library = "import keras\n\ndef build():\n    return keras.models.Sequential()\n"
    assert migrate(library) == library  # a module the script imports: the script has it
    assert "kerasmgpu.keras23" not in _migrate_source(SCRIPT_WITH_FUTURE, "s.py",
                                                      "keras3").new_source


@pytest.mark.skipif(not ON_LEGACY, reason="runs Keras 2.3.1 (the keras23 env)")
def test_the_placed_runtime_import_makes_keras23_import(tmp_path: Path) -> None:
    """In a fresh interpreter without the keras23 env's sitecustomize: the placed line
    alone makes Keras 2.3.1 import (a first line before `from __future__` is a
    SyntaxError)."""
    script = tmp_path / "train.py"
    script.write_text(migrate(SCRIPT_WITH_FUTURE))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
             if p and not p.rstrip("/").endswith("compat/keras23")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == "2.3.1"
