"""Detection from metadata and environment variables - no framework imported."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Optional

import pytest
from packaging.version import Version

import kerasmgpu
from kerasmgpu import registry
from kerasmgpu.env import cluster
from kerasmgpu.env import versions as detection
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.routes import Route, check_route_fits, parse_route

pytestmark = pytest.mark.core


def _fake_versions(monkeypatch: pytest.MonkeyPatch, versions: Dict[str, Optional[str]]) -> None:
    def dist_version(name: str) -> Optional[Version]:
        value = versions.get(name)
        return Version(value) if value else None

    monkeypatch.setattr(detection, "dist_version", dist_version)
    monkeypatch.setattr(
        detection, "tensorflow_version",
        lambda: Version(versions["tensorflow"]) if versions.get("tensorflow") else None,
    )


@pytest.mark.parametrize(
    "versions,env,line,route",
    [
        ({"keras": "2.3.1", "tensorflow": "2.15.1"}, {}, KerasLine.LEGACY, Route.MULTI_GPU_MODEL),
        ({"tensorflow": "2.3.0"}, {}, KerasLine.LEGACY, Route.MULTI_GPU_MODEL),
        ({"keras": "2.15.0", "tensorflow": "2.15.1"}, {}, KerasLine.TF_KERAS, Route.MIRRORED),
        ({"tensorflow": "2.5.0"}, {}, KerasLine.TF_KERAS, Route.MIRRORED),
        ({"keras": "3.15.1", "tensorflow": "2.21.0", "tf-keras": "2.21.0"},
         {"TF_USE_LEGACY_KERAS": "1"}, KerasLine.TF_KERAS_LEGACY, Route.MIRRORED),
        ({"keras": "3.15.1", "tensorflow": "2.21.0", "tf-keras": "2.21.0"},
         {"TF_USE_LEGACY_KERAS": "0"}, KerasLine.KERAS_3, Route.MIRRORED),
        ({"keras": "3.15.1", "jax": "0.10.2"}, {"KERAS_BACKEND": "jax"},
         KerasLine.KERAS_3, Route.KERAS_DISTRIBUTION),
        ({"keras": "3.15.1", "torch": "2.13.0"}, {"KERAS_BACKEND": "torch"},
         KerasLine.KERAS_3, Route.TORCH_DDP),
        ({"keras": "3.15.1", "torch": "2.13.0"}, {"KERAS_BACKEND": "TORCH"},
         KerasLine.KERAS_3, Route.TORCH_DDP),
    ],
)
def test_line_and_route(monkeypatch: pytest.MonkeyPatch, tmp_path, versions, env, line, route
                        ) -> None:
    _fake_versions(monkeypatch, versions)
    for key in ("TF_USE_LEGACY_KERAS", "KERAS_BACKEND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))  # no keras.json: default backend
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    registry.reset()  # as in a process started with these variables
    active = registry.active()
    assert active.line is line
    assert active.entry_or_raise().route is route


def test_backend_from_keras_json(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path))
    assert detection.keras_backend_name() == "tensorflow"
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "jax"}))
    assert detection.keras_backend_name() == "jax"
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    assert detection.keras_backend_name() == "torch"


def test_no_keras_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_versions(monkeypatch, {})
    registry.reset()
    assert registry.active().line is KerasLine.NONE
    with pytest.raises(ValueError, match=r"pip install"):
        registry.active().entry_or_raise()


def test_unusable_backend_is_explained() -> None:
    with pytest.raises(ValueError, match="KERAS_BACKEND='numpy'.*tensorflow, jax or torch"):
        registry.lookup(KerasLine.KERAS_3, "numpy")


def test_route_names() -> None:
    assert parse_route("Mirrored") is Route.MIRRORED
    assert parse_route(None) is None
    assert str(Route.TORCH_DDP) == "torch_ddp" and Route("mirrored") is Route.MIRRORED
    with pytest.raises(ValueError) as info:
        parse_route("horovod")
    message = str(info.value)
    assert "route='horovod'" in message and "mirrored" in message and "Fix:" in message
    with pytest.raises(TypeError, match="Received: route=3"):
        parse_route(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'keras_distribution' drives keras 3 with the jax "
                       "backend.*Fix: pass route='mirrored'"):
        check_route_fits(Route.KERAS_DISTRIBUTION, registry.lookup(KerasLine.KERAS_3,
                                                                   "tensorflow"))


def test_environment_is_frozen_and_printable(monkeypatch: pytest.MonkeyPatch) -> None:
    env = kerasmgpu.environment()
    text = str(env)
    assert "Keras line" in text and "route" in text
    # The test session's virtual devices wrote XLA_FLAGS (JAX's device count) on every
    # backend; it is listed where it applies only.
    assert "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    assert ("XLA_FLAGS" in env.variables) is (env.backend == "jax")
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.backend = "x"  # type: ignore[misc]
    monkeypatch.setenv(cluster.PROCESS_INDEX_ENV, "1")
    monkeypatch.setenv(cluster.PROCESS_COUNT_ENV, "2")
    cluster.reset()  # as in a process started with them
    assert kerasmgpu.process_index() == 1 and kerasmgpu.process_count() == 2
    assert not kerasmgpu.is_chief()


def test_releases_outside_the_verified_ranges_are_named(monkeypatch) -> None:
    monkeypatch.delenv(detection.UNVERIFIED_OK_ENV, raising=False)
    unsupported = registry.unsupported_version
    assert "needs >= 2.12" in unsupported(KerasLine.TF_KERAS, Version("2.11.1"))
    assert unsupported(KerasLine.TF_KERAS, Version("2.12.0")) is None
    assert unsupported(KerasLine.TF_KERAS, Version("2.15.1")) is None
    assert "needs >= 3.3" in unsupported(KerasLine.KERAS_3, Version("3.2.1"), "jax")
    assert unsupported(KerasLine.KERAS_3, Version("3.3.3"), "jax") is None
    # Keras 3 on TensorFlow: wrong under MirroredStrategy before 3.10 (compat/README.md).
    assert "needs >= 3.10" in unsupported(KerasLine.KERAS_3, Version("3.8.0"), "tensorflow")
    assert unsupported(KerasLine.KERAS_3, Version("3.15.1"), "tensorflow") is None
    assert "verified below 3.16" in unsupported(KerasLine.KERAS_3, Version("3.16.0"), "jax")
    assert unsupported(KerasLine.KERAS_3, Version("3.15.2rc1"), "jax") is None
    assert unsupported(KerasLine.LEGACY, Version("2.3.1")) is None
    monkeypatch.setenv(detection.UNVERIFIED_OK_ENV, "1")
    assert unsupported(KerasLine.KERAS_3, Version("3.16.0"), "jax") is None
    assert "needs >= 3.3" in unsupported(KerasLine.KERAS_3, Version("3.2.1"), "jax")
