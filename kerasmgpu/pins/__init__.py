"""The releases kerasmgpu is tested on, as pin files for a project's own test matrix.

Every env of kerasmgpu's own tox matrix (compat/README.md) installs `<env>.in` - the
Keras line's top-level packages, e.g. `keras==3.15.1` and `jax[cpu]==0.10.2` - with
`<env>.txt` as constraints: every package of the env pinned, as CI installed it. Those
files ship here, identical to compat/constraints/ (tests/test_pins.py keeps them so), so
that a team moving a Keras 2.3 project can run its own tests on Keras 2.3 and on the
lines it migrates to, on the same releases kerasmgpu was verified with.

`kerasmgpu pins` (kerasmgpu/cli/pins.py) lists them, prints where one lies, and writes
them - with the tox.ini lines that use them - into a project.

Written for a project, two things change: the `-r` lines (`_common.in`, kerasmgpu's own
test tools; `_examples.in`, what Keras's examples import) leave the requirements, and a
local version label leaves a pin
(`torch==2.13.0+cpu` becomes `torch==2.13.0`, which the CPU build from PyTorch's index
and a CUDA build both satisfy; kerasmgpu's CI uses the CPU build).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from kerasmgpu._atomic import write_atomic
from kerasmgpu._errors import bad_value

HERE = Path(__file__).resolve().parent

# The newest release of every line: what `kerasmgpu pins --write` writes by default.
NEWEST = ("keras23", "tf2.15", "tfkeras2.21", "keras3.15-tensorflow", "keras3.15-jax",
          "keras3.15-torch")
# What the keras23 env installs over TensorFlow's own keras, without its dependencies.
KERAS23 = "keras==2.3.1"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

_PIN = re.compile(r"^([A-Za-z0-9_.\[\]-]+)==([^\s;#+]+)(\+[^\s;#]+)?")


@dataclass(frozen=True)
class Pins:
    """One tested env: its name, the Keras line in words, and its two files."""

    env: str
    line: str
    requirements: Tuple[str, ...]
    constraints: Path

    @property
    def backend(self) -> Optional[str]:
        """KERAS_BACKEND for a Keras 3 env, None elsewhere."""
        return self.env.split("-")[1] if self.env.startswith("keras3.") else None

    @property
    def legacy_tf_keras(self) -> bool:
        """Whether the env is tf_keras (TF_USE_LEGACY_KERAS=1)."""
        return self.env.startswith("tfkeras")


def available() -> List[str]:
    """Every tested env, oldest line first, releases in order within a line."""
    def order(env: str) -> Tuple[int, Tuple[int, ...], str]:
        line = ("keras23", "tf2.", "tfkeras", "keras3.")
        kind = next(i for i, prefix in enumerate(line) if env.startswith(prefix))
        numbers = tuple(int(n) for n in re.findall(r"\d+", env.split("-")[0])[-2:])
        return kind, numbers, env

    return sorted((p.stem for p in HERE.glob("*.txt")), key=order)


def _versions(constraints: Path) -> Dict[str, str]:
    versions = {}
    for raw in constraints.read_text().splitlines():
        match = _PIN.match(raw.strip())
        if match:
            versions[match.group(1).lower()] = match.group(2)
    return versions


def _describe(env: str, versions: Dict[str, str]) -> str:
    if env == "keras23":
        return f"Keras 2.3.1 on TensorFlow {versions['tensorflow']}"
    if env.startswith("tf2."):
        return f"tf.keras {versions['keras']} on TensorFlow {versions['tensorflow']}"
    if env.startswith("tfkeras"):
        return f"tf_keras {versions['tf-keras']} on TensorFlow {versions['tensorflow']}"
    backend = env.split("-")[1]
    engine = {"tensorflow": "TensorFlow", "jax": "JAX", "torch": "PyTorch"}[backend]
    text = f"Keras {versions['keras']} on {engine} {versions[backend]}"
    if env.endswith("-tfdata"):  # TensorFlow beside the backend, for tf.data pipelines
        text += f", with TensorFlow {versions['tensorflow']} for tf.data"
    return text


def get(env: str) -> Pins:
    """The pins of one tested env; a name that is not one is a ValueError listing them."""
    envs = available()
    if env not in envs:
        raise bad_value("env", env, "one of " + ", ".join(envs),
                        "run `kerasmgpu pins` to list them")
    constraints = HERE / f"{env}.txt"
    lines = (line.split(" #")[0].strip() for line in (HERE / f"{env}.in").read_text().splitlines())
    requirements = tuple(line for line in lines if line and not line.startswith(("#", "-r")))
    return Pins(env, _describe(env, _versions(constraints)), requirements, constraints)


def portable(text: str) -> str:
    """Pin lines without local version labels (`torch==2.13.0+cpu` -> `torch==2.13.0`)."""
    return "\n".join(re.sub(r"^([^#\s][^=\s]*==[^\s;#+]+)\+[^\s;#]+", r"\1", line)
                     for line in text.splitlines()) + "\n"


def tested_releases(package: str) -> List[str]:
    """Every release of `package` that an env of the matrix pins ("2.13.0" for torch)."""
    found = {_versions(HERE / f"{env}.txt").get(package.lower()) for env in available()}
    return sorted(v for v in found if v)


REQUIREMENT_FILE = "kerasmgpu.in"


def requirement(source: Optional[str] = None) -> str:
    """The requirement line that installs kerasmgpu in a project's env.

    `source`: a checkout folder or a wheel (a path), a URL pip takes (`git+https://...`,
    `https://.../x.whl`), or a requirement naming kerasmgpu as it is. None: where pip
    recorded the installed kerasmgpu came from (PEP 610), else the PyPI name.
    """
    if source is None:
        return installed_requirement() or "kerasmgpu"
    source = source.strip()
    if re.match(r"kerasmgpu\b", source, re.IGNORECASE):
        return source
    if "://" in source or source.startswith("git+"):
        return f"kerasmgpu @ {source}"
    return f"kerasmgpu @ {Path(source).expanduser().resolve().as_uri()}"


def installed_requirement() -> Optional[str]:
    """`kerasmgpu @ URL` from the installed distribution's direct_url.json, or None when
    pip recorded none (an install from an index) or it cannot be read."""
    from importlib import metadata

    try:
        text = metadata.distribution("kerasmgpu").read_text("direct_url.json")
        return requirement_from_direct_url(json.loads(text)) if text else None
    except (metadata.PackageNotFoundError, ValueError, TypeError, AttributeError):
        return None


def requirement_from_direct_url(record: Mapping[str, Any]) -> Optional[str]:
    """PEP 610's record of where a distribution came from, as a requirement line."""
    url = record.get("url")
    if not isinstance(url, str) or not url:
        return None
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs"):
        commit = vcs.get("commit_id") or vcs.get("requested_revision")
        url = f"{vcs['vcs']}+{url}" + (f"@{commit}" if commit else "")
    subdirectory = record.get("subdirectory")
    if subdirectory:
        url += f"#subdirectory={subdirectory}"
    return f"kerasmgpu @ {url}"


