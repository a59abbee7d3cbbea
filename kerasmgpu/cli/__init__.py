"""The `kerasmgpu` command (also `python -m kerasmgpu`).

    kerasmgpu demo      train a small model on N devices and on one, and compare them
    kerasmgpu doctor    what kerasmgpu sees, the route it would take, and what to fix
    kerasmgpu bench     samples/s and scaling efficiency for 1, 2, 4... replicas
    kerasmgpu migrate   migrate a Keras 2.3 project to Keras 3 / tf_keras (and kerasmgpu)
    kerasmgpu launch    start N worker processes (several machines: --nnodes)

Each subcommand lives in its own module and is imported only when used, so the
command starts fast and `kerasmgpu doctor` works even when a framework is broken.
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Dict, List, Optional

from kerasmgpu._version import __version__

# name -> (module, one-line help)
COMMANDS: Dict[str, tuple] = {
    "demo": ("kerasmgpu.cli.demo", "train a small model on every device and on one device, "
             "from the same weights, and compare"),
    "doctor": ("kerasmgpu.cli.doctor", "show Keras line, devices and route; advise; exit 1 "
               "when multi-device training cannot run"),
    "bench": ("kerasmgpu.cli.bench", "measure samples/s and scaling efficiency per replica "
              "count; write bench.json and scaling.png"),
    "migrate": ("kerasmgpu.migrate", "migrate a Keras 2.3 project to Keras 3 or tf_keras "
                "(report by default; --diff, --write, --check)"),
    "pins": ("kerasmgpu.cli.pins", "the releases kerasmgpu is tested on: list them, or write "
             "them with tox.ini lines for your own test matrix"),
    "launch": ("kerasmgpu.launch", "start N worker processes with their rank and coordinator"),
}


# The commands that import Keras. On a Keras 2.3 install they need `kerasmgpu.keras23`
# before that import - the line a Keras 2.3 script starts with - and a user cannot add
# it to our command, so the command does.
_IMPORT_KERAS = ("demo", "doctor", "bench")


def _prepare_keras23() -> None:
    from kerasmgpu.env import versions

    if versions.standalone_keras23() is None:
        return
    from kerasmgpu.adapters import keras23_runtime

    try:
        keras23_runtime.install()
    except ImportError:  # no TensorFlow: the doctor reports it, demo and bench say so
        pass


def _usage() -> str:
    lines = [f"usage: kerasmgpu <command> [options]   (kerasmgpu {__version__})", "", "commands:"]
    lines += [f"  {name:<9} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`kerasmgpu <command> --help` shows a command's options."]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"kerasmgpu {__version__}")
        return 0
    name = args[0]
    if name not in COMMANDS:
        print(
            f"kerasmgpu: unknown command {name!r}. Allowed: {', '.join(COMMANDS)}. "
            "Fix: run `kerasmgpu --help`.",
            file=sys.stderr,
        )
        return 2
    if name in _IMPORT_KERAS:
        _prepare_keras23()
    module = importlib.import_module(COMMANDS[name][0])
    run: Callable[[List[str]], int] = module.main
    return int(run(args[1:]) or 0)
