"""`import kerasmgpu` imports no framework and stays fast."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.core

FRAMEWORKS = ("tensorflow", "jax", "torch", "keras", "tf_keras", "numpy")


def _run(code: str, **env: str) -> dict:
    import os

    environ = dict(os.environ, **env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=environ, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


CODE = f"""
import json, sys
before = set(sys.modules)
import kerasmgpu
kerasmgpu.Route, kerasmgpu.KerasLine, kerasmgpu.environment()
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
imported = [m for m in {FRAMEWORKS!r} if m in sys.modules]
third_party = sorted(new - set(sys.stdlib_module_names) - {{"kerasmgpu", "_distutils_hack"}})
print(json.dumps(dict(imported=imported, third_party=third_party)))
"""


def test_import_and_environment_import_no_framework() -> None:
    result = _run(CODE)
    assert result["imported"] == []
    # Fast by construction: nothing but the standard library and `packaging` is loaded.
    # The time itself is measured by benchmarks/import_time.py, not asserted here
    # (a timed test on a shared CI machine fails on load, not on a regression).
    assert set(result["third_party"]) <= {"packaging"}, result["third_party"]


def test_virtual_device_request_imports_no_framework() -> None:
    result = _run(CODE, KERASMGPU_VIRTUAL_DEVICES="2")
    assert result["imported"] == []
    assert set(result["third_party"]) <= {"packaging"}, result["third_party"]


CLI_CODE = f"""
import json, sys
before = set(sys.modules)
import kerasmgpu.cli.doctor.facts, kerasmgpu.cli.doctor.checks, kerasmgpu.cli.doctor.report
import kerasmgpu.cli.doctor, kerasmgpu.cli.bench.measure, kerasmgpu.cli.bench.output
import kerasmgpu.cli.bench
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
imported = [m for m in {FRAMEWORKS!r} if m in sys.modules]
third_party = sorted(new - set(sys.stdlib_module_names) - {{"kerasmgpu", "_distutils_hack"}})
print(json.dumps(dict(imported=imported, third_party=third_party)))
"""


def test_doctor_and_bench_modules_import_no_framework() -> None:
    """`kerasmgpu doctor` reports a broken framework, so importing it (every module of
    it) must not import one; bench's modules import theirs only when they run."""
    result = _run(CLI_CODE)
    assert result["imported"] == []
    assert set(result["third_party"]) <= {"packaging"}, result["third_party"]


MIGRATE_CODE = f"""
import json, sys
before = set(sys.modules)
from kerasmgpu.migrate import migrate_source
text = "from keras.utils import multi_gpu_model\\nm = multi_gpu_model(m, gpus=2)\\n"
for target in ("keras3", "tf_keras", "keras23"):
    migrate_source(text, "f.py", target)
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
imported = [m for m in {FRAMEWORKS!r} if m in sys.modules]
# libcst.codemod imports multiprocessing, which names __main__ again as __mp_main__.
third_party = sorted(new - set(sys.stdlib_module_names)
                     - {{"kerasmgpu", "_distutils_hack", "__mp_main__"}})
print(json.dumps(dict(imported=imported, third_party=third_party)))
"""


def test_migrate_imports_no_framework_and_no_numpy() -> None:
    """`kerasmgpu migrate` is a codemod: it runs where only libcst is installed (a
    project's lint or CI env). It once imported numpy through an adapter."""
    pytest.importorskip("libcst")
    result = _run(MIGRATE_CODE)
    assert result["imported"] == []
    assert set(result["third_party"]) <= {"packaging", "libcst", "yaml", "typing_extensions"}, \
        result["third_party"]


LAUNCH_CODE = f"""
import json, sys
before = set(sys.modules)
import kerasmgpu.launch.supervise, kerasmgpu.launch
kerasmgpu.launch.worker_environments(2, "127.0.0.1:29500", base_env={{}})
new = {{m.split(".")[0] for m in set(sys.modules) - before}}
imported = [m for m in {FRAMEWORKS!r} if m in sys.modules]
third_party = sorted(new - set(sys.stdlib_module_names) - {{"kerasmgpu", "_distutils_hack"}})
print(json.dumps(dict(imported=imported, third_party=third_party)))
"""


def test_the_launcher_imports_no_framework() -> None:
    """`kerasmgpu launch` only starts processes: every module of it, and the workers'
    environments, without a framework (the script decides which one it runs)."""
    result = _run(LAUNCH_CODE)
    assert result["imported"] == []
    assert set(result["third_party"]) <= {"packaging"}, result["third_party"]
