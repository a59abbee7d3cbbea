"""`kerasmgpu pins`: the releases kerasmgpu is tested on, for your own tox matrix.

    kerasmgpu pins                          every tested env: name, Keras line, packages
    kerasmgpu pins ENV                      the path of ENV's constraints file (every
                                            package pinned), inside the installed package
    kerasmgpu pins --write DIR [ENV ...]    DIR/<env>.in (the line's packages) and
                                            DIR/<env>.txt (constraints) for each ENV
                                            (default: the newest release of every line),
                                            DIR/kerasmgpu.in (kerasmgpu itself, from
                                            --source SPEC or where it was installed
                                            from), then the tox.ini lines that use them

A team moving a Keras 2.3 project runs its own tests on Keras 2.3 before `kerasmgpu
migrate` and on the lines it moves to after: `--write constraints` once, paste the
printed lines into tox.ini, then `tox -e keras23`, `tox -e keras3.15-jax`, ...
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import List, Optional

from kerasmgpu import pins
from kerasmgpu._version import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerasmgpu pins",
        description="The releases kerasmgpu is tested on, one env per Keras release: list "
        "them, print where an env's constraints file lies, or write them into your project "
        "for your own tox.ini.")
    parser.add_argument("envs", nargs="*", metavar="ENV",
                        help="tested env names (`kerasmgpu pins` lists them)")
    parser.add_argument("--write", metavar="DIR", default=None,
                        help="write DIR/<env>.in and DIR/<env>.txt for each ENV (default: "
                        f"{' '.join(pins.NEWEST)}) and print the tox.ini lines using them")
    parser.add_argument("--source", metavar="SPEC", default=None,
                        help="where the project's envs get kerasmgpu: a checkout folder, a "
                        "wheel, or a URL pip takes (git+https://...); default: where this "
                        "kerasmgpu was installed from, else the PyPI name")
    return parser


def _list() -> int:
    for env in pins.available():
        found = pins.get(env)
        print(f"{env:<22} {found.line}: {' '.join(found.requirements)}")
    print("\n`kerasmgpu pins ENV` prints ENV's constraints file; `kerasmgpu pins --write DIR` "
          "writes the newest of every line for your tox.ini.")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.write is not None:
            envs = args.envs or list(pins.NEWEST)
            directory = Path(args.write)
            written = pins.write(directory, envs, __version__)
            line = pins.requirement(args.source)
            written.append(pins.write_requirement(directory, line))
            print(f"wrote {len(written)} files into {directory}/: "
                  + ", ".join(p.name for p in written), file=sys.stderr)
            relative = os.path.relpath(directory.resolve(), Path.cwd()).replace(os.sep, "/")
            print(f"\n# tox.ini: kerasmgpu {__version__}'s tested releases (paste and adapt)\n",
                  file=sys.stderr)
            print(f"# kerasmgpu itself: {line} ({relative}/{pins.REQUIREMENT_FILE})\n",
                  file=sys.stderr)
            print(pins.tox_snippet(relative, envs, with_kerasmgpu=True), end="")
            return 0
        if not args.envs:
            return _list()
        for env in args.envs:
            print(pins.get(env).constraints)
        return 0
    except ValueError as exc:
        print(f"kerasmgpu pins: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
