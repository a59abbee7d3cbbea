"""Keras internals in one place: a moved internal or an unverified release is an error.

kerasmgpu refuses to guess where its hooks go: a Keras release outside the verified
range, or an internal that is missing or has another shape, stops parallelize() with an
error naming the release and the fix - never different numbers.
"""

from __future__ import annotations

import pytest
from helpers import IN_PROCESS, LINE, ON_LEGACY, keras_module, mlp, requires
from packaging.version import Version

import kerasmgpu
from kerasmgpu import adapters, registry
from kerasmgpu.env import versions
from kerasmgpu.env.versions import KerasLine

if IN_PROCESS:
    keras = keras_module()


def _pretend_release(monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    real = versions.detect_keras_line

    def detect():
        line, _ = real()
        return line, Version(version)

    monkeypatch.setattr(versions, "detect_keras_line", detect)
    registry.reset()  # the active Keras is detected once per process: pretend anew


def _beyond() -> str:
    span = registry.verified_range(LINE)
    assert span is not None
    return f"{span[1].major}.{span[1].minor}.0"


@pytest.mark.core
@requires(in_process=True)
def test_release_above_the_verified_range_is_refused(monkeypatch) -> None:
    model = mlp(keras)
    monkeypatch.delenv(versions.UNVERIFIED_OK_ENV, raising=False)
    _pretend_release(monkeypatch, _beyond())
    with pytest.raises(ValueError) as info:
        kerasmgpu.parallelize(model, gpus=2)
    text = str(info.value)
    assert _beyond() in text and "verified below" in text and "Fix:" in text
    assert "pip install" in text
    assert "_kerasmgpu" not in model.__dict__
    # The maintainer's canary opts in; the hooks are then checked instead.
    monkeypatch.setenv(versions.UNVERIFIED_OK_ENV, "1")
    pmodel = kerasmgpu.parallelize(model, gpus=2)
    assert kerasmgpu.route_for(pmodel) is not None


@pytest.mark.core
@requires(in_process=True)
def test_release_below_the_floor_is_refused(monkeypatch) -> None:
    span = registry.verified_range(LINE)
    assert span is not None
    older = f"{span[0].major}.{max(span[0].minor - 1, 0)}.0"
    if Version(older) >= span[0]:
        older = f"{span[0].major - 1}.99.0"
    _pretend_release(monkeypatch, older)
    with pytest.raises(ValueError, match=f"needs >= {span[0]}"):
        kerasmgpu.parallelize(mlp(keras), gpus=2)


def _compile_then(monkeypatch: pytest.MonkeyPatch, model, change) -> None:
    """Every compile of this model class leaves what a later Keras release might."""
    original = type(model).compile

    def compile(self, *args, **kwargs):
        original(self, *args, **kwargs)
        change(self)

    monkeypatch.setattr(type(model), "compile", compile)


@pytest.mark.core
@requires(lines=(KerasLine.KERAS_3,), in_process=True)
def test_a_missing_keras3_internal_is_named(monkeypatch) -> None:
    model = mlp(keras)
    _compile_then(monkeypatch, model, lambda m: setattr(m, "_loss_tracker", None))
    # The compiled model itself too: JAX trains it in place, compiling nothing again.
    model._loss_tracker = None
    with pytest.raises(adapters.InternalsChanged) as info:
        kerasmgpu.parallelize(model, gpus=2)
    text = str(info.value)
    assert "_loss_tracker" in text and keras.__version__ in text
    assert "Fix: install a verified release" in text and "pip install" in text


@pytest.mark.core
@requires(lines=(KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY), in_process=True)
def test_a_reshaped_tfkeras_internal_is_named(monkeypatch) -> None:
    model = mlp(keras)
    container = type(model.compiled_loss)

    def drop_tracker(m):  # a LossesContainer whose loss tracker moved elsewhere
        for name in ("_total_loss_mean", "_loss_metric"):
            m.compiled_loss.__dict__.pop(name, None)

    _compile_then(monkeypatch, model, drop_tracker)
    monkeypatch.setattr(container, "_total_loss_mean", None, raising=False)
    with pytest.raises(adapters.InternalsChanged, match="no loss tracker") as info:
        kerasmgpu.parallelize(model, gpus=2)
    assert "Fix: install a verified release" in str(info.value)


@requires(legacy=True)
def test_legacy_release_range_is_keras_231() -> None:
    assert ON_LEGACY
    assert registry.unsupported_version(KerasLine.LEGACY, Version("2.3.1")) is None
    assert "needs >= 2.3.1" in registry.unsupported_version(KerasLine.LEGACY, Version("2.2.4"))
