"""Virtual devices: the env variable, the call, and the clear error when it is too late."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from helpers import ON_JAX, ON_TF, requires

import kerasmgpu
from kerasmgpu.env.devices import requested


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("KERASMGPU_VIRTUAL_DEVICES",
                                                                "XLA_FLAGS")}
    environ.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=240)


SHOW = "import kerasmgpu; print('DEVICES', len(kerasmgpu.environment(devices=True).devices))"


def test_requested_count_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="n=0"):
        kerasmgpu.virtual_devices(0)
    with pytest.raises(TypeError, match="n='two'"):
        kerasmgpu.virtual_devices("two")  # type: ignore[arg-type]
    monkeypatch.setattr("kerasmgpu.env.devices._requested", None)
    monkeypatch.setenv("KERASMGPU_VIRTUAL_DEVICES", "x")
    with pytest.raises(TypeError, match="KERASMGPU_VIRTUAL_DEVICES='x'"):
        requested()


@requires(in_process=True)
def test_env_variable_shows_n_devices() -> None:
    out = _python(SHOW, KERASMGPU_VIRTUAL_DEVICES="2")
    assert "DEVICES 2" in out.stdout, out.stderr[-2000:]


@requires(in_process=True)
def test_call_before_the_framework_starts() -> None:
    code = "import kerasmgpu; kerasmgpu.virtual_devices(4); " + SHOW.split("; ", 1)[1]
    out = _python(code)
    assert "DEVICES 4" in out.stdout, out.stderr[-2000:]


@requires(in_process=True)
def test_too_late_is_a_clear_error() -> None:
    if ON_TF:
        start = "import tensorflow as tf; tf.constant(1.0)"
    else:
        start = "import jax; jax.devices()"
    code = f"{start}\nimport kerasmgpu\nkerasmgpu.virtual_devices(2)"
    out = _python(code)
    assert out.returncode != 0
    assert "TooLateError" in out.stderr
    assert "virtual_devices(2) came after" in out.stderr
    assert "KERASMGPU_VIRTUAL_DEVICES=2" in out.stderr


@requires(in_process=True)
def test_single_device_warns_once_and_passes_through() -> None:
    code = (
        "import warnings, kerasmgpu\n"
        "from helpers import keras_module, mlp\n"
        "keras = keras_module()\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    m = mlp(keras); a = kerasmgpu.parallelize(m); b = kerasmgpu.parallelize(mlp(keras))\n"
        "print('SAME', a is m, 'WARNINGS', sum('one device available' in str(x.message) for x in w))\n"
    )
    environ = {"PYTHONPATH": os.path.dirname(__file__)}
    out = _python(code, **environ)
    assert "SAME True WARNINGS 1" in out.stdout, out.stderr[-2000:]
    assert ON_TF or ON_JAX
