"""Keras 1 names and arguments, which Keras 2.3 still converted and modern Keras rejects.

Keras 2.3 carried a translation layer (`keras/legacy/interfaces.py`): it renamed Keras 1
keywords with a warning and rebuilt Keras 1 positional arguments. Modern Keras has none of
it, and one case turns silent: `Convolution2D(64, 3, 3)` was a 3x3 kernel in Keras 2.3
and is a 3-wide kernel with stride 3 today. `--to keras3` / `--to tf_keras` apply Keras
2.3's own conversions, so the layers are the ones Keras 2.3 built:

* `Conv2D/Convolution2D(n, r, c)` with integer rows and columns -> `(n, (r, c))` (also
  `nb_row=`/`nb_col=`, `Conv3D`'s `kernel_dim1..3`, `Deconvolution2D`'s `output_shape`
  dropped as Keras 2.3 did). Rows and columns that are module constants (`nb_conv = 3`,
  `kernel_size = (3, 3)` then `kernel_size[0]`) count as the ints they are; other
  non-literal rows and columns Keras 2.3 decided at run time: an ERROR says what to write.
* keyword renames per layer (`output_dim`->`units`, `init`->`kernel_initializer`,
  `W_regularizer`->`kernel_regularizer`, `border_mode`->`padding`, `subsample`->`strides`,
  `dim_ordering='th'`->`data_format='channels_first'`, `p`->`rate`, `inner_init`,
  `dropout_W`/`dropout_U`, `consume_less`->`implementation`, `beta_init`, ...), and
  `input_dim`/`input_length` of recurrent and 1D convolution layers -> `input_shape`.
* what Keras 2.3 dropped is dropped (BatchNormalization `mode=0`, Embedding `dropout`,
  `forget_bias_init` other than 'one'), an INFO each; what it refused (`mode=1`) is an ERROR.
* `Model(input=, output=)` -> `Model(inputs=, outputs=)`; `nb_epoch=` -> `epochs=` in
  `fit`/`evaluate`.
* `merge(tensors, mode=...)` (Keras 1.x) -> `concatenate(axis=concat_axis)`, `add`,
  `multiply`, `average`, `maximum`, `dot(axes=dot_axes[, normalize=True])`; a callable
  mode and the `Merge` layer (Sequential merging) are ERRORs.

`--to keras23` changes nothing here (Keras 2.3 converts these itself).
"""

from __future__ import annotations

import functools
from typing import Dict, FrozenSet, List, Optional, Tuple

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target
from kerasmgpu.migrate.tables import (
    ALIASES,
    CONSUME_LESS,
    DIM_ORDERING,
    KERNEL_KEYS,
    MERGE_MODES,
    SPECS,
    Spec,
)

MSG_LAYER = "{name}(...): Keras 1 arguments as Keras 2.3 converted them: {what}"
MSG_KERNEL_UNKNOWN = (
    "{name}({args}): Keras 2.3 read the third and fourth positional arguments as the kernel "
    "rows and columns when they were ints at run time (a Keras 1 call) and as the strides "
    "otherwise; modern Keras always reads strides, silently. Write kernel_size=(rows, cols) "
    "or strides=... explicitly"
)
MSG_MERGE = "merge(mode={mode!r}) -> {new} (Keras 1's merge function, gone since Keras 2.2)"
MSG_MERGE_LEFT = (
    "merge(...){why}: Keras 1's merge function is gone since Keras 2.2; use "
    "keras.layers.concatenate/add/multiply/average/maximum/dot, or a Lambda layer for a "
    "callable mode"
)
MSG_MERGE_LAYER = (
    "Merge (the Keras 1 layer that merged Sequential branches) is gone since Keras 2.0: build "
    "the branches with the functional API and join them with keras.layers.concatenate/add/..."
)


