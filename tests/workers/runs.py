"""Several runs of the scripts of this folder in one process, one after another: the
start-up (importing the framework, joining the job) is paid once, not once a run.

    python tests/workers/runs.py OUT_ROOT NAME SCRIPT [options] [-- NAME SCRIPT [options]]...
    kerasmgpu launch --nproc 2 tests/workers/runs.py OUT_ROOT NAME SCRIPT ... -- ...

Run NAME does what `SCRIPT OUT_ROOT/NAME options` does (SCRIPT: train.py or ids.py of
this folder; each run builds, compiles and parallelizes its own model). A run that fails
ends the process, with its exit status, before the next one.
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

root, runs, current = sys.argv[1], [], []
for arg in sys.argv[2:] + ["--"]:
    if arg != "--":
        current.append(arg)
    elif current:
        runs.append(current)
        current = []
for name, script, *options in runs:
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    sys.argv = [os.path.join(HERE, script), out, *options]
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as ended:  # train.py ends with sys.exit(0)
        if ended.code not in (0, None):
            raise
sys.exit(0)
