"""Multi-GPU wrappers projects wrote themselves, recognized by their shape.

`--to keras3` / `--to tf_keras`:

* The `ModelMGPU` subclass (Keras issue 2436's recipe, copied into many projects): a
  `Model` subclass whose `__init__` calls `multi_gpu_model(ser_model, gpus)` and takes the
  parallel model's `__dict__`, with `__getattribute__` sending `load*`/`save*` to the
  serial model. kerasmgpu's parallel model already saves and loads as the serial model,
  so the class becomes a function of the same name and parameters returning
  `kerasmgpu.parallelize(ser_model, gpus=gpus)` (callers, here or in other modules, are
  unchanged; `isinstance(x, ModelMGPU)` no longer holds).
* A hand-written batch-slicing parallel model under any name (`to_multi_gpu`,
  `make_parallel_model`...): a function of `(model, gpus)` that slices the batch per
  `tf.device('/gpu:N')` (a `Lambda`, `tf.slice`, `tf.split`) and concatenates the towers'
  outputs on axis 0 into a new `Model`. Its body becomes `return
  kerasmgpu.parallelize(model, gpus=gpus)`: the Keras 2.3 semantics it had (compile and fit
  what it returns; the template holds the weights), with gradients all-reduced and no
  sample dropped. keras-extras' `make_parallel` and copies of Keras's `multi_gpu_model`
  are the multi_gpu family's.

`--to keras23` leaves both (on Keras 2.3 they run with `kerasmgpu.legacy`'s drop-in).
"""

from __future__ import annotations

import functools
from typing import List, Optional, Set

import libcst as cst

from kerasmgpu.adapters.keras23_names import MULTI_GPU_MODEL_MODULES
from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Replacement, Rule
from kerasmgpu.migrate.report import Target

_MGM_QUALIFIED = frozenset(f"{module}.multi_gpu_model" for module in MULTI_GPU_MODEL_MODULES)
_MODEL_NAMES = frozenset({"keras.models.Model", "keras.Model", "keras.engine.training.Model"})
_OWN_RULES = frozenset({"make_parallel", "multi_gpu_model"})  # the multi_gpu family's

MSG_MGPU = (
    "class {name}({base}): a Model subclass around multi_gpu_model that sends load/save to "
    "the serial model (Keras issue 2436's recipe) -> def {name}({params}) returning "
    "kerasmgpu.parallelize({model}, gpus={gpus}): its parallel model saves and loads as the "
    "serial model itself, and trains with Keras 2.3's semantics (compile and fit what it "
    "returns, the serial model holds the weights, batch_size is the global batch)"
)
MSG_SLICING = (
    "{name}({params}) builds a batch-slicing parallel model by hand (a slice of the batch "
    "per '/gpu:N' device, the outputs concatenated on axis 0) -> its body is now "
    "kerasmgpu.parallelize({model}, gpus={gpus}): the same Keras 2.3 semantics (compile and "
    "fit what it returns, the template holds the weights), with gradients all-reduced "
    "across the GPUs and no sample of a short batch dropped"
)


def is_model_mgpu(ctx: Context, node: cst.ClassDef) -> bool:
    """A Keras Model subclass whose `__init__` wraps multi_gpu_model and takes its dict."""
    if not any(ctx.keras_names(base.value) & _MODEL_NAMES for base in node.bases):
        return False
    init = next((s for s in node.body.body if isinstance(s, cst.FunctionDef)
                 and s.name.value == "__init__"), None)
    if init is None:
        return False
    calls = [n for n in _walk(init) if isinstance(n, cst.Call)]
    wraps = any(ctx.qualified(c.func) & _MGM_QUALIFIED or nodes.dotted(c.func) ==
                "multi_gpu_model" for c in calls)
    takes_dict = any(nodes.dotted(c.func) == "self.__dict__.update" for c in calls)
    return wraps and takes_dict


def is_slicing_parallel(ctx: Context, node: cst.FunctionDef) -> bool:
    """A function of (model, gpus) that slices per GPU device and concatenates on axis 0."""
    if node.name.value in _OWN_RULES or len(node.params.params) != 2:
        return False
    inner = _walk(node)
    gpu_scope = any(isinstance(n, cst.With) and any(_gpu_device(ctx, item.item)
                                                      for item in n.items) for n in inner)
    calls = [n for n in inner if isinstance(n, cst.Call)]
    slices = any(_is_slice(ctx, c) for c in calls)
    joins = any(_joins_on_axis0(ctx, c) for c in calls)
    model = any(ctx.keras_names(c.func) & _MODEL_NAMES for c in calls)
    return gpu_scope and slices and joins and model


