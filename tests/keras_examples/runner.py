"""Run Keras example scripts one after another in this interpreter, as `python script.py`.

    python runner.py SPEC.json RESULTS.jsonl

SPEC.json: {"keras": "keras" | "tf_keras", "keras23": bool, "scripts": [{"name", "path",
"workdir", "argv", "quality": {metric: expression}}, ...]}. Each script runs with
`runpy.run_path(path, run_name="__main__")` in its own working folder; then every quality
expression is evaluated in the script's namespace (its own variables: `score[1]`,
`model.history.history["val_loss"][-1]`). One JSON line per script goes to RESULTS.jsonl
as soon as it ends: {"name", "ok", "seconds", "quality", "error"}.

What this changes around the scripts - nothing inside them:
* the data sets they download come from fake_data.py (each `keras.datasets.X.load_data`
  is replaced wherever it was imported; files fetched with `get_file` are put in the
  Keras cache under $HOME/.keras and $KERAS_HOME beforehand by the caller);
* `keras.utils.plot_model` draws nothing (it needs pydot and the GraphViz binary, which
  the test envs do not have; it only writes a PNG);
* `fit` keeps the History it returns for the quality expressions (tf_keras's predict and
  evaluate replace `model.history`); it trains as before;
* between scripts: Keras's session is cleared, the image data format set back to
  channels_last, figures closed, and Python's and NumPy's generators seeded.

One interpreter for all of them: starting TensorFlow, JAX or PyTorch takes 5 - 13 s on
the 2-core CI machine, more than most of these runs take to train.
"""

from __future__ import annotations

import importlib
import json
import os
import random
import runpy
import sys
import time
import traceback
from typing import Any, Callable, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))


def _replace_everywhere(original: Any, replacement: Any, name: str) -> None:
    """Point every loaded module's `name` that is `original` to `replacement`."""
    for module in list(sys.modules.values()):
        try:
            if getattr(module, name, None) is original:
                setattr(module, name, replacement)
        except Exception:  # lazy modules may fail on attribute access; they hold nothing yet
            continue


def patch_keras(package: str) -> None:
    sys.path.insert(0, HERE)
    import fake_data

    for dataset, loader in fake_data.LOADERS.items():
        module = importlib.import_module(f"{package}.datasets.{dataset}")
        original = module.load_data
        _replace_everywhere(original, loader, "load_data")
        # The module that defines it too, for API modules imported later.
        sys.modules[original.__module__].load_data = loader

    utils = importlib.import_module(f"{package}.utils")
    original_plot = getattr(utils, "plot_model", None)
    if original_plot is not None:
        def plot_model(model: Any, to_file: str = "model.png", *args: Any, **kwargs: Any) -> None:
            print(f"[harness] plot_model({model.name!r}, to_file={to_file!r}): not drawn")

        _replace_everywhere(original_plot, plot_model, "plot_model")
        sys.modules[original_plot.__module__].plot_model = plot_model


# id(model) -> the History its last fit returned. `model.history` will not do: tf_keras's
# predict and evaluate replace it with their own.
_FITS: Dict[int, Any] = {}


def record_fits(keras: Any) -> None:
    """Keep what each model's fit (and Keras 2.3's fit_generator) returns; nothing else."""
    model_class = keras.Model if hasattr(keras, "Model") else keras.models.Model
    for name in ("fit", "fit_generator"):
        original = getattr(model_class, name, None)
        if original is None:
            continue

        def fit(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            result = _original(self, *args, **kwargs)
            _FITS[id(self)] = result
            return result

        setattr(model_class, name, fit)


def history(model: Any) -> Dict[str, List[float]]:
    """The per-epoch figures of `model`'s last fit."""
    return _FITS[id(model)].history


def _reset(keras: Any) -> None:
    backend = keras.backend
    try:
        backend.clear_session()
    except Exception:
        pass
    setter = getattr(backend, "set_image_data_format", None)
    if setter is None:
        setter = keras.config.set_image_data_format
    setter("channels_last")
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def _seed(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)


def char_accuracy(decoded: List[str], targets: List[str]) -> float:
    """The share of target characters a decoder got right, position by position."""
    right = sum(a == b for d, t in zip(decoded, targets) for a, b in zip(d, t))
    return right / sum(len(t) for t in targets)


# What quality expressions may use besides the script's own names.
HELPERS = {"char_accuracy": char_accuracy, "history": history}


def _number(value: Any) -> float:
    import numpy as np

    return float(np.asarray(value, dtype=np.float64))


def run_one(script: Dict[str, Any], keras: Any) -> Dict[str, Any]:
    result: Dict[str, Any] = {"name": script["name"], "ok": False, "quality": {},
                              "error": None}
    cwd, argv = os.getcwd(), sys.argv
    started, cpu = time.perf_counter(), time.process_time()
    try:
        os.chdir(script["workdir"])
        sys.argv = [script["path"]] + list(script.get("argv", []))
        _seed(script.get("seed", 0))
        namespace = runpy.run_path(script["path"], run_name="__main__")
        result["seconds_script"] = round(time.perf_counter() - started, 1)
        for metric, expression in script["quality"].items():
            result["quality"][metric] = _number(eval(expression, namespace, dict(HELPERS)))
        result["ok"] = True
    except SystemExit as exc:
        result["error"] = f"SystemExit({exc.code!r})"
        result["ok"] = exc.code in (None, 0)
    except BaseException as exc:
        frames = traceback.format_tb(exc.__traceback__)[-6:]
        message = str(exc)
        if len(message) > 1500:  # some carry whole arrays
            message = message[:700] + " [...] " + message[-700:]
        result["error"] = "".join(frames) + f"{type(exc).__name__}: {message}"
    finally:
        result["seconds"] = round(time.perf_counter() - started, 1)
        result["cpu_seconds"] = round(time.process_time() - cpu, 1)
        os.chdir(cwd)
        sys.argv = argv
        _reset(keras)
    return result


def main(argv: List[str]) -> int:
    spec_path, results_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("MPLBACKEND", "Agg")
    if spec.get("keras23"):
        import kerasmgpu.keras23  # noqa: F401  - the first line of a Keras 2.3 script
    keras = importlib.import_module(spec["keras"])
    patch_keras(spec["keras"])
    record_fits(keras)
    write: Callable[[Dict[str, Any]], None]
    with open(results_path, "a") as out:
        def write(record: Dict[str, Any]) -> None:
            out.write(json.dumps(record) + "\n")
            out.flush()

        for script in spec["scripts"]:
            print(f"[harness] === {script['name']} ===", flush=True)
            record = run_one(script, keras)
            print(f"[harness] {script['name']}: {'ok' if record['ok'] else 'FAILED'} in "
                  f"{record['seconds']} s ({record['cpu_seconds']} s CPU), "
                  f"{record['quality']}", flush=True)
            write(record)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
