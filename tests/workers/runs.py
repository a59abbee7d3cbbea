"""Several runs of the scripts of this folder in one process, one after another: the
start-up (importing the framework, joining the job) is paid once, not once a run.

    python tests/workers/runs.py OUT_ROOT NAME SCRIPT [options] [-- NAME SCRIPT [options]]...
    kerasmgpu launch --nproc 2 tests/workers/runs.py OUT_ROOT NAME SCRIPT ... -- ...

Run NAME does what `SCRIPT OUT_ROOT/NAME options` does (SCRIPT: train.py or ids.py of
this folder; each run builds, compiles and parallelizes its own model). A run that fails
ends the process, with its exit status, before the next one - except a run whose NAME
ends in "!", which must raise: its exception is written to OUT_ROOT/NAME/raised<R>.txt
(R: this process's rank; "-" if it did not raise) and the next run starts. Put such a
run last: after an exception in the middle of a job, what the processes hold is theirs.
"""

import os
import runpy
import sys

import kerasmgpu

HERE = os.path.dirname(os.path.abspath(__file__))

root, runs, current = sys.argv[1], [], []
for arg in sys.argv[2:] + ["--"]:
    if arg != "--":
        current.append(arg)
    elif current:
        runs.append(current)
        current = []
for name, script, *options in runs:
    must_raise = name.endswith("!")
    out = os.path.join(root, name.rstrip("!"))
    os.makedirs(out, exist_ok=True)
    sys.argv = [os.path.join(HERE, script), out, *options]
    raised = "-"
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as ended:  # train.py ends with sys.exit(0)
        if ended.code not in (0, None):
            raise
    except Exception as error:
        if not must_raise:
            raise
        raised = f"{type(error).__name__}: {error}"
    if must_raise:
        with open(os.path.join(out, f"raised{kerasmgpu.process_index()}.txt"), "w") as f:
            f.write(raised)
sys.exit(0)
