"""`import kerasmgpu` imports no framework and stays fast."""

from __future__ import annotations

import json
import subprocess
import sys

FRAMEWORKS = ("tensorflow", "jax", "torch", "keras", "tf_keras", "numpy")


def _run(code: str, **env: str) -> dict:
    import os

    environ = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environ, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


CODE = f"""
import json, sys, time
t = time.perf_counter()
import kerasmgpu
kerasmgpu.Route, kerasmgpu.KerasLine, kerasmgpu.environment()
elapsed = time.perf_counter() - t
imported = [m for m in {FRAMEWORKS!r} if m in sys.modules]
print(json.dumps(dict(seconds=elapsed, imported=imported)))
"""


def test_import_and_environment_import_no_framework() -> None:
    result = _run(CODE)
    assert result["imported"] == []
    # Generous bound for a shared CI machine; benchmarks/import_time.py measures it.
    assert result["seconds"] < 1.0


def test_virtual_device_request_imports_no_framework() -> None:
    result = _run(CODE, KERASMGPU_VIRTUAL_DEVICES="2")
    assert result["imported"] == []
