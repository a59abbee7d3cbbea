"""`kerasmgpu migrate`, the saving family: file endings and callback arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import keras_module, requires
from migrate_cases import assert_idempotent, findings, migrate, run_keras23, severities

from kerasmgpu.env.versions import KerasLine
from kerasmgpu.migrate import Severity


@pytest.mark.text
@pytest.mark.parametrize(
    ("call", "new"),
    [('model.save_weights("w.h5")', 'model.save_weights("w.weights.h5")'),
     ("model.save_weights('w.hdf5')", "model.save_weights('w.weights.h5')"),
     ('model.save_weights(f"{d}/w_{e}.h5")', 'model.save_weights(f"{d}/w_{e}.weights.h5")'),
     ('model.save_weights("w_%d.h5" % e)', 'model.save_weights("w_%d.weights.h5" % e)'),
     ('model.save_weights("w_{}.h5".format(e))', 'model.save_weights("w_{}.weights.h5".format(e))'),
     ('model.save_weights(os.path.join(d, "w.h5"))',
      'model.save_weights(os.path.join(d, "w.weights.h5"))'),
     ('model.save_weights("w.weights.h5")', 'model.save_weights("w.weights.h5")')],
)
def test_save_weights_endings(call: str, new: str) -> None:
    text = f"import os\n{call}\n"
    assert migrate(text) == f"import os\n{new}\n"
    assert migrate(text, "tf_keras") == text
    assert_idempotent(text)


@pytest.mark.text
def test_a_path_not_spelled_in_the_source_is_a_warning() -> None:
    assert severities("model.save_weights(path)\n", "not spelled in the source") == [
        Severity.WARNING]


@pytest.mark.text
def test_loads_of_a_file_this_module_saves_follow_its_new_name() -> None:
    text = 'model.save_weights("w.h5")\nmodel.load_weights("w.h5")\nother.load_weights("o.h5")\n'
    assert migrate(text) == (
        'model.save_weights("w.weights.h5")\nmodel.load_weights("w.weights.h5")\n'
        'other.load_weights("o.h5")\n'
    )


@pytest.mark.text
def test_every_literal_of_a_renamed_checkpoint_path_follows_it() -> None:
    """Keras-FCN's train.py: the resume path spelled again, and a path held in a name."""
    text = """
        import os
        from keras.callbacks import ModelCheckpoint
        checkpoint_path = os.path.join(save_path, 'checkpoint_weights.hdf5')
        if resume and os.path.exists(checkpoint_path):
            model.load_weights(checkpoint_path)
        checkpoint = ModelCheckpoint(filepath=os.path.join(save_path, 'checkpoint_weights.hdf5'),
                                     save_weights_only=True)
        weights_file = "./weights/%s_weights.h5" % prefix
        best = ModelCheckpoint(weights_file, save_best_only=True, save_weights_only=True)
        model.load_weights("./weights/%s_weights.h5" % prefix)
        """
    out = assert_idempotent(text)
    assert out.count("'checkpoint_weights.weights.h5'") == 2
    assert out.count('"./weights/%s_weights.weights.h5"') == 2
    assert "hdf5" not in out and "s_weights.h5" not in out
    [followed] = [f for f in findings(text) if "the weight file written at line 6" in f.message]
    assert (followed.line, followed.col, followed.severity) == (3, 43, Severity.INFO)


@pytest.mark.text
def test_another_file_that_reads_a_renamed_checkpoint_follows_it(tmp_path: Path) -> None:
    from kerasmgpu.migrate import cli

    (tmp_path / "train.py").write_text(
        "from keras.callbacks import ModelCheckpoint\n"
        "cb = ModelCheckpoint('checkpoint_weights.hdf5', save_weights_only=True)\n")
    (tmp_path / "evaluate.py").write_text(
        "weight_file = 'checkpoint_weights.hdf5'\nmodel.load_weights(weight_file)\n")
    assert cli.main([str(tmp_path), "--to", "keras3", "--write"]) == 0
    assert (tmp_path / "evaluate.py").read_text() == (
        "weight_file = 'checkpoint_weights.weights.h5'\nmodel.load_weights(weight_file)\n")
    assert cli.main([str(tmp_path), "--to", "keras3", "--check"]) == 0  # nothing left


@pytest.mark.text
def test_model_checkpoint_endings_and_period() -> None:
    text = """
        from keras.callbacks import ModelCheckpoint, TensorBoard
        a = ModelCheckpoint("w.{epoch:02d}.hdf5", save_weights_only=True, period=5)
        b = ModelCheckpoint(filepath="best.h5", save_best_only=True, period=1)
        t = TensorBoard(log_dir="logs", batch_size=32, write_grads=True)
    """
    after = migrate(text)
    assert 'a = ModelCheckpoint("w.{epoch:02d}.weights.h5", save_weights_only=True)' in after
    assert 'b = ModelCheckpoint(filepath="best.keras", save_best_only=True)' in after
    assert 't = TensorBoard(log_dir="logs")' in after
    assert severities(text, "period=5") == [Severity.WARNING]
    assert severities(text, "write_grads") == [Severity.WARNING]
    tf_keras = migrate(text, "tf_keras")
    assert "period=5" in tf_keras and 't = TensorBoard(log_dir="logs")' in tf_keras


@pytest.mark.text
def test_model_checkpoint_through_the_projects_star_import() -> None:
    """zhixuhao/unet's main.py: `from model import *`, whose model.py imported it."""
    text = """
        from model import *
        ckpt = ModelCheckpoint('unet_membrane.hdf5', monitor='loss', save_best_only=True)
    """
    assert "ckpt = ModelCheckpoint('unet_membrane.keras', monitor='loss'" in migrate(text)
    bound = "from mine import ModelCheckpoint\nc = ModelCheckpoint('x.hdf5')\n"
    assert migrate(bound) == bound  # the project's own class, not Keras's


@pytest.mark.text
def test_save_to_a_folder_is_a_warning_on_keras3() -> None:
    [warning] = findings('model.save("exported_model")\n')
    assert "model.export(" in warning.message
    assert findings('model.save("m.h5")\nnp.save("x.npy", x)\n') == []


SOURCE = '''
import numpy as np
from keras.callbacks import ModelCheckpoint
from keras.layers import Dense
from keras.models import Sequential

model = Sequential([Dense(2, input_shape=(3,))])
model.compile("sgd", "mse")
checkpoint = ModelCheckpoint("best.h5", save_weights_only=True, period=1)
model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=2, verbose=0, callbacks=[checkpoint])
model.save_weights("final.h5")
result = sorted(str(p) for p in __import__("os").listdir("."))
'''


@requires(lines=[KerasLine.LEGACY, KerasLine.KERAS_3, KerasLine.TF_KERAS_LEGACY])
@pytest.mark.core
def test_the_migrated_saving_code_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert keras_module() is not None
    files = run_keras23(SOURCE, "saving.py")["result"]
    assert files in (["best.h5", "final.h5"], ["best.weights.h5", "final.weights.h5"])


@pytest.mark.text
def test_a_path_held_in_a_dict_literal_is_renamed_where_it_is_spelled() -> None:
    """Keras-GAN's save_model(): the weight path goes through a name and a dict."""
    text = """
        def save(model, model_name):
            weights_path = "saved_model/%s_weights.hdf5" % model_name
            options = {"file_arch": "a.json", "file_weight": weights_path}
            model.save_weights(options['file_weight'])
        """
    out = assert_idempotent(text)
    assert 'weights_path = "saved_model/%s_weights.weights.h5" % model_name' in out
    assert not severities(text, "not spelled in the source")