def write_requirement(directory: Path, line: str) -> Path:
    """DIR/kerasmgpu.in: the line that installs kerasmgpu itself, for the tox lines."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / REQUIREMENT_FILE
    write_atomic(str(path), ("# kerasmgpu itself. Written by `kerasmgpu pins --write` "
                             "(--source SPEC changes it).\n" + line + "\n").encode())
    return path


def write(directory: Path, envs: Sequence[str], version: str) -> List[Path]:
    """Write `<env>.in` and `<env>.txt` of each env into `directory`; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for env in envs:
        pins = get(env)
        header = (f"# kerasmgpu {version}: {pins.line}, as kerasmgpu's CI tested it. "
                  f"Written by `kerasmgpu pins --write`.\n")
        requirements = directory / f"{env}.in"
        write_atomic(str(requirements), (header + "\n".join(portable("\n".join(
            pins.requirements)).splitlines()) + "\n").encode())
        constraints = directory / f"{env}.txt"
        write_atomic(str(constraints),
                     (header + portable(pins.constraints.read_text())).encode())
        written += [requirements, constraints]
    return written


def tox_snippet(directory: str, envs: Sequence[str], with_kerasmgpu: bool = False) -> str:
    """The tox.ini lines that install each env from the files `write` put in `directory`
    (and kerasmgpu itself from DIR/kerasmgpu.in, `with_kerasmgpu`)."""
    chosen = [get(env) for env in envs]
    folder = "{toxinidir}/" + directory.strip("/")
    lines = [
        "[tox]",
        "env_list =",
        *[f"    {p.env}" for p in chosen],
        "",
        "[testenv]",
        "# Each env: the Keras line's packages, every package pinned as kerasmgpu tested it.",
        "deps =",
        f"    -r {folder}/{{envname}}.in",
        *([f"    -r {folder}/{REQUIREMENT_FILE}"] if with_kerasmgpu else []),
        "    pytest",
        "set_env =",
        f"    PIP_CONSTRAINT = {folder}/{{envname}}.txt",
        f"    UV_CONSTRAINT = {folder}/{{envname}}.txt",
    ]
    tf_keras = [p.env for p in chosen if p.legacy_tf_keras]
    if tf_keras:
        lines.append(f"    {','.join(tf_keras)}: TF_USE_LEGACY_KERAS = 1")
    backends = sorted({p.backend for p in chosen if p.backend})
    lines += [f"    {b}: KERAS_BACKEND = {b}" for b in backends]
    if "torch" in backends:
        lines += [
            "    # torch: the CPU build (drop these two lines where CI has GPUs)",
            f"    torch: PIP_EXTRA_INDEX_URL = {TORCH_CPU_INDEX}",
            f"    torch: UV_EXTRA_INDEX_URL = {TORCH_CPU_INDEX}",
            "    torch: UV_INDEX_STRATEGY = unsafe-best-match",
        ]
    if any(p.env == "keras23" for p in chosen):
        lines += [
            "# Keras 2.3.1 goes over the keras 2.15 TensorFlow 2.15 brings (your code starts",
            "# with `import kerasmgpu.keras23`); pip, also under tox-uv:",
            "uv_seed =",
            "    keras23: true",
            "commands_pre =",
            f"    keras23: python -m pip install --quiet --no-deps {KERAS23}",
        ]
    lines.append("commands = pytest {posargs}")
    return "\n".join(lines) + "\n"
