"""Bad input fails before any weight is touched, saying received / allowed / fix."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    ON_JAX,
    VIRTUAL,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

pytestmark = [requires(in_process=True), pytest.mark.core]
if IN_PROCESS:
    keras = keras_module()


@pytest.fixture
def model():
    m = mlp(keras)
    m.__kerasmgpu_weights = [w.copy() for w in m.get_weights()]
    yield m
    # Nothing touched: same weights, not turned into a parallel model.
    for before, after in zip(m.__kerasmgpu_weights, m.get_weights()):
        np.testing.assert_array_equal(before, after)
    assert "_kerasmgpu" not in m.__dict__


def _message(info: pytest.ExceptionInfo) -> str:
    text = str(info.value)
    assert "Received:" in text and "Allowed:" in text and "Fix:" in text, text
    return text


@pytest.mark.parametrize(
    "gpus,kind,expected",
    [
        (0, ValueError, "gpus=0"),
        (-2, ValueError, "gpus=-2"),
        (1.5, TypeError, "gpus=1.5"),
        (True, TypeError, "gpus=True"),
        ("2", TypeError, "gpus='2'"),
        ([0, 0], ValueError, "duplicate id(s) [0]"),
        ([], ValueError, "non-empty"),
        ([0, 1.0], TypeError, "integer device ids"),
        (VIRTUAL + 1, ValueError, "Try reducing `gpus`"),
        ([0, VIRTUAL], ValueError, f"expected devices [{VIRTUAL}] do not exist"),
    ],
)
def test_bad_gpus(model, gpus, kind, expected) -> None:
    with pytest.raises(kind) as info:
        kerasmgpu.parallelize(model, gpus=gpus)
    assert expected in _message(info)


def test_more_devices_than_exist_lists_them(model) -> None:
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(model, gpus=VIRTUAL + 5)
    text = _message(info)
    assert f"this machine shows {VIRTUAL} device(s)" in text


@pytest.mark.parametrize("obj", [None, object(), "model", [1, 2]])
def test_not_a_model(obj) -> None:
    with pytest.raises(TypeError) as info:
        kerasmgpu.parallelize(obj)
    assert "model" in _message(info)


def test_model_of_another_keras() -> None:
    # A class that says it comes from tf_keras (or Keras 3, when tf_keras is active).
    other = "keras.src.models.model" if "tf_keras" in str(kerasmgpu.environment().keras_line) \
        else "tf_keras.src.engine.training"
    Foreign = type("Model", (), {"__module__": other})
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(Foreign())
    text = _message(info)
    assert "a model of the active Keras" in text and "kerasmgpu doctor" in text


@requires(lines=[kerasmgpu.KerasLine.TF_KERAS_LEGACY])
def test_real_keras3_model_when_tf_keras_is_active() -> None:
    import keras as keras3  # Keras 3 is installed beside tf_keras in this env

    foreign = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(1)])
    with pytest.raises(ValueError, match="built with Keras 3"):
        kerasmgpu.parallelize(foreign)


def test_unknown_route(model) -> None:
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(model, route="horovod")
    assert "multi_gpu_model, mirrored, keras_distribution, torch_ddp" in _message(info)


def test_route_of_another_line(model) -> None:
    other = "mirrored" if ON_JAX else "keras_distribution"
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(model, route=other)
    assert f"route={other!r}" in _message(info)


def test_subclassed_model_that_cannot_be_cloned() -> None:
    class Net(keras.Model):
        def __init__(self, head):  # a layer argument: no config can rebuild it
            super().__init__()
            self.head = head

        def call(self, x):
            return self.head(x)

    net = Net(keras.layers.Dense(3))
    net(np.zeros((2, 4), "float32"))
    if ON_JAX:  # JAX trains the user's own model in place: nothing to copy
        assert kerasmgpu.parallelize(net, gpus=2) is net
        return
    before = [w.copy() for w in net.get_weights()]
    with pytest.raises(TypeError) as info:
        kerasmgpu.parallelize(net, gpus=2)
    text = _message(info)
    # Our fix comes first; what Keras said follows it.
    assert text.index("Fix:") < text.index("What Keras said"), text
    assert "kerasmgpu.scope()" in text.split("What Keras said")[0]
    for a, b in zip(before, net.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_parallelize_twice(model) -> None:
    pmodel = kerasmgpu.parallelize(mlp(keras), gpus=2)
    with pytest.raises(ValueError, match="already returned by parallelize"):
        kerasmgpu.parallelize(pmodel, gpus=2)


def test_bad_fit_arguments_are_explained() -> None:
    pmodel = kerasmgpu.parallelize(mlp(keras), gpus=2)
    x = np.zeros((10, 20), "float32")
    with pytest.raises(ValueError, match="same number of rows"):
        pmodel.fit(x, np.zeros(9, "int64"), verbose=0)
    # class_weight beside sample_weight: refused where Keras refuses it, per line
    # (tests/test_data.py: test_class_weight_beside_sample_weight).
    with pytest.raises(TypeError, match="numpy-like arrays"):
        pmodel.fit(object(), verbose=0)


def test_subclassed_model_with_a_config_is_cloned_and_trains() -> None:
    class Net(keras.Model):
        def __init__(self, units=3, **kwargs):
            super().__init__(**kwargs)
            self.units = units
            self.hidden = keras.layers.Dense(8, activation="tanh")
            self.out = keras.layers.Dense(units)

        def call(self, x):
            return self.out(self.hidden(x))

        def get_config(self):
            return {"units": self.units, "name": self.name}

    def build():
        keras.utils.set_random_seed(7)
        net = Net(3)
        net(np.zeros((1, 4), "float32"))
        net.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return net

    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(70, 4)).astype("float32"), rng.normal(size=(70, 3)).astype("float32")
    single, template = build(), build()
    pmodel = kerasmgpu.parallelize(template, gpus=2)
    h1 = single.fit(x, y, batch_size=33, epochs=2, shuffle=False, verbose=0)
    h2 = pmodel.fit(x, y, batch_size=33, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(h1.history["loss"], h2.history["loss"], rtol=1e-5)
    for a, b in zip(single.get_weights(), template.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


# --- data mistakes: our errors, the same on every route, before anything runs ------------


@pytest.fixture
def fresh_pmodel():
    template = mlp(keras)
    pmodel = kerasmgpu.parallelize(template, gpus=2)
    before = [w.copy() for w in template.get_weights()]
    yield pmodel
    for a, b in zip(before, template.get_weights()):  # nothing trained
        np.testing.assert_array_equal(a, b)
    for a, b in zip(before, pmodel.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_zero_rows(fresh_pmodel) -> None:
    empty = np.zeros((0, 20), "float32")
    with pytest.raises(ValueError) as info:
        fresh_pmodel.fit(empty, np.zeros(0, "int64"), verbose=0)
    assert "0 rows" in _message(info)
    with pytest.raises(ValueError, match="0 rows"):
        fresh_pmodel.evaluate(empty, np.zeros(0, "int64"), verbose=0)


def test_row_counts_name_each_array(fresh_pmodel) -> None:
    x = np.zeros((10, 20), "float32")
    with pytest.raises(ValueError) as info:
        fresh_pmodel.fit(x, np.zeros(9, "int64"), sample_weight=np.ones(11), verbose=0)
    text = _message(info)
    assert "x has 10" in text and "y has 9" in text and "sample_weight has 11" in text


def test_bad_validation_data_is_named_as_validation_data(fresh_pmodel) -> None:
    """The feed that refuses a fit's x refuses its validation data's too: the message
    says which (it named `x` for both)."""
    x, y = np.zeros((10, 20), "float32"), np.zeros(10, "int64")
    cases = [((x, y[:9]), r"Invalid `x/y` of `validation_data`\. Received: .*y has 9"),
             ((x[:, :19], y), r"Invalid `x` of `validation_data`\. .*\(10, 19\)"),
             ((x[:0], y[:0]), r"Invalid `x` of `validation_data`\. .*0 rows")]
    for validation, expected in cases:
        with pytest.raises(ValueError, match=expected):
            fresh_pmodel.fit(x, y, validation_data=validation, verbose=0)
    with pytest.raises(ValueError, match=r"^Invalid `x/y`\. Received: .*y has 9"):
        fresh_pmodel.fit(x, y[:9], validation_data=(x, y), verbose=0)  # the fit's own


def test_feature_width_names_the_input_and_both_shapes(fresh_pmodel) -> None:
    x = np.zeros((1001, 19), "float32")
    with pytest.raises(ValueError) as info:
        fresh_pmodel.fit(x, np.zeros(1001, "int64"), batch_size=50, verbose=0)
    text = _message(info)
    # Global shapes, not a replica's slice of them.
    assert "(1001, 19)" in text and "(None, 20)" in text, text
    with pytest.raises(ValueError, match=r"\(1001, 19\)"):
        fresh_pmodel.predict(x, verbose=0)


# --- the mirrored route: what TensorFlow cannot train there, refused up front ---------------


def _tf_refusals():
    if not IN_PROCESS or ON_JAX:
        return []
    out = [("jit_compile", {"jit_compile": True}, r"jit_compile=True.*CPU devices")]
    if LINE is KerasLine.KERAS_3:
        out += [("steps_per_execution", {"steps_per_execution": 4},
                 r"steps_per_execution=4.*multi_step_on_iterator"),
                ("ema", {"optimizer": lambda: keras.optimizers.SGD(
                    0.1, use_ema=True, ema_overwrite_frequency=2)},
                 r"ema_overwrite_frequency=2.*merge_call")]
    return out


@requires(tf=True)
@pytest.mark.parametrize("setting,compiled,expected", _tf_refusals(),
                         ids=[r[0] for r in _tf_refusals()])
def test_what_the_mirrored_route_cannot_train_is_refused(setting, compiled, expected) -> None:
    """Each fails inside fit on plain MirroredStrategy too (a framework trace there)."""
    made = {k: v() if callable(v) else v for k, v in compiled.items()}
    template = mlp(keras, **made)
    before = template.get_weights()
    with pytest.raises(ValueError, match=expected) as info:
        kerasmgpu.parallelize(template, gpus=2)
    _message(info)
    parallel = kerasmgpu.parallelize(mlp(keras), gpus=2)
    made = {k: v() if callable(v) else v for k, v in compiled.items()}
    with pytest.raises(ValueError, match=expected):  # a compile of the parallel model
        parallel.compile(optimizer=made.pop("optimizer", "sgd"),
                         loss="sparse_categorical_crossentropy", **made)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)


@requires(tf=True)
def test_a_model_of_the_users_own_strategy_is_refused() -> None:
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        template = mlp(keras)
    with pytest.raises(ValueError, match=r"your own tf.distribute.MirroredStrategy") as info:
        kerasmgpu.parallelize(template, gpus=2)
    _message(info)
    assert "_kerasmgpu" not in template.__dict__


@requires(tf=True)
def test_an_unbatched_dataset_is_refused_before_a_step() -> None:
    import tensorflow as tf

    x, y = classification_data(20)
    template = mlp(keras)
    before = template.get_weights()
    parallel = kerasmgpu.parallelize(template, gpus=2)
    with pytest.raises(ValueError, match=r"unbatched tf.data.Dataset.*dataset.batch") as info:
        parallel.fit(tf.data.Dataset.from_tensor_slices((x, y)), verbose=0)
    _message(info)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)
    parallel.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(5), verbose=0)  # batched: trains


@requires(tf=True)
def test_a_dataset_tf_distribute_split_is_refused_naming_the_one_to_pass() -> None:
    """What `experimental_distribute_dataset` returns (batches already split over a
    strategy's replicas): refused as what it is, with the check on too and before any
    weight moves - where the feed failed with "'DistributedDataset' object has no
    attribute 'enumerate'", after the check warned that it checked nothing."""
    import warnings

    import tensorflow as tf

    x, y = classification_data(20)
    template = mlp(keras)
    before = template.get_weights()
    parallel = kerasmgpu.parallelize(template, gpus=2, verify=True)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(5)
    split = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).experimental_distribute_dataset(
        dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match=r"Received: x=a DistributedDataset .*already "
                           r"split.* Fix: pass the dataset you gave "
                           r"`experimental_distribute_dataset`") as info:
            parallel.fit(split, verbose=0)
    _message(info)
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)
    parallel.fit(dataset, verbose=0)  # the dataset itself: trains


