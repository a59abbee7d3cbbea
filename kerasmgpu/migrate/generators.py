"""Model methods Keras 3 removed: the generator methods, `predict_classes`, `predict_proba`.

Keras 3 removed them; tf_keras keeps them deprecated. `fit`, `evaluate` and `predict` take
generators and `keras.utils.Sequence` directly there, so (`--to keras3` / `--to tf_keras`):

* `model.fit_generator(gen, 100, 5, workers=4)` -> `model.fit(gen, steps_per_epoch=100,
  epochs=5, ...)`: the generator (positional or `generator=`) stays first, every other
  positional argument becomes its keyword (fit's positional order differs: its second
  parameter is `y`).
* `evaluate_generator` / `predict_generator` defaulted to `verbose=0`, `evaluate` /
  `predict` to a progress bar: `verbose=0` is written when the call did not set it.
* Keras 2.3.1's `evaluate_generator` returned the loss of the *last batch* (its metrics were
  averaged); `evaluate` returns the mean over all batches. The value changes (to the right
  one): a WARNING says so at every `evaluate_generator`.
* `workers`, `use_multiprocessing`, `max_queue_size`: tf_keras's `fit`/`evaluate`/`predict`
  still take them (verified on tf_keras 2.21), so they stay. Keras 3's do not: they belong
  to the `PyDataset` (= `keras.utils.Sequence`) there. When the data is a name bound to an
  instance of a Sequence subclass the file defines, they move to it (`seq.workers = 4`...
  before the call: the PyDataset's public setters, Keras 3.3+). Otherwise they are dropped
  with a WARNING that says what changes (batches load in one thread: same data, slower; a
  plain generator with `use_multiprocessing=True` gave every worker process its own copy,
  so batches repeated, and now each comes once) and how to get them back. Left at their
  Keras 2.3 defaults (1, False, 10) they are dropped with an INFO.
* Keras 1 names Keras 2.3 still converted: `nb_epoch` -> `epochs`, `nb_worker` ->
  `workers`, `pickle_safe` -> `use_multiprocessing`, `max_q_size` -> `max_queue_size`,
  `nb_val_samples` -> `validation_steps` and `val_samples` -> `steps` (renamed with the
  value kept, as Keras 2.3 did; a WARNING says that they count batches, not samples).
  `samples_per_epoch` is left with an ERROR: Keras 2.3 divided it by the generator's
  `batch_size` attribute when there was one, which cannot be read from the source.

`predict_classes(x, ...)` -> Keras 2.3's own definition written out:
`(lambda p: p.argmax(axis=-1) if p.shape[-1] > 1 else (p > 0.5).astype("int32"))(
model.predict(x, ..., verbose=0))` (argmax for several outputs, a 0.5 threshold for one);
`predict_proba(x, ...)` -> `predict(x, ..., verbose=0)` (Keras 2.3's was predict; both
defaulted to verbose=0). `model.add_loss(tensor)` on a functional model's symbolic tensors
(Keras 2.3's VAE recipe) has no Keras 3 equivalent: an ERROR naming the two replacements.

A call to a `fit_generator` that the file defines itself (a method of its own class) is
not Keras's and stays. `--to keras23` changes nothing here: the methods work on 2.3.
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Set

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target
from kerasmgpu.migrate.tables import METHODS

# Keras 2.3.1's signatures, positional order (keras/engine/training.py).
PARAMS = {
    "fit_generator": ("generator", "steps_per_epoch", "epochs", "verbose", "callbacks",
                      "validation_data", "validation_steps", "validation_freq",
                      "class_weight", "max_queue_size", "workers", "use_multiprocessing",
                      "shuffle", "initial_epoch"),
    "evaluate_generator": ("generator", "steps", "callbacks", "max_queue_size", "workers",
                           "use_multiprocessing", "verbose"),
    "predict_generator": ("generator", "steps", "callbacks", "max_queue_size", "workers",
                          "use_multiprocessing", "verbose"),
}
WORKER_ARGS = ("workers", "use_multiprocessing", "max_queue_size")
WORKER_DEFAULTS = {"workers": "1", "use_multiprocessing": "False", "max_queue_size": "10"}
# Keras 1 keywords that Keras 2.3's legacy interface renamed with the value kept.
KERAS1_RENAMES = {"nb_epoch": "epochs", "nb_worker": "workers",
                  "pickle_safe": "use_multiprocessing", "max_q_size": "max_queue_size",
                  "nb_val_samples": "validation_steps", "val_samples": "steps"}
COUNTS_BATCHES = ("nb_val_samples", "val_samples")

MSG_KERAS23 = (
    "{method} is deprecated (removed in Keras 3); {base}() accepts generators and "
    "keras.utils.Sequence directly: `kerasmgpu migrate --to keras3` rewrites it"
)
MSG_REWRITTEN = "{method}(...) -> {base}(...){extra}"
MSG_VERBOSE = "; verbose=0 written, {method}'s default ({base}'s shows a progress bar)"
MSG_DROPPED_DEFAULTS = "; {names} dropped: Keras 3's {base}() has no such arguments"
MSG_DROPPED = (
    "{names} dropped from {base}(): Keras 3 takes them from a PyDataset (keras.utils.Sequence "
    "is one), not from {base}(). Until you pass them to your Sequence's "
    "super().__init__({kwargs}), batches load in one thread: the same batches in the same "
    "order, more slowly{mp}"
)
MSG_MOVED_WORKERS = (
    "{names} moved to the Sequence: Keras 3 reads them from the PyDataset (which "
    "keras.utils.Sequence is), so {seq}.workers / .use_multiprocessing / .max_queue_size are "
    "set before the call. On the TensorFlow backend training gives Keras 2.3's weights; on "
    "JAX and PyTorch, Keras 3.15 with workers > 1 trained our check's model to other weights "
    "than with workers=1 (the batches reach the model in another order): set "
    "{seq}.workers = 1 there if you need Keras 2.3's exact results"
)
MSG_DROPPED_MP = (
    ". With a plain Python generator, use_multiprocessing=True gave each worker process its "
    "own copy of the generator, so batches repeated (Keras 2.3 warned it 'may duplicate your "
    "data'); now each comes once"
)
MSG_COUNTS_BATCHES = (
    "{old}= -> {new}=, the value kept as Keras 2.3 did: it counts batches, not samples "
    "(Keras 1's meaning); divide by the batch size if it was a sample count"
)
MSG_SAMPLES_PER_EPOCH = (
    "samples_per_epoch is Keras 1's: Keras 2.3 turned it into steps_per_epoch = "
    "samples_per_epoch // generator.batch_size (or the value itself when the generator had "
    "no batch_size), which cannot be told from the source: write "
    "steps_per_epoch=<batches per epoch> and rerun"
)
MSG_LOCAL = "{method} is defined in this file (not Keras's): left alone"
PREDICT_METHODS = ("predict_classes", "predict_proba")
MSG_PREDICT = "{method}(...) -> {new}: Keras 2.3's own definition (Keras 3 removed it)"
MSG_ADD_LOSS = (
    "{owner}.add_loss(<tensor>): Keras 3 cannot add a loss built from a functional model's "
    "symbolic inputs/outputs: compute it in a custom layer's call() with self.add_loss(...), "
    "or override train_step; a loss function of (y_true, y_pred) passed to compile also works"
)
MSG_EVALUATE_LOSS = (
    "evaluate_generator(...) -> evaluate(...) changes the loss it returns: Keras 2.3.1's "
    "evaluate_generator returned the loss of the last batch only (its metrics were averaged "
    "over all batches), evaluate returns the loss averaged over all batches"
)


class GeneratorRule(Rule):
    NAME = "generators"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.local_methods: Set[str] = _defined_names(ctx.module)
        self.sequences: Set[str] = set()  # classes of this file that subclass Sequence

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            if any(name.endswith(".Sequence") or name.endswith(".PyDataset")
                   for name in self.ctx.keras_names(base.value)):
                self.sequences.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        if self.ctx.target.modern and func.attr.value in PREDICT_METHODS:
            self.predict_method(node, func)
        elif self.ctx.target is Target.KERAS3 and func.attr.value == "add_loss":
            self.add_loss(node, func)
        if func.attr.value not in METHODS:
            return
        method = func.attr.value
        if method in self.local_methods:
            self.info(func.attr, MSG_LOCAL.format(method=method))
            return
        if self.ctx.target is Target.KERAS23:
            self.info(func.attr, MSG_KERAS23.format(method=method, base=METHODS[method]))
            return
        bound = _bind(node, method)
        if bound is None or "samples_per_epoch" in bound:
            self.unbound(node, method)
        else:
            self.rewrite(node, method, bound)

    def predict_method(self, node: cst.Call, func: cst.Attribute) -> None:
        method = func.attr.value
        if method in self.local_methods or nodes.has_star(node):
            return
        new = "predict(...)" if method == "predict_proba" else (
            "argmax/threshold of predict(...)")
        self.ctx.edit(node, functools.partial(_predict, classes=method == "predict_classes"))
        self.info(func.attr, MSG_PREDICT.format(method=method, new=new))

    def add_loss(self, node: cst.Call, func: cst.Attribute) -> None:
        """`vae.add_loss(loss)` outside a layer: a functional model's symbolic loss."""
        owner = self.ctx.code(func.value)
        if owner != "self" and not owner.startswith("self."):
            self.error(func.attr, MSG_ADD_LOSS.format(owner=owner))

    def unbound(self, node: cst.Call, method: str) -> None:
        if nodes.kwarg_value(node, "samples_per_epoch") is not None:
            self.error(node.func.attr, MSG_SAMPLES_PER_EPOCH)
        else:
            self.error(node.func.attr, f"{method}: its arguments could not be matched to Keras "
                       "2.3's signature (*args/**kwargs?), so it was left: call "
                       f"{METHODS[method]}(...) by hand")

    def rewrite(self, node: cst.Call, method: str, bound: Dict[str, cst.Arg]) -> None:
        base = METHODS[method]
        drop = self.ctx.target is Target.KERAS3
        extra = ""
        if method != "fit_generator" and "verbose" not in bound:
            extra += MSG_VERBOSE.format(method=method, base=base)
        workers = {name: self.ctx.code(bound[name].value) for name in WORKER_ARGS
                   if name in bound}
        if drop and workers and not all(WORKER_DEFAULTS[k] == v for k, v in workers.items()):
            if self.move_to_sequence(node, bound, workers):
                workers = {}
        if drop and workers:
            extra += self.report_dropped(node, base, workers)
        for old, new in KERAS1_RENAMES.items():
            if nodes.kwarg_value(node, old) is not None and old in COUNTS_BATCHES:
                self.warning(node.func.attr, MSG_COUNTS_BATCHES.format(old=old, new=new))
        self.info(node.func.attr, MSG_REWRITTEN.format(method=method, base=base, extra=extra))
        if method == "evaluate_generator":
            self.warning(node.func.attr, MSG_EVALUATE_LOSS)
        self.ctx.edit(node, lambda updated: _rewrite_call(updated, method, drop))

    def move_to_sequence(self, node: cst.Call, bound: Dict[str, cst.Arg],
                         workers: Dict[str, str]) -> bool:
        """Keras 3: set the worker arguments on the Sequence (a PyDataset) before the call.

        Only for a name bound to an instance of a Sequence subclass this file defines, in a
        call that is a statement of its own; Keras 3 reads `workers`, `use_multiprocessing`
        and `max_queue_size` from the PyDataset (public setters since Keras 3.3).
        """
        data = bound["generator"].value
        line = self.ctx.parent(self.ctx.parent(node) or node)  # Call < Expr/Assign < line
        if not (isinstance(data, cst.Name) and isinstance(line, cst.SimpleStatementLine)
                and len(line.body) == 1 and self.is_local_sequence(data)):
            return False
        values = {**WORKER_DEFAULTS, **workers}
        code = [f"{data.value}.{key} = {values[key]}" for key in WORKER_ARGS]
        self.ctx.edit(line, functools.partial(_before, lines=code))
        self.warning(node.func, MSG_MOVED_WORKERS.format(
            names=", ".join(f"{k}={v}" for k, v in workers.items()), seq=data.value))
        return True

    def is_local_sequence(self, name: cst.Name) -> bool:
        """Whether `name` is assigned an instance of a keras Sequence subclass of this file."""
        scope = self.ctx.scopes.get(name)
        if scope is None:
            return False
        for assignment in scope.assignments[name.value]:
            assign = self.ctx.enclosing(getattr(assignment, "node", name), cst.Assign)
            value = assign.value if isinstance(assign, cst.Assign) else None
            if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and (
                    value.func.value in self.sequences):
                return True
        return False

    def report_dropped(self, node: cst.Call, base: str, workers: Dict[str, str]) -> str:
        """Say what dropping the worker arguments changes; the INFO suffix if nothing."""
        names = ", ".join(f"{k}={v}" for k, v in workers.items())
        if all(WORKER_DEFAULTS[k] == v for k, v in workers.items()):
            return MSG_DROPPED_DEFAULTS.format(names=names, base=base)
        mp = workers.get("use_multiprocessing", "False") not in ("False", "0")
        self.warning(node.func.attr, MSG_DROPPED.format(
            names=names, base=base, kwargs=names, mp=MSG_DROPPED_MP if mp else ""))
        return ""


