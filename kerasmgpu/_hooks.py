"""Run code right after a framework finishes importing, before it runs anything.

Some engines must be configured before their runtime starts: TensorFlow's logical CPU
devices and its multi-worker collectives ("Collective ops must be configured at program
startup"), JAX's host device count and `jax.distributed.initialize`. `import kerasmgpu`
must not import them, so it registers a callback here and the callback runs when the
user's own `import tensorflow` / `import jax` / `import torch` completes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from typing import Any, Callable, Dict, List, Optional

_lock = threading.Lock()
_callbacks: Dict[str, List[Callable[[], None]]] = {}
_finder: Optional[importlib.abc.MetaPathFinder] = None


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Any, target: Optional[types.ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname not in _callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                def exec_module(
                    module: types.ModuleType,
                    name: str = fullname,
                    original: Callable[[types.ModuleType], None] = spec.loader.exec_module,
                ) -> None:
                    original(module)
                    _run(name)

                spec.loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec
        return None


def _run(name: str) -> None:
    with _lock:
        pending = _callbacks.pop(name, [])
    for callback in pending:
        callback()


def after_import(name: str, callback: Callable[[], None]) -> None:
    """Call `callback` once `name` is imported (now, if it already is)."""
    global _finder
    if name in sys.modules:
        callback()
        return
    with _lock:
        _callbacks.setdefault(name, []).append(callback)
        if _finder is None:
            _finder = _AfterImport()
            sys.meta_path.insert(0, _finder)