class _Loader:
    """What a torch DataLoader is to kerasmgpu: batches through `iter()`, a length, no
    index (Keras 3 reads a real one itself; the torch job of test_distributed.py passes
    a real one)."""

    def __init__(self, x, y, batch):
        self.x, self.y, self.batch = x, y, batch

    def __len__(self):
        return -(-len(self.x) // self.batch)

    def __iter__(self):
        for start in range(0, len(self.x), self.batch):
            yield self.x[start:start + self.batch], self.y[start:start + self.batch]


@pytest.mark.parametrize("verify", [False, True])
def test_a_loader_is_refused_with_a_generator_over_it_as_the_fix(verify, recwarn) -> None:
    """Each call refuses an iterable that is neither an iterator nor indexed, before a
    weight moves, naming the fix - a generator over it - and the fix trains as one
    device reading the same generator. With verify=True the refusal comes without a
    "checked nothing" warning."""
    x, y = classification_data(21)
    template = mlp(keras)
    before = [w.copy() for w in template.get_weights()]
    pmodel = kerasmgpu.parallelize(template, gpus=2, verify=verify)
    for call in (pmodel.fit, pmodel.evaluate, pmodel.predict):
        with pytest.raises(TypeError) as info:
            call(_Loader(x, y, 8), verbose=0)
        text = _message(info)
        assert "Received: x=a _Loader: an iterable that is neither an iterator nor indexed" \
            in text and "steps_per_epoch=len(loader)" in text, text
    assert not [w for w in recwarn if "checked nothing" in str(w.message)]
    for a, b in zip(before, template.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The fix, against one device reading the same generator (Keras 3.3 on JAX reads
    # a generator's epochs otherwise than arrays' on one device too).
    one, fixed = mlp(keras), mlp(keras)
    for model_, parallel in ((one, False), (fixed, True)):
        loader = _Loader(x, y, 8)
        fit = (kerasmgpu.parallelize(model_, gpus=2, verify=verify) if parallel
               else model_).fit
        fit((batch for _ in itertools.count() for batch in loader),
            steps_per_epoch=len(loader), epochs=2, verbose=0)
    assert_weights_close(fixed, one)
    assert not np.allclose(one.get_weights()[0], before[0], atol=1e-3)  # it trained
