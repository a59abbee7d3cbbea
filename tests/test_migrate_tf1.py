"""`kerasmgpu migrate`, the TF1 family: session setup, tf.compat.v1 names, graph-only code."""

from __future__ import annotations

import pytest
from migrate_cases import assert_idempotent, findings, migrate, severities, src

from kerasmgpu.migrate import Severity

GROWTH = ('for gpu in tf.config.list_physical_devices("GPU"):\n'
          "    tf.config.experimental.set_memory_growth(gpu, True)\n")


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_the_allow_growth_setup_becomes_memory_growth(target: str) -> None:
    text = """
        import tensorflow as tf
        from keras import backend as K

        # use only the memory we need
        config = tf.ConfigProto()
        config.gpu_options.allow_growth = True
        sess = tf.Session(config=config)
        K.set_session(sess)
        model = build()
    """
    after = migrate(text, target)
    assert f"# use only the memory we need\n{GROWTH}model = build()\n" in after
    assert "Session" not in after and "set_session" not in after
    assert_idempotent(text, target)


@pytest.mark.text
def test_one_line_setup_through_tensorflow_backend_and_its_import() -> None:
    text = """
        import tensorflow as tf
        from keras.backend.tensorflow_backend import set_session
        set_session(tf.Session(config=tf.ConfigProto(log_device_placement=True)))
    """
    assert migrate(text) == src("""
        import tensorflow as tf
        tf.debugging.set_log_device_placement(True)
    """)


@pytest.mark.text
def test_compat_v1_setup_with_gpu_options_warns_about_the_fraction() -> None:
    text = """
        import tensorflow as tf
        config = tf.compat.v1.ConfigProto(
            gpu_options=tf.compat.v1.GPUOptions(per_process_gpu_memory_fraction=0.9))
        config.gpu_options.allow_growth = True
        session = tf.compat.v1.Session(config=config)
        tf.compat.v1.keras.backend.set_session(session)
    """
    after = migrate(text)
    assert after == src("import tensorflow as tf\n") + GROWTH
    [warning] = [f for f in findings(text) if f.severity is Severity.WARNING]
    assert "per_process_gpu_memory_fraction=0.9 dropped" in warning.message
    assert "set_logical_device_configuration" in warning.message


@pytest.mark.text
def test_a_session_used_for_more_is_left_with_an_error() -> None:
    text = """
        import tensorflow as tf
        from keras import backend as K
        config = tf.ConfigProto()
        sess = tf.Session(config=config)
        K.set_session(sess)
        sess.run(op)
    """
    assert severities(text, "is used beyond setting it up") == [Severity.ERROR]
    assert "sess = tf.Session(config=config)" in migrate(text)


@pytest.mark.text
@pytest.mark.parametrize(
    ("old", "new"),
    [("tf.set_random_seed(1)", "tf.random.set_seed(1)"),
     ("y = tf.to_float(x)", "y = tf.compat.v1.to_float(x)"),
     ("y = tf.log(x)", "y = tf.compat.v1.log(x)"),
     ("opt = tf.train.AdamOptimizer(1e-4)", "opt = tf.compat.v1.train.AdamOptimizer(1e-4)"),
     ("tf.reset_default_graph()", "keras.backend.clear_session()")],
)
def test_tf1_names(old: str, new: str) -> None:
    assert migrate(f"import tensorflow as tf\n{old}\n").endswith(f"{new}\n")


@pytest.mark.text
@pytest.mark.parametrize("line", ["x = tf.placeholder(tf.float32, [None, 3])",
                                  "s = K.get_session()", "s = tf.InteractiveSession()"])
def test_graph_only_code_is_an_error(line: str) -> None:
    text = f"import tensorflow as tf\nfrom keras import backend as K\n{line}\n"
    assert [f.severity for f in findings(text) if f.line == 3] == [Severity.ERROR]


@pytest.mark.text
def test_keras23_target_changes_nothing() -> None:
    text = "import tensorflow as tf\nconfig = tf.ConfigProto()\ntf.set_random_seed(1)\n"
    assert migrate(text, "keras23") == text


@pytest.mark.text
@pytest.mark.parametrize("target", ["keras3", "tf_keras"])
def test_a_session_made_from_the_config_and_never_set_becomes_memory_growth(
        target: str) -> None:
    """The to_multi_gpu files' set-up: no set_session, the session never used."""
    text = """
        import tensorflow as tf

        session_config = tf.ConfigProto()
        session_config.gpu_options.allow_growth = True
        session = tf.Session(config=session_config)
        """
    assert assert_idempotent(text, target) == (
        'import tensorflow as tf\n\nfor gpu in tf.config.list_physical_devices("GPU"):\n'
        "    tf.config.experimental.set_memory_growth(gpu, True)\n")
    assert [f.severity for f in findings(text, target)] == [Severity.INFO]


@pytest.mark.text
def test_a_session_used_for_graph_code_is_one_error_naming_the_settings() -> None:
    text = """
        import tensorflow as tf
        config = tf.ConfigProto()
        config.gpu_options.allow_growth = True
        sess = tf.Session(config=config)
        print(sess.run(x))
        """
    errors = [f for f in findings(text) if f.severity is Severity.ERROR]
    assert [(f.line, f.col) for f in errors] == [(4, 1)]
    assert "`sess`, the tf.Session made from this config, is used" in errors[0].message
    assert "Keras 3 has no session" in errors[0].message
    [tf_keras] = [f for f in findings(text, "tf_keras") if f.severity is Severity.ERROR]
    assert "tf_keras has no session" in tf_keras.message