class Keras1Rule(Rule):
    NAME = "keras1"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.ints = _int_constants(ctx)

    def layer_name(self, func: cst.BaseExpression) -> Optional[str]:
        for name in self.ctx.keras_names(func):
            module, _, attr = name.rpartition(".")
            if module.startswith("keras.layers") or module == "keras.legacy.layers":
                return attr
            if module in ("keras.models", "keras.engine.training", "keras") and attr == "Model":
                return attr
        return None

    def visit_Call(self, node: cst.Call) -> None:
        name = self.layer_name(node.func)
        if name == "Model":
            self.model_call(node)
        elif name == "merge":
            self.merge_call(node)
        elif name == "Merge":
            self.error(node, MSG_MERGE_LAYER)
        elif name is not None and ALIASES.get(name, name) in SPECS:
            self.layer_call(node, name, SPECS[ALIASES.get(name, name)])
        elif isinstance(node.func, cst.Attribute) and node.func.attr.value in (
                "fit", "evaluate", "fit_generator", "evaluate_generator"):
            if nodes.kwarg_value(node, "nb_epoch") is not None and (
                    node.func.attr.value in ("fit", "evaluate")):
                self.ctx.edit(node, functools.partial(_renamed, renames={"nb_epoch": "epochs"}))
                self.info(node.func.attr, "nb_epoch= -> epochs= (Keras 1's name)")

    def model_call(self, node: cst.Call) -> None:
        keys = {nodes.keyword(arg) for arg in node.args}
        if keys & {"input", "output"}:
            renames = {"input": "inputs", "output": "outputs"}
            self.ctx.edit(node, functools.partial(_renamed, renames=renames))
            self.info(node, "Model(input=, output=) -> Model(inputs=, outputs=) (Keras 1's "
                      "names; Keras 3 rejects them)")

    def layer_call(self, node: cst.Call, name: str, spec: Spec) -> None:
        if nodes.has_star(node):
            return
        problems: List[str] = []
        plan = _plan(node, spec, problems, self.ints)
        for problem in problems:
            if problem == "kernel":
                args = ", ".join(self.ctx.code(a).rstrip(", ") for a in node.args)
                self.error(node, MSG_KERNEL_UNKNOWN.format(name=name, args=args))
            else:
                self.error(node, f"{name}(...): {problem}")
        if problems or not plan:
            return
        self.ctx.edit(node, functools.partial(_rewrite_layer, spec=spec, ints=self.ints))
        self.info(node, MSG_LAYER.format(name=name, what="; ".join(plan)))

    def merge_call(self, node: cst.Call) -> None:
        bound = nodes.bind(node, ("inputs", "mode", "concat_axis", "dot_axes"))
        mode_arg = bound.get("mode") if bound else None
        mode = nodes.string_value(mode_arg.value) if mode_arg is not None else "sum"
        if bound is None or mode not in MERGE_MODES:
            why = " with a callable or unknown mode" if bound is not None else ""
            self.error(node, MSG_MERGE_LEFT.format(why=why))
            return
        keras = self.ctx.keras_module(node)
        self.ctx.edit(node, functools.partial(_rewrite_merge, keras=keras))
        for name in ("merge",):
            self.ctx.claimed.add(name)
        self.info(node, MSG_MERGE.format(mode=mode, new=f"{keras}.layers.{MERGE_MODES[mode]}"))


RULE = Keras1Rule


# --------------------------------------------------------------------------------------
# Plans and edits (pure)


def _literal_int(arg: cst.Arg, ints: FrozenSet[str] = frozenset()) -> bool:
    return isinstance(arg.value, cst.Integer) or _code(arg.value) in ints


