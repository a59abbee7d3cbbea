"""`kerasmgpu migrate`: move a Keras 2.3 project to Keras 3, tf_keras, or kerasmgpu on 2.3.

    kerasmgpu migrate src/ --to keras3            # the report; nothing changes
    kerasmgpu migrate src/ --to keras3 --diff     # the report and the diff
    kerasmgpu migrate src/ --to keras3 --write    # rewrite in place
    kerasmgpu migrate src/ --to keras3 --check    # CI: exit 1 while something is left

The codemod edits source with libcst, so comments, blank lines and formatting outside the
rewritten nodes survive byte for byte; a second run changes nothing. Each rule family is
one module of this package, with what it rewrites, what it only reports, and why, in its
docstring:

* `multi_gpu`: `multi_gpu_model` / keras-extras `make_parallel` -> `kerasmgpu.parallelize`
  (`--to keras23`: -> `kerasmgpu.legacy`), CPU template scopes, batch arithmetic.
* `generators`: `fit_generator` / `evaluate_generator` / `predict_generator` -> `fit` /
  `evaluate` / `predict`, their worker arguments moved or dropped with a note;
  `predict_classes` / `predict_proba`.
* `optimizers`: `lr`, `decay` (-> the same schedule), Keras 2.3's default rates, `.lr`.
* `keras1`: Keras 1 names and arguments, as Keras 2.3 converted them.
* `layers`: layer classes and defaults that changed (`GRU`, CuDNN layers, `weights=`).
* `backend`: `keras.backend` functions -> `keras.ops` where the meaning is the same.
* `tf1`: TF1 session/config setups, `tf.compat.v1` names, graph-only code.
* `saving`: weight/model file endings, `ModelCheckpoint` and `TensorBoard` arguments.
* `image_data`: `ImageDataGenerator` advice.
* `training`: sparse Embedding updates, History keys, and Keras 2.3 internals a project
  reached into.
* `trainable`: what each model trains - `trainable` read at compile (the GAN pattern),
  one optimizer shared by several models.
* `imports`: moved modules, renamed names, the target's package (last: it respells what
  the other families leave).

The report (`report.py`): a summary, then `path:line:col: SEVERITY: message` per finding.
INFO is a rewrite that keeps behaviour; WARNING code that runs on the target but may
behave differently (the message says how); ERROR code that will not run there and was not
rewritten. `--check` exits 1 while a file would change or an ERROR remains.

libcst is an optional dependency (``pip install "kerasmgpu[tools]"``); it is imported only
when the codemod runs, so ``import kerasmgpu`` stays framework- and libcst-free.
"""

from __future__ import annotations

from typing import List, Optional

from kerasmgpu.migrate.entry import INSTALL_HINT, import_libcst, migrate_source
from kerasmgpu.migrate.report import (
    DEFAULT_TARGET,
    Finding,
    MigrationError,
    MigrationResult,
    Severity,
    Target,
)

__all__ = [
    "DEFAULT_TARGET",
    "INSTALL_HINT",
    "Finding",
    "MigrationError",
    "MigrationResult",
    "Severity",
    "Target",
    "import_libcst",
    "main",
    "migrate_source",
]

def main(argv: Optional[List[str]] = None) -> int:
    """`kerasmgpu migrate PATH... [--to TARGET] [--write | --check] [--diff]`."""
    from kerasmgpu.migrate import cli

    return cli.main(argv)
