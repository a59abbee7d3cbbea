"""How much of real Keras 2.x code runs on modern Keras after one `kerasmgpu migrate`.

The corpus: files of public Keras 2.x projects that use multi_gpu_model, make_parallel or
fit_generator, written by people outside this project (CORPUS below: repository, commit,
path). Their code is not vendored here and nothing is downloaded: pass a folder that holds
each repository's Python files at that commit, as `TREES/<owner>+<name>/<path>`. A whole
repository is migrated, as a user migrates a project, and then each corpus file is tried.

Measured per file, in a fresh interpreter of the target Keras (run this script with it):
* import: the module is imported as a library (not as __main__), its repository root and
  its folder on sys.path, so sibling modules resolve;
* build: every function it defines whose name says it builds a model (model, net, body,
  unet, build, create) and that can be called without arguments is called.
A file passes when both raise nothing, or stop only on what a machine without the
project's data cannot have: a missing data file, a download, a required command-line
argument ("env", counted as passing and listed). Anything else fails, with the exception.

    python benchmarks/migrate_corpus.py TREES --to keras3 [--before] [--json out.json]

`--before` measures the files as the old `kerasmgpu migrate` left them (`--to keras23`);
on tf_keras that also renames `keras` imports to `tf_keras` (what a user had to do by hand).
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
from typing import Dict, List, Tuple

CORPUS: List[Tuple[str, str, str]] = [
    ("qqwweee/keras-yolo3", "e6598d13c703029b2686bc2eb8d5c09badf42992", "train.py"),
    ("qqwweee/keras-yolo3", "e6598d13c703029b2686bc2eb8d5c09badf42992", "yolo.py"),
    ("qqwweee/keras-yolo3", "e6598d13c703029b2686bc2eb8d5c09badf42992", "yolo3/model.py"),
    ("experiencor/keras-yolo3", "768c524f277adbfd26c2f44d73cb1826bbaf2d10", "train.py"),
    ("experiencor/keras-yolo3", "768c524f277adbfd26c2f44d73cb1826bbaf2d10",
     "utils/multi_gpu_model.py"),
    ("experiencor/keras-yolo3", "768c524f277adbfd26c2f44d73cb1826bbaf2d10", "yolo.py"),
    ("fizyr/keras-retinanet", "7ac91dfbbacce77d6d9633fc09e16cd0ee71fd5e",
     "keras_retinanet/bin/train.py"),
    ("fizyr/keras-retinanet", "7ac91dfbbacce77d6d9633fc09e16cd0ee71fd5e",
     "keras_retinanet/callbacks/common.py"),
    ("zhixuhao/unet", "b45af4d458437d8281cc218a07fd4380818ece4a", "main.py"),
    ("zhixuhao/unet", "b45af4d458437d8281cc218a07fd4380818ece4a", "model.py"),
    ("zhixuhao/unet", "b45af4d458437d8281cc218a07fd4380818ece4a", "data.py"),
    ("rossumai/keras-multi-gpu", "07776a8d74a69cd0c96241d74af5756e498eba74",
     "keras_tf_multigpu/kuza55.py"),
    ("rossumai/keras-multi-gpu", "07776a8d74a69cd0c96241d74af5756e498eba74",
     "keras_tf_multigpu/examples/kuza55/cifar10_cnn_multigpu.py"),
    ("rossumai/keras-multi-gpu", "07776a8d74a69cd0c96241d74af5756e498eba74",
     "experiments/keras_tensorflow/kuza55/original_examples/kuza55_blog_example_orig.py"),
    ("kuza55/keras-extras", "416853d2b1711fdfdc23e49e3f1349234e8909e6", "utils/multi_gpu.py"),
    ("kuza55/keras-extras", "416853d2b1711fdfdc23e49e3f1349234e8909e6",
     "examples/mnist_cnn_multi.py"),
    ("yu4u/age-gender-estimation", "6af6148f6eb09bf16e7164490730c71c61c89f3e",
     "age_estimation/train.py"),
    ("yu4u/age-gender-estimation", "6af6148f6eb09bf16e7164490730c71c61c89f3e",
     "age_estimation/model.py"),
    ("dluvizon/deephar", "fbebb148a3b7153f911b86e1a7300aa32c336f31", "deephar/trainer.py"),
    ("dluvizon/deephar", "fbebb148a3b7153f911b86e1a7300aa32c336f31",
     "exp/mpii/train_mpii_singleperson.py"),
    ("jocicmarko/ultrasound-nerve-segmentation", "df9eb77f0ac3b84ae125b6b177ef2e4429818d66",
     "train.py"),
    ("divamgupta/image-segmentation-keras", "f829f75adcc1ba54f3cea1178a272aff8252d7f4",
     "keras_segmentation/train.py"),
    ("PeterDrake/sky", "835af58d48f4f6ac70e1577347c77e14a0209052",
     "pre_fall_2020/train_model.py"),
    ("ZFTurbo/ZF_UNET_224_Pretrained_Model", "cda3edcffb94cbfa0bdc8b778618ca9b0bd03a41",
     "train_infinite_generator.py"),
    ("ZFTurbo/ZF_UNET_224_Pretrained_Model", "cda3edcffb94cbfa0bdc8b778618ca9b0bd03a41",
     "zf_unet_224_model.py"),
    ("foamliu/Colorful-Image-Colorization", "f498f5de1b505b056673ccca09fbb133c9e81ed1",
     "train.py"),
    ("foamliu/Colorful-Image-Colorization", "f498f5de1b505b056673ccca09fbb133c9e81ed1",
     "model.py"),
    ("foamliu/Colorful-Image-Colorization", "f498f5de1b505b056673ccca09fbb133c9e81ed1",
     "utils.py"),
    ("navidstuv/NuClick", "e37e802f52a676f5efdb243acbebb1e41f9e4054", "train.py"),
    ("navidstuv/NuClick", "e37e802f52a676f5efdb243acbebb1e41f9e4054", "models/models.py"),
]

# Command-line arguments a script needs to get past argparse (as its README runs it).
ARGV: Dict[str, List[str]] = {
    "examples/mnist_cnn_multi.py": ["--gpus", "2", "--extras", "{root}"],
}

# Run in the target interpreter for one file: prints one JSON line.
PROBE = r'''
import errno, importlib.util, inspect, json, os, re, sys, traceback
path, root, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
# A module of a package is imported by its dotted name (relative imports resolve); a script
# beside its sibling modules is loaded from its folder, as `python script.py` would.
package = []
folder = os.path.dirname(path)
while os.path.isfile(os.path.join(folder, "__init__.py")):
    package.insert(0, os.path.basename(folder))
    folder = os.path.dirname(folder)
if not package and os.path.dirname(path) != root:
    # a folder without __init__.py: a namespace package from the root, siblings last
    package = os.path.relpath(os.path.dirname(path), root).split(os.sep)
    folder = root
    # siblings importable by bare name, unless one of them would hide the package itself
    # (a regular module found anywhere on the path wins over a namespace package)
    if not os.path.exists(os.path.join(os.path.dirname(path), package[0] + ".py")):
        sys.path.append(os.path.dirname(path))
sys.path[:0] = [folder, root] if package else [os.path.dirname(path), root]
sys.argv = [path] + argv
ENV = (FileNotFoundError, IsADirectoryError, NotADirectoryError, ConnectionError, TimeoutError)
BUILDERS = re.compile(r"model|net|body|unet|build|create", re.I)

def outcome(exc):
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename.startswith(root):
            where = f"{os.path.relpath(frame.filename, root)}:{frame.lineno}"
    text = f"{type(exc).__name__}: {str(exc)[:300]}"
    if isinstance(exc, SystemExit):
        return "env", text, where
    if isinstance(exc, ENV) or (isinstance(exc, OSError) and exc.errno in (errno.ENOENT,)):
        return "env", text, where
    if "urlopen" in str(exc) or "URL fetch failure" in str(exc) or "downloading" in str(exc):
        return "env", text, where
    if isinstance(exc, ModuleNotFoundError) and exc.name and exc.name.split(".")[-1] in (
            "theano", "annothelper", "mpii_tools", "better_exceptions", "compute_overlap"):
        return "env", text, where  # a package beyond Keras, or an unbuilt Cython module
    if "requires PyTorch" in str(exc):
        return "env", text, where  # albumentations' albucore without torch
    if "zero-size array" in str(exc):
        return "env", text, where  # a script training on a data folder that is empty here
    return "fail", text, where

result = {"import": ["ok", "", ""], "build": {}}
try:
    if package:
        name = ".".join(package + [os.path.basename(path)[:-3]])
        module = importlib.import_module(name)
    else:
        name = "corpus_module"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
except BaseException as exc:
    result["import"] = list(outcome(exc))
else:
    for name, obj in list(vars(module).items()):
        if not inspect.isfunction(obj) or obj.__module__ != name:
            continue
        if not BUILDERS.search(name):
            continue
        params = inspect.signature(obj).parameters.values()
        if any(p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in params):
            continue
        try:
            obj()
            result["build"][name] = ["ok", "", ""]
        except BaseException as exc:
            result["build"][name] = list(outcome(exc))
print("PROBE-RESULT " + json.dumps(result))
'''


def _naive_tf_keras_port(text: str) -> str:
    """What a user did by hand before `--to tf_keras`: `keras` imports to `tf_keras`."""
    text = re.sub(r"^(\s*)from keras(\.[\w.]+)? import", r"\1from tf_keras\2 import", text,
                  flags=re.M)
    text = re.sub(r"^(\s*)import keras(\.[\w.]+)?( as (\w+))?\s*$",
                  lambda m: f"{m.group(1)}import tf_keras{m.group(2) or ''} as "
                  f"{m.group(4) or 'keras'}", text, flags=re.M)
    return text


def _migrate(tree: Path, target: str, before: bool) -> Dict[str, int]:
    """One `kerasmgpu migrate --write` over the whole repository; its finding counts."""
    chosen = "keras23" if before else target
    out = subprocess.run([sys.executable, "-m", "kerasmgpu", "migrate", "--to", chosen,
                          "--write", str(tree)], capture_output=True, text=True, timeout=600)
    counts = {s: len(re.findall(rf": {s}: ", out.stdout)) for s in ("ERROR", "WARNING", "INFO")}
    if before and target == "tf_keras":
        for path in tree.rglob("*.py"):
            path.write_text(_naive_tf_keras_port(path.read_text(errors="replace")))
    return counts


def _probe(path: Path, root: Path, timeout: int, argv: List[str]) -> Dict[str, object]:
    # 8 virtual devices stand in for the GPUs the scripts ask multi_gpu_model for.
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore",
               KERASMGPU_VIRTUAL_DEVICES="8")
    try:
        args = json.dumps([a.format(root=root) for a in argv])
        out = subprocess.run([sys.executable, "-c", PROBE, str(path), str(root), args],
                             capture_output=True, text=True, timeout=timeout, env=env,
                             cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return {"import": ["fail", f"timed out after {timeout}s", ""], "build": {}}
    for line in out.stdout.splitlines():
        if line.startswith("PROBE-RESULT "):
            return dict(json.loads(line[len("PROBE-RESULT "):]))
    if out.returncode < 0 or out.returncode == 137:  # killed: the script's own data
        return {"import": ["env", f"killed by signal {-out.returncode} (its data does not "
                           "fit this machine's memory)", ""], "build": {}}
    tail = (out.stderr or out.stdout)[-300:]
    return {"import": ["fail", f"the interpreter died: {tail}", ""], "build": {}}


def _verdict(result: Dict[str, object]) -> str:
    outcomes = [result["import"][0]] + [b[0] for b in result["build"].values()]  # type: ignore
    return "fail" if "fail" in outcomes else ("env" if "env" in outcomes else "ok")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", help="folder with <owner>+<name>/ Python files per repository")
    parser.add_argument("--to", dest="target", required=True, choices=["keras3", "tf_keras"])
    parser.add_argument("--before", action="store_true",
                        help="as the old migrate (--to keras23) left the files")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per file")
    parser.add_argument("--json", help="write the per-file results here")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="migrate-corpus-"))
    rows = []
    try:
        findings: Dict[str, Dict[str, int]] = {}
        for repo in sorted({repo for repo, _, _ in CORPUS}):
            source = Path(args.trees) / repo.replace("/", "+")
            shutil.copytree(source, work / source.name)
            findings[repo] = _migrate(work / source.name, args.target, args.before)
        for repo, commit, path in CORPUS:
            root = work / repo.replace("/", "+")
            result = _probe(root / path, root, args.timeout, ARGV.get(path, []))
            rows.append({"repo": repo, "commit": commit, "path": path,
                         "verdict": _verdict(result), **result})
            print(f"{_verdict(result):4} {repo}/{path}: {result['import'][1]}"
                  f"{' ' + result['import'][2] if result['import'][2] else ''}", flush=True)
            for name, (state, text, where) in result["build"].items():  # type: ignore
                if state != "ok":
                    print(f"       build {name}(): {state} {text} {where}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    passing = sum(1 for row in rows if row["verdict"] != "fail")
    print(f"{passing} of {len(rows)} files import and build "
          f"({sum(1 for r in rows if r['verdict'] == 'env')} of them stop on data/env); "
          f"findings per repository: {json.dumps(findings)}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