def _kernel_positionals(args: List[cst.Arg], spec: Spec,
                        ints: FrozenSet[str] = frozenset()) -> Optional[int]:
    """How many positionals after `filters` are Keras 1 kernel sizes (0: none), or None
    when Keras 2.3 decided at run time (they are not literal ints).

    Keras 2.3 allowed only (filters, kernel_size) positionally in its Keras 2 API, so more
    positionals are a Keras 1 call; one extra positional is a Keras 1 row count only when
    the rest of the kernel comes by keyword (`nb_col=`).
    """
    extra = [a for a in args if a.keyword is None][1:]
    if spec.kernel == 0 or not extra:
        return 0
    keywords = {nodes.keyword(a) for a in args}
    rest = KERNEL_KEYS[spec.kernel][len(extra):]
    if len(extra) == 1 and not (rest and all(k in keywords for k in rest)):
        return 0  # (filters, kernel_size): Keras 2 already
    if len(extra) > spec.kernel or not all(_literal_int(a, ints) for a in extra):
        return None
    if len(extra) < spec.kernel and not all(k in keywords for k in rest):
        return None
    return len(extra)


def _plan(node: cst.Call, spec: Spec, problems: List[str],
          ints: FrozenSet[str] = frozenset()) -> List[str]:
    """What Keras 2.3 would have converted in this call (empty: it is Keras 2 already)."""
    done: List[str] = []
    kernel = _kernel_positionals(list(node.args), spec, ints)
    if kernel is None:
        problems.append("kernel")
        return done
    keywords = {nodes.keyword(a): a for a in node.args if a.keyword is not None}
    kernel_keys = KERNEL_KEYS.get(spec.kernel, ())
    if kernel or any(k in keywords for k in kernel_keys):
        done.append("kernel rows/columns -> kernel_size")
    for old, new in spec.renames.items():
        if old in keywords:
            done.append(f"{old}= -> {new}=")
            if old in ("dim_ordering", "consume_less"):
                value = nodes.string_value(keywords[old].value)
                table = DIM_ORDERING if old == "dim_ordering" else CONSUME_LESS
                if value not in table:
                    problems.append(f"{old}={_code(keywords[old].value)} is not a literal "
                                    f"Keras 2.3 could convert ({', '.join(table)}): write "
                                    f"{new}= by hand")
    for old, allowed in spec.dropped.items():
        if old in keywords:
            value = _code(keywords[old].value)
            if allowed not in ("*", value):
                problems.append(f"{old}={value} was refused by Keras 2.3 already")
            else:
                done.append(f"{old}= dropped, as Keras 2.3 did")
    if spec.input_shape and ("input_dim" in keywords or "input_length" in keywords):
        done.append("input_dim/input_length -> input_shape")
    if "forget_bias_init" in keywords:
        done.append("forget_bias_init -> unit_forget_bias")
    return done


def _int_constants(ctx: Context) -> FrozenSet[str]:
    """Expressions that are int constants: `nb_conv` after a single module-level
    `nb_conv = 3`, `kernel_size[0]` after `kernel_size = (3, 3)` (Keras 1 examples' style)."""
    found: List[str] = []
    for stmt in ctx.module.body:
        if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
            continue
        assign = stmt.body[0]
        if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1
                and isinstance(assign.targets[0].target, cst.Name)):
            continue
        name = assign.targets[0].target.value
        scope = ctx.scopes.get(assign)
        if scope is None or len(scope.assignments[name]) != 1:
            continue  # assigned again somewhere: not a constant
        value = assign.value
        if isinstance(value, cst.Integer):
            found.append(name)
        elif isinstance(value, cst.Tuple) and all(isinstance(e.value, cst.Integer)
                                                  for e in value.elements):
            found.extend(f"{name}[{i}]" for i in range(len(value.elements)))
    return frozenset(found)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _rewrite_layer(updated: cst.CSTNode, spec: Spec,
                   ints: FrozenSet[str] = frozenset()) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    args = list(updated.args)
    positional = [a for a in args if a.keyword is None]
    keywords = [a for a in args if a.keyword is not None]
    kernel = _kernel_positionals(args, spec, ints) or 0
    new: List[cst.Arg] = list(positional)
    by_name = {nodes.keyword(a): a for a in keywords}
    kernel_keys = KERNEL_KEYS.get(spec.kernel, ())
    if kernel:
        sizes = [a.value for a in positional[1:1 + kernel]]
        sizes += [by_name[k].value for k in kernel_keys[kernel:] if k in by_name]
        new = [positional[0], cst.Arg(_tuple(sizes))] + positional[1 + kernel:]
    elif kernel_keys and all(k in by_name for k in kernel_keys):
        new.append(nodes.kwarg("kernel_size", _tuple([by_name[k].value for k in kernel_keys])))
    shape = _input_shape(by_name) if spec.input_shape else None
    skip = set(spec.dropped)
    if kernel or (kernel_keys and all(k in by_name for k in kernel_keys)):
        skip |= set(kernel_keys)
    if shape is not None:
        skip |= {"input_dim", "input_length"}
    for arg in keywords:
        key = nodes.keyword(arg) or ""
        converted = None if key in skip else _keyword(arg, key, spec)
        if converted is not None:
            new.append(converted)
    if shape is not None:
        new.append(nodes.kwarg("input_shape", shape))
    return nodes.with_args(updated, new)


