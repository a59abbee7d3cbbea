"""Issue 29's bar: do real Keras 2.x files still TRAIN after one `kerasmgpu migrate --write`?

migrate_corpus.py imports files and builds their models; this sibling goes one step
further. For each corpus file (CORPUS below: repository, commit, path, and the calls that
build its models, as the project's README or `__main__` makes them) it imports the module
in a fresh interpreter of the Keras being measured, makes the models, and trains each one
step on synthetic data of the right shapes: inputs from `model.inputs`' shapes (batch 2,
unknown dimensions 8, integer inputs 0/1), targets from the outputs' shapes (integer
labels for a `sparse` loss); a model the file compiled trains with its own loss and
optimizer, one it left uncompiled is compiled with SGD and mse. A GAN class trains through
its own `train` (two iterations of batch 32, wgan_gp's fixed size, on synthetic MNIST images, the dataset loaders
patched, its image sampling skipped); its discriminator must change its weights there, as it does on Keras 2.3.1.

Per file the verdict is one of
* trains: every model trained its step (and a GAN's discriminator changed);
* marked: it stopped at a line that the migrate report marks ERROR or WARNING (the line of
  the deepest frame in the project's code; --write's report cites the written file's lines);
* unmarked: it stopped anywhere else, or a discriminator silently did not train.

    # Keras 2.3.1, the files as written (keras23 tox env: PYTHONPATH=compat/keras23:.)
    python benchmarks/migrate_train.py TREES --as-written
    # after one `migrate --to keras3 --write` (Keras 3.15, any backend)
    python benchmarks/migrate_train.py TREES --to keras3
    # after one `migrate --to tf_keras --write` (TF_USE_LEGACY_KERAS=1, tf_keras 2.21)
    python benchmarks/migrate_train.py TREES --to tf_keras

TREES holds each repository's files at its commit as `TREES/<owner>+<name>/`; nothing is
vendored or downloaded here (migrate_corpus.py's convention).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Set, Tuple

# repository, commit, path, calls (expressions in the module's namespace; a `gan:` prefix
# makes an object whose `train` runs and whose `discriminator`/`critic` must learn).
# Each text classifier's main.py: the model compiled with Adam and binary cross-entropy.
TEXT = "compiled({}.get_model(), 'adam', 'binary_crossentropy', metrics=['accuracy'])"
# Command-line arguments a script needs (as its README runs it).
ARGV: Dict[str, List[str]] = {"examples/mnist_cnn_multi.py": ["--gpus", "2", "--extras", "{root}"]}
# Packages beyond Keras that a file imports and the measured calls never use.
STUBS = ["skimage", "skimage.transform"]

CORPUS: List[Tuple[str, str, str, List[str]]] = [
    ("eriklindernoren/Keras-GAN", "2ccd7cd4ec46a5d2e7782e57050cfc437e995e70", "gan/gan.py",
     ["gan:GAN():discriminator:sample_interval"]),
    ("eriklindernoren/Keras-GAN", "cf65784f7297dca491436112b9a5689ecd7533ec", "cgan/cgan.py",
     ["gan:CGAN():discriminator:sample_interval"]),
    ("eriklindernoren/Keras-GAN", "62ec627689d42f3e6b874cad3c17daa313f582b4",
     "wgan_gp/wgan_gp.py", ["gan:WGANGP():critic:sample_interval"]),
    ("titu1994/DenseNet", "60b18584caf697fc0f78257c08509a0f020098ff", "densenet.py",
     ["DenseNet((32, 32, 3), depth=10, nb_dense_block=3, growth_rate=4, weights=None, "
      "classes=10)",
      "DenseNetFCN((32, 32, 3), nb_dense_block=2, growth_rate=4, nb_layers_per_block=2, "
      "weights=None, classes=3)"]),
    ("kobiso/CBAM-keras", "796ae9ea31253d87f46ac4908e94ad5d799fbdd5", "models/resnet_v1.py",
     ["resnet_v1((32, 32, 3), 8, attention_module='cbam_block')",
      "resnet_v1((32, 32, 3), 8, attention_module='se_block')"]),
    ("kobiso/CBAM-keras", "796ae9ea31253d87f46ac4908e94ad5d799fbdd5", "models/resnet_v2.py",
     ["resnet_v2((32, 32, 3), 11, attention_module='cbam_block')"]),
    ("kobiso/CBAM-keras", "796ae9ea31253d87f46ac4908e94ad5d799fbdd5", "models/resnext.py",
     ["ResNext((32, 32, 3), depth=11, cardinality=2, width=2, weights=None, classes=10, "
      "attention_module='cbam_block')"]),
    ("kobiso/CBAM-keras", "796ae9ea31253d87f46ac4908e94ad5d799fbdd5", "models/densenet.py",
     ["DenseNet((32, 32, 3), depth=10, nb_dense_block=3, growth_rate=4, weights=None, "
      "classes=10, attention_module='cbam_block')"]),
    ("aurora95/Keras-FCN", "35afe12e514a3bf5e56bc90e69d5b329ce9ae68d", "models.py",
     ["FCN_Vgg16_32s(input_shape=(64, 64, 3), classes=3)",
      "AtrousFCN_Resnet50_16s(input_shape=(64, 64, 3), classes=3)"]),
    ("titu1994/LSTM-FCN", "0f258c740c4371c7ab50dea2bb5ce0d30c8576f2",
     "all_datasets_training.py",
     ["generate_lstmfcn(24, 3)", "generate_alstmfcn(24, 3)"]),
    ("ShawnyXiao/TextClassification-Keras", "a447bd9b0561a9364482e0e77eee9214d97d9887",
     "model/TextCNN/text_cnn.py", [TEXT.format("TextCNN(40, 50, 8)")]),
    ("ShawnyXiao/TextClassification-Keras", "a447bd9b0561a9364482e0e77eee9214d97d9887",
     "model/FastText/fast_text.py", [TEXT.format("FastText(40, 50, 8)")]),
    ("ShawnyXiao/TextClassification-Keras", "a447bd9b0561a9364482e0e77eee9214d97d9887",
     "model/RCNN/rcnn.py", [TEXT.format("RCNN(40, 50, 8)")]),
    ("ShawnyXiao/TextClassification-Keras", "a447bd9b0561a9364482e0e77eee9214d97d9887",
     "model/TextAttBiRNN/text_att_birnn.py", [TEXT.format("TextAttBiRNN(40, 50, 8)")]),
    ("ShawnyXiao/TextClassification-Keras", "a447bd9b0561a9364482e0e77eee9214d97d9887",
     "model/HAN/han.py", [TEXT.format("HAN(4, 10, 50, 8)")]),
    ("chen0040/keras-recommender", "8d3f1b2aedfd89882190c3cd61e0f3efe6a05ecf",
     "keras_recommender/library/cf.py",
     [f"with_attributes({name}(), max_user_id=5, max_item_id=5, max_date=5).create_model()"
      for name in ("CollaborativeFilteringV1", "CollaborativeFilteringV2",
                   "CollaborativeFilteringWithTemporalInformation")]),
    # a script: importing it trains (12 epochs of make_parallel on 2 virtual devices)
    ("kuza55/keras-extras", "416853d2b1711fdfdc23e49e3f1349234e8909e6",
     "examples/mnist_cnn_multi.py", []),
    ("qjadud1994/CRNN-Keras", "58f57507fd0f05d12a6c2123dba7049c7210289b", "Model.py",
     ["compiled_ctc(get_Model(training=True))"]),
    ("qjadud1994/CRNN-Keras", "58f57507fd0f05d12a6c2123dba7049c7210289b", "Model_GRU.py",
     ["compiled_ctc(get_Model(training=True))"]),
]

PROBE = r'''
import importlib.util, json, os, sys, traceback
import numpy as np
import types
path, root, calls, stubs, argv = sys.argv[1:3] + [json.loads(a) for a in sys.argv[3:6]]
try:  # a plotting style older matplotlib had ('seaborn-paper'): nothing to do with Keras
    import matplotlib.style
    matplotlib.style.use = lambda *args, **kwargs: None
except ImportError:
    pass
sys.argv = [path] + argv
for stub in stubs:
    sys.modules[stub] = types.ModuleType(stub)
    sys.modules[stub].__getattr__ = lambda name: None
sys.path[:0] = [os.path.dirname(path), root]
rng = np.random.RandomState(0)

def synthetic_mnist():
    x = rng.randint(0, 256, (16, 28, 28)).astype("uint8")
    y = rng.randint(0, 10, (16,)).astype("uint8")
    return (x, y), (x[:4], y[:4])

for package in ("keras", "tf_keras"):  # the datasets a GAN's train() loads
    try:
        datasets = importlib.import_module(package + ".datasets.mnist")
        datasets.load_data = synthetic_mnist
    except Exception:
        pass

def shape_of(tensor):
    shape = tensor.shape
    return list(shape.as_list() if hasattr(shape, "as_list") else shape)

def synthetic(shape, dtype, label=False):
    shape = [2] + [8 if d is None else int(d) for d in shape[1:]]
    if label or "int" in str(dtype):
        return rng.randint(0, 2, shape).astype("int32")
    return rng.uniform(0, 1, shape).astype("float32")

def train_step(model):
    if getattr(model, "optimizer", None) is None:
        model.compile(optimizer="sgd", loss="mse")
    inputs = [synthetic(shape_of(t), getattr(t, "dtype", "float32")) for t in model.inputs]
    sparse = "sparse" in repr(getattr(model, "loss", ""))
    targets = []
    for t in model.outputs:
        shape = shape_of(t)
        targets.append(synthetic(shape[:-1] + [1], "int32", True) if sparse
                       else synthetic(shape, "float32"))
    one = lambda arrays: arrays[0] if len(arrays) == 1 else arrays  # noqa: E731
    model.train_on_batch(one(inputs), one(targets))

def compiled(model, *args, **kwargs):
    model.compile(*args, **kwargs)
    return model

def with_attributes(obj, **values):
    for name, value in values.items():
        setattr(obj, name, value)
    return obj

def compiled_ctc(models):
    # CRNN-Keras' training.py: the CTC loss is the model's output
    model = models
    model.compile(loss={"ctc": lambda y_true, y_pred: y_pred}, optimizer="adadelta")
    return model

def weights_of(model):
    return [np.array(w) for w in model.get_weights()]

def where(exc):
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.realpath(f.filename).startswith(os.path.realpath(root))]
    return [[os.path.relpath(f.filename, root), f.lineno] for f in frames]

result = {"stage": "import", "error": "", "frames": [], "notes": []}
try:
    spec = importlib.util.spec_from_file_location("corpus_module", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["corpus_module"] = module
    spec.loader.exec_module(module)
    namespace = dict(vars(module), compiled_ctc=compiled_ctc, compiled=compiled,
                     with_attributes=with_attributes)
    for call in calls:
        result["stage"] = call
        if call.startswith("gan:"):
            _, make, attr, interval = call.split(":")
            obj = eval(make, namespace)
            for plot in ("sample_images", "save_imgs"):  # figures only (numpy 2 refuses
                if hasattr(obj, plot):                   # cgan's "%d" % array([d]))
                    setattr(obj, plot, lambda *args, **kwargs: None)
            d = getattr(obj, attr)
            before = weights_of(d)
            exec("obj." + "train(epochs=2, batch_size=32, %s=10**9)" % interval,
                 dict(namespace, obj=obj))
            after = weights_of(d)
            if all(np.array_equal(a, b) for a, b in zip(before, after)):
                raise AssertionError(f"the {attr} did not train (its weights are unchanged)")
            result["notes"].append(f"{attr} trains")
        else:
            train_step(eval(call, namespace))
    result["stage"] = "done"
except BaseException as exc:
    text = str(exc)  # TensorFlow's "in user code:" puts the reason last
    text = text if len(text) < 400 else text[:150] + " ... " + text[-250:]
    result["error"] = f"{type(exc).__name__}: {text}"
    result["frames"] = where(exc)
print("PROBE-RESULT " + json.dumps(result))
'''

FINDING = re.compile(r"^(?P<path>.+?):(?P<line>\d+):\d+: (?P<severity>ERROR|WARNING|INFO): ")


def _migrate(tree: Path, target: str) -> Dict[str, Set[int]]:
    """One `kerasmgpu migrate --write` over the repository: its ERROR/WARNING lines."""
    out = subprocess.run([sys.executable, "-m", "kerasmgpu", "migrate", "--to", target,
                          "--write", str(tree)], capture_output=True, text=True, timeout=900)
    marked: Dict[str, Set[int]] = {}
    for line in out.stdout.splitlines():
        found = FINDING.match(line)
        if found and found["severity"] != "INFO":
            rel = os.path.relpath(found["path"], tree)
            marked.setdefault(rel, set()).add(int(found["line"]))
    return marked


def _probe(path: Path, root: Path, calls: List[str], argv: List[str],
           timeout: int) -> Dict[str, object]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
               MPLBACKEND="Agg", KERASMGPU_VIRTUAL_DEVICES="8")
    cwd = tempfile.mkdtemp(prefix="migrate-train-cwd-")
    os.makedirs(os.path.join(cwd, "images"))  # where the GANs save their samples
    try:
        out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(root),
                              json.dumps(calls), json.dumps(STUBS),
                              json.dumps([a.format(root=root) for a in argv])], capture_output=True,
                             text=True, timeout=timeout, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return {"stage": "timeout", "error": f"timed out after {timeout}s", "frames": []}
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    for line in out.stdout.splitlines():
        if line.startswith("PROBE-RESULT "):
            return dict(json.loads(line[len("PROBE-RESULT "):]))
    return {"stage": "died", "error": (out.stderr or out.stdout)[-300:], "frames": []}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", help="folder with <owner>+<name>/ trees per repository")
    parser.add_argument("--to", dest="target", choices=["keras3", "tf_keras"])
    parser.add_argument("--as-written", action="store_true",
                        help="no migrate: the files as written (run it with Keras 2.3.1)")
    parser.add_argument("--only", help="substrings (comma-separated) of the paths to measure")
    parser.add_argument("--timeout", type=int, default=400, help="seconds per file")
    parser.add_argument("--json", help="write the per-file results here")
    args = parser.parse_args()
    if not args.as_written and not args.target:
        parser.error("give --to keras3, --to tf_keras or --as-written")
    wanted = args.only.split(",") if args.only else [""]
    corpus = [row for row in CORPUS if any(w in row[0] + "/" + row[2] for w in wanted)]
    work = Path(tempfile.mkdtemp(prefix="migrate-train-"))
    rows = []
    try:
        marks: Dict[str, Dict[str, Set[int]]] = {}
        for repo in sorted({row[0] for row in corpus}):
            source = Path(args.trees) / repo.replace("/", "+")
            shutil.copytree(source, work / source.name)
            marks[repo] = {} if args.as_written else _migrate(work / source.name, args.target)
        for repo, commit, path, calls in corpus:
            root = work / repo.replace("/", "+")
            result = _probe(root / path, root, calls, ARGV.get(path, []), args.timeout)
            verdict = "trains"
            if result["stage"] != "done":
                verdict = "unmarked"
                frames = result["frames"]
                if frames:  # the deepest frame in the project's code
                    # --write's report cites the lines of the file it wrote
                    rel, line = frames[-1]  # type: ignore[index]
                    if line in marks[repo].get(rel, set()):
                        verdict = "marked"
                    result["at"] = f"{rel}:{line}"
            rows.append({"repo": repo, "commit": commit, "path": path, "verdict": verdict,
                         "marked_lines": sorted(marks[repo].get(path, set())), **result})
            print(f"{verdict:8} {repo}/{path}: {result['stage']} {result['error']} "
                  f"{result.get('at', '')} {' '.join(result.get('notes', []))}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts = {v: sum(1 for r in rows if r["verdict"] == v)
              for v in ("trains", "marked", "unmarked")}
    print(f"{len(rows)} files: {counts['trains']} train, {counts['marked']} stop at a marked "
          f"line, {counts['unmarked']} stop with nothing said there")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
