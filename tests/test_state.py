"""The template holds the whole training state; several parallel models of it agree.

After fit, saving the template and loading it resumes where the parallel model stopped
(iterations and optimizer slots included), and a second parallelize() of one template
keeps both parallel models correct: each takes the template's state when the other one
has written it since.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import (
    IN_PROCESS,
    LINE,
    REPLICAS,
    assert_weights_close,
    classification_data,
    keras_module,
    mlp,
    requires,
)

import kerasmgpu
from kerasmgpu.env.versions import KerasLine

pytestmark = requires(in_process=True)
if IN_PROCESS:
    keras = keras_module()
X, Y = classification_data(203)
SUFFIX = ".keras" if LINE is KerasLine.KERAS_3 else ".h5"


def _adam_pair():
    return (mlp(keras, optimizer=keras.optimizers.Adam(0.01)),
            mlp(keras, optimizer=keras.optimizers.Adam(0.01)))


def _optimizer_state(model):
    variables = model.optimizer.variables
    variables = variables() if callable(variables) else variables
    return [np.asarray(v) for v in variables]


@pytest.mark.core
def test_saved_template_resumes_with_the_optimizer_state(tmp_path) -> None:
    single, template = _adam_pair()
    pmodel = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    single.fit(X, Y, batch_size=40, epochs=2, shuffle=False, verbose=0)
    pmodel.fit(X, Y, batch_size=40, epochs=2, shuffle=False, verbose=0)
    path = str(tmp_path / f"template{SUFFIX}")
    template.save(path)
    loaded = keras.models.load_model(path)
    assert int(np.asarray(loaded.optimizer.iterations)) == int(
        np.asarray(single.optimizer.iterations)) == 12
    expected, got = _optimizer_state(single), _optimizer_state(loaded)
    assert len(expected) == len(got) > 2  # iterations, then the Adam moments
    for a, b in zip(expected, got):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Training on from the file is training on from where the parallel model stopped.
    single.fit(X, Y, batch_size=40, epochs=1, shuffle=False, verbose=0)
    loaded.fit(X, Y, batch_size=40, epochs=1, shuffle=False, verbose=0)
    assert_weights_close(single, loaded)


@pytest.mark.core
def test_two_parallel_models_of_one_template_stay_correct() -> None:
    single = mlp(keras, optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    template = mlp(keras, optimizer=keras.optimizers.SGD(0.05, momentum=0.9))
    first = kerasmgpu.parallelize(template, gpus=2)
    second = kerasmgpu.parallelize(template, gpus=REPLICAS[-1])
    fit = dict(batch_size=40, epochs=1, shuffle=False, verbose=0)
    for pmodel in (first, second, first):
        single.fit(X, Y, **fit)
        pmodel.fit(X, Y, **fit)  # starts from what the other one left in the template
        assert_weights_close(single, template)
        assert_weights_close(single, pmodel)
    np.testing.assert_allclose(single.evaluate(X, Y, verbose=0),
                               second.evaluate(X, Y, verbose=0), rtol=1e-5)