def _keyword(arg: cst.Arg, key: str, spec: Spec) -> Optional[cst.Arg]:
    if key == "forget_bias_init":
        if nodes.string_value(arg.value) == "one":
            return nodes.kwarg("unit_forget_bias", cst.Name("True"))
        return None  # Keras 2.3 ignored any other value
    if key not in spec.renames:
        return arg
    new = spec.renames[key]
    if key == "dim_ordering":
        value = DIM_ORDERING[nodes.string_value(arg.value) or "default"]
        if value is None:
            return None
        return nodes.as_keyword(arg, new).with_changes(value=cst.SimpleString(repr(value)))
    if key == "consume_less":
        number = CONSUME_LESS[nodes.string_value(arg.value) or "cpu"]
        return nodes.as_keyword(arg, new).with_changes(value=cst.Integer(str(number)))
    return nodes.as_keyword(arg, new)


def _input_shape(by_name: Dict[Optional[str], cst.Arg]) -> Optional[cst.BaseExpression]:
    if "input_dim" not in by_name:
        return None
    length = by_name["input_length"].value if "input_length" in by_name else cst.Name("None")
    return _tuple([length, by_name["input_dim"].value])


def _tuple(values: List[cst.BaseExpression]) -> cst.Tuple:
    elements = [cst.Element(v, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
                for v in values[:-1]] + [cst.Element(values[-1])]
    return cst.Tuple(elements)


def _renamed(updated: cst.CSTNode, renames: Dict[str, str]) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    return nodes.rename_kwargs(updated, renames)


def _rewrite_merge(updated: cst.CSTNode, keras: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    bound = nodes.bind(updated, ("inputs", "mode", "concat_axis", "dot_axes"))
    assert bound is not None
    mode = nodes.string_value(bound["mode"].value) if "mode" in bound else "sum"
    function = MERGE_MODES[mode or "sum"]
    args: List[cst.Arg] = [bound["inputs"].with_changes(keyword=None,
                                                         equal=cst.MaybeSentinel.DEFAULT)]
    extra: List[Tuple[str, cst.BaseExpression]] = []
    if function == "concatenate":
        axis = bound["concat_axis"].value if "concat_axis" in bound else None
        if axis is not None:
            extra.append(("axis", axis))
    elif function == "dot":
        axes = bound["dot_axes"].value if "dot_axes" in bound else cst.UnaryOperation(
            operator=cst.Minus(), expression=cst.Integer("1"))
        extra.append(("axes", axes))
        if mode == "cos":
            extra.append(("normalize", cst.Name("True")))
    args += [nodes.kwarg(name, value) for name, value in extra]
    args += [arg for key, arg in bound.items()
             if key not in ("inputs", "mode", "concat_axis", "dot_axes")]
    return nodes.with_args(updated, args,
                           func=nodes.attr_chain(f"{keras}.layers.{function}"))