RULE = GeneratorRule


def _defined_names(module: cst.Module) -> Set[str]:
    """Names of every function and method the file defines."""
    found: Set[str] = set()

    class Defs(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            found.add(node.name.value)

    module.visit(Defs())
    return found


def _bind(call: cst.Call, method: str) -> Optional[Dict[str, cst.Arg]]:
    """The call's arguments by Keras 2.3 parameter name, Keras 1 keywords renamed."""
    bound = nodes.bind(call, PARAMS[method])
    if bound is None:
        return None
    renamed: Dict[str, cst.Arg] = {}
    for name, arg in bound.items():
        new = KERAS1_RENAMES.get(name, name)
        if new in renamed:
            return None  # both spellings given: Keras 2.3 raised too
        renamed[new] = arg
    if "generator" not in renamed:
        return None
    return renamed


def _before(updated: cst.CSTNode, lines: List[str]) -> cst.FlattenSentinel:
    assert isinstance(updated, cst.SimpleStatementLine)
    added = [cst.parse_statement(line + "\n") for line in lines]
    added[0] = added[0].with_changes(leading_lines=updated.leading_lines)
    return cst.FlattenSentinel([*added, updated.with_changes(leading_lines=())])


def _predict(updated: cst.CSTNode, classes: bool) -> cst.CSTNode:
    assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
    args = list(updated.args)
    if nodes.kwarg_value(updated, "verbose") is None and not any(
            i >= 2 and a.keyword is None for i, a in enumerate(args)):
        args.append(nodes.kwarg("verbose", cst.Integer("0")))
    call = nodes.with_args(updated, args,
                           func=updated.func.with_changes(attr=cst.Name("predict")))
    if not classes:
        return call
    template = nodes.expr('(lambda p: p.argmax(axis=-1) if p.shape[-1] > 1 else '
                          '(p > 0.5).astype("int32"))(PREDICTED)')
    assert isinstance(template, cst.Call)
    return template.with_changes(args=[cst.Arg(call)], lpar=updated.lpar, rpar=updated.rpar)


def _rewrite_call(updated: cst.CSTNode, method: str, drop_workers: bool) -> cst.CSTNode:
    assert isinstance(updated, cst.Call) and isinstance(updated.func, cst.Attribute)
    bound = _bind(updated, method)
    assert bound is not None  # the same arguments as when the rewrite was decided
    data = bound.pop("generator").with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT)
    args: List[cst.Arg] = [data]
    for name, arg in bound.items():
        if drop_workers and name in WORKER_ARGS:
            continue
        args.append(nodes.as_keyword(arg, name))
    if method != "fit_generator" and "verbose" not in bound:
        args.append(nodes.kwarg("verbose", cst.Integer("0")))
    func = updated.func.with_changes(attr=cst.Name(METHODS[method]))
    return nodes.with_args(updated, args, func=func)