class WrappersRule(Rule):
    NAME = "multi_gpu"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        if not is_model_mgpu(self.ctx, node):
            return
        init = next(s for s in node.body.body if isinstance(s, cst.FunctionDef)
                    and s.name.value == "__init__")
        params = [p.name.value for p in init.params.params][1:]
        call = next(n for n in _walk(init) if isinstance(n, cst.Call) and (
            self.ctx.qualified(n.func) & _MGM_QUALIFIED
            or nodes.dotted(n.func) == "multi_gpu_model"))
        bound = nodes.bind(call, ("model", "gpus", "cpu_merge", "cpu_relocation")) or {}
        if len(params) != 2 or "model" not in bound or "gpus" not in bound:
            return
        model, gpus = self.ctx.code(bound["model"].value), self.ctx.code(bound["gpus"].value)
        self.ctx.need_import("kerasmgpu", node)
        self.ctx.edit(node, functools.partial(
            _as_function, name=node.name.value, params=params, model=model, gpus=gpus))
        self.info(node, MSG_MGPU.format(
            name=node.name.value, base=", ".join(self.ctx.code(b.value) for b in node.bases),
            params=", ".join(params), model=model, gpus=gpus))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not is_slicing_parallel(self.ctx, node):
            return
        model, gpus = (p.name.value for p in node.params.params)
        self.ctx.need_import("kerasmgpu", node)
        self.ctx.edit(node, functools.partial(_body_parallelize, model=model, gpus=gpus))
        params = ", ".join(self.ctx.code(p).rstrip(", ") for p in node.params.params)
        self.info(node, MSG_SLICING.format(name=node.name.value, params=params, model=model,
                                           gpus=gpus))


RULE = WrappersRule


def inside_wrapper(ctx: Context, node: cst.CSTNode) -> bool:
    """Whether `node` is inside a wrapper this family replaces (its findings would cite
    code that is gone)."""
    current: Optional[cst.CSTNode] = ctx.parent(node)
    while current is not None:
        if isinstance(current, cst.ClassDef) and is_model_mgpu(ctx, current):
            return True
        if isinstance(current, cst.FunctionDef) and is_slicing_parallel(ctx, current):
            return True
        current = ctx.parent(current)
    return False


def _gpu_device(ctx: Context, expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call) or not expr.args:
        return False
    name = nodes.dotted(expr.func) or ""
    qualified = ctx.qualified(expr.func)
    if not (name.endswith("device") or any(q.endswith(".device") for q in qualified)):
        return False
    return "gpu" in ctx.code(expr.args[0].value).lower()


def _is_slice(ctx: Context, call: cst.Call) -> bool:
    names: Set[str] = ctx.keras_names(call.func) | ctx.qualified(call.func)
    return bool(names & {"keras.layers.Lambda", "keras.layers.core.Lambda",
                         "tensorflow.slice", "tensorflow.split", "tensorflow.gather"})


def _joins_on_axis0(ctx: Context, call: cst.Call) -> bool:
    short = {n.rsplit(".", 1)[-1] for n in ctx.keras_names(call.func) | ctx.qualified(
        call.func)} | {(nodes.dotted(call.func) or "").rsplit(".", 1)[-1]}
    axis = nodes.kwarg_value(call, "axis")
    if short & {"Concatenate", "concatenate", "concat"}:
        if axis is None and "concat" in short and len(call.args) > 1:
            axis = call.args[1].value  # tf.concat(values, 0)
        return axis is not None and nodes.number_value(axis) == 0
    if "merge" in short:
        mode = nodes.string_value(nodes.kwarg_value(call, "mode"))
        concat_axis = nodes.kwarg_value(call, "concat_axis")
        return mode == "concat" and concat_axis is not None and (
            nodes.number_value(concat_axis) == 0)
    return False


def _walk(root: cst.CSTNode) -> List[cst.CSTNode]:
    found: List[cst.CSTNode] = []
    stack = [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack.extend(node.children)
    return found


def _as_function(updated: cst.CSTNode, name: str, params: List[str], model: str,
                 gpus: str) -> Replacement:
    assert isinstance(updated, cst.ClassDef)
    code = (f"def {name}({', '.join(params)}):\n"
            f"    # Was a Model subclass around multi_gpu_model that sent load/save to\n"
            f"    # {model}; kerasmgpu's parallel model saves and loads as {model} itself.\n"
            f"    return kerasmgpu.parallelize({model}, gpus={gpus})\n")
    function = cst.parse_statement(code)
    return function.with_changes(leading_lines=updated.leading_lines)


def _body_parallelize(updated: cst.CSTNode, model: str, gpus: str) -> Replacement:
    assert isinstance(updated, cst.FunctionDef)
    body = list(updated.body.body) if isinstance(updated.body, cst.IndentedBlock) else []
    docstring = body[:1] if body and nodes.is_docstring(body[0]) else []
    new = cst.parse_statement(
        "def f():\n"
        "    # Sliced the batch per GPU and concatenated the outputs on axis 0 by hand;\n"
        "    # kerasmgpu keeps that contract, all-reduces the gradients, drops no sample.\n"
        f"    return kerasmgpu.parallelize({model}, gpus={gpus})\n")
    assert isinstance(new, cst.FunctionDef) and isinstance(new.body, cst.IndentedBlock)
    block = updated.body
    assert isinstance(block, cst.IndentedBlock)
    return updated.with_changes(body=block.with_changes(body=[*docstring, *new.body.body]))
