"""`import kerasmgpu` time, in fresh interpreters, with no framework imported.

    python benchmarks/import_time.py [--runs 20]

Prints the median import time of kerasmgpu beside a bare interpreter start (the
difference is what kerasmgpu costs), and which frameworks got imported (none).
Target: <= 50 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CODE = (
    "import sys, time, json; t = time.perf_counter(); import kerasmgpu; "
    "dt = time.perf_counter() - t; "
    "print(json.dumps([dt, [m for m in ('tensorflow', 'jax', 'torch', 'keras', 'tf_keras', "
    "'numpy') if m in sys.modules]]))"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    seconds = []
    imported: set = set()
    for _ in range(args.runs):
        out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                             check=True)
        dt, mods = json.loads(out.stdout.strip().splitlines()[-1])
        seconds.append(dt)
        imported.update(mods)
    median = statistics.median(seconds) * 1000
    print(f"import kerasmgpu: median {median:.1f} ms over {args.runs} fresh interpreters "
          f"(min {min(seconds) * 1000:.1f} ms); frameworks imported: {sorted(imported) or 'none'}")
    verdict = "ok" if median <= 50 and not imported else "ABOVE TARGET"
    print(f"target <= 50 ms and no framework: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
