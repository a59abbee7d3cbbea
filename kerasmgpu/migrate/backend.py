"""`keras.backend` functions: to `keras.ops` (Keras 3) where the meaning is the same.

Keras 3's `keras.backend` keeps only its configuration (`epsilon`, `floatx`,
`image_data_format`, `clear_session`...); the tensor functions are in `keras.ops`, with
other defaults in places. `--to keras3` rewrites each call to the op that computes the same,
writing out a Keras 2.3 default where the op's differs, and checks none by name alone: each
mapping below is exercised against Keras 2.3.1 numbers in tests/test_migrate_backend.py.

* same signature: `K.mean/sum/max/min/prod/std/var/any/all/square/abs/exp/log/sign/round/
  maximum/minimum/equal/.../clip/dot/stack/reshape/tile/cast/softmax/sigmoid/tanh/...` ->
  `keras.ops.<name>`; `K.pow` -> `ops.power`; `K.permute_dimensions` -> `ops.transpose`;
  `K.gather` -> `ops.take(axis=0)`; `K.repeat_elements` -> `ops.repeat`;
  `K.stop_gradient`, `K.one_hot`, `K.logsumexp`, `K.*_crossentropy` likewise.
* other defaults written out: `K.concatenate` (axis -1; ops: 0), `K.argmax/argmin` (-1;
  ops: None), `K.expand_dims` (-1), `K.cumsum/cumprod` (0; ops: None), `K.constant` (floatx;
  ops: the value's), `K.arange` (int32).
* other shapes of the same thing: `K.int_shape(x)` -> `tuple(x.shape)`; `K.shape(x)` ->
  `keras.ops.shape(x)` (a tuple now, not a 1-D tensor: a WARNING unless it is indexed by a
  number); `K.sqrt(x)` -> `ops.sqrt(ops.maximum(x, 0.0))` (Keras 2.3's sqrt clipped
  negatives to 0); `K.flatten`, `K.batch_flatten` -> `ops.reshape`; `K.variable` ->
  `keras.Variable`; `K.get_value/K.eval` -> `ops.convert_to_numpy`; `K.set_value(x, v)` ->
  `x.assign(v)`; `K.update/update_add/update_sub` -> `x.assign/assign_add/assign_sub` (a
  WARNING: they run now instead of returning an update op); `K.switch` -> `ops.where`;
  `K.placeholder(shape=...)` -> `keras.Input(batch_shape=...)`; `K.random_normal/uniform`
  -> `keras.random.normal/uniform` (a WARNING without a seed inside a layer's `call`: JAX
  refuses unseeded random ops while tracing; the fix is a `SeedGenerator`); `K.tf` -> `tf`; `K.dtype(x)` ->
  `keras.backend.standardize_dtype(x.dtype)`; `K.set_image_dim_ordering('th')` ->
  `set_image_data_format('channels_first')`; `K.repeat(x, n)` ->
  `ops.repeat(ops.expand_dims(x, 1), n, axis=1)`; `K.cast_to_floatx(x)` ->
  `numpy.asarray(x, dtype=keras.backend.floatx())` (Keras 2.3's own code); `K.bias_add(x, b)`
  -> `x + b` when data_format is absent (an INFO: Keras 2.3 read image_data_format()) or
  'channels_last'; any other data_format stays an ERROR with the reshape to write.
* no equivalent with the same meaning (ERROR, with what to use): `K.function`,
  `K.gradients`, `K.learning_phase`, `K.set_learning_phase`, `K.in_train_phase`,
  `K.batch_dot`, `K.rnn`, `K.conv*`, `K.pool*`, `K.resize_images`, `K.ctc_*`,
  `K.hard_sigmoid` (another formula in Keras 3), `K.print_tensor`, `K.batch_set_value`.

`--to tf_keras`: tf_keras keeps Keras 2's backend (its functions are Keras 2.3's) but for a
few it dropped, which go to TensorFlow's own (`K.logsumexp` -> `tf.math.reduce_logsumexp`,
`K.size`, `K.slice`, `K.identity`, `K.is_tensor`, `K.control_dependencies`), and `K.tf` ->
`tf`; `K.get_session/set_session` are the TF1 family's. `K.gradients` stays with a WARNING:
it is `tf.gradients`, right only while a graph is traced (fit's train step), [None] in a
layer's call during model construction.
`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target
from kerasmgpu.migrate.tables import TF_KERAS_TO_TF

UNSEEDED = frozenset({"random_normal", "random_uniform", "truncated_normal", "dropout"})
MSG_UNSEEDED = (
    " without a seed inside a layer's call: JAX refuses unseeded random ops while it traces "
    "the step (WGAN-GP's RandomWeightedAverage); for a fresh draw each step on every "
    "backend, create self.seed_generator = keras.random.SeedGenerator() in __init__ and "
    "pass seed=self.seed_generator"
)
KEPT = frozenset({"epsilon", "floatx", "image_data_format", "set_image_data_format",
                  "set_epsilon", "set_floatx", "clear_session", "backend", "is_keras_tensor",
                  "get_uid", "standardize_dtype", "result_type", "is_float_dtype",
                  "is_int_dtype"})


@dataclass(frozen=True)
class Op:
    """A backend function as a call of `target` (`ops.mean`, `random.normal`, `Variable`)."""

    params: Tuple[str, ...]  # Keras 2.3's parameters, positional order
    target: str  # under the keras package
    renames: Dict[str, str] = field(default_factory=dict)
    defaults: Dict[str, str] = field(default_factory=dict)  # Keras 2.3 default, written out
    positional: int = 1  # how many leading arguments stay positional


def _same(*params: str, positional: int = 1) -> Op:
    return Op(params, "", positional=positional)


_X = ("x",)
_REDUCE = ("x", "axis", "keepdims")
OPS: Dict[str, Op] = {
    **{name: _same(*_REDUCE) for name in ("mean", "sum", "max", "min", "prod", "std", "var",
                                          "any", "all", "logsumexp")},
    **{name: _same(*_X) for name in ("square", "abs", "exp", "log", "sign", "round", "cos",
                                     "sin", "sigmoid", "tanh", "softplus", "softsign",
                                     "stop_gradient", "ndim", "transpose")},
    **{name: _same("x", "dtype") for name in ("zeros_like", "ones_like")},
    **{name: _same("x", "y", positional=2) for name in (
        "maximum", "minimum", "equal", "not_equal", "greater", "greater_equal", "less",
        "less_equal", "dot")},
    "clip": _same("x", "min_value", "max_value", positional=3),
    "pow": Op(("x", "a"), "ops.power", positional=2),
    "softmax": _same("x", "axis"),
    "elu": _same("x", "alpha"),
    "stack": _same("x", "axis"),
    "reshape": _same("x", "shape", positional=2),
    "tile": _same("x", "n", positional=2),
    "cast": _same("x", "dtype", positional=2),
    "squeeze": _same("x", "axis", positional=2),
    "one_hot": Op(("indices", "num_classes"), "ops.one_hot", positional=2),
    "permute_dimensions": Op(("x", "pattern"), "ops.transpose", {"pattern": "axes"}),
    "gather": Op(("reference", "indices"), "ops.take", defaults={"axis": "0"}, positional=2),
    "repeat_elements": Op(("x", "rep", "axis"), "ops.repeat", {"rep": "repeats"},
                          positional=2),
    "concatenate": Op(("tensors", "axis"), "ops.concatenate", defaults={"axis": "-1"}),
    "argmax": Op(("x", "axis"), "ops.argmax", defaults={"axis": "-1"}),
    "argmin": Op(("x", "axis"), "ops.argmin", defaults={"axis": "-1"}),
    "expand_dims": Op(("x", "axis"), "ops.expand_dims", defaults={"axis": "-1"}),
    "cumsum": Op(("x", "axis"), "ops.cumsum", defaults={"axis": "0"}),
    "cumprod": Op(("x", "axis"), "ops.cumprod", defaults={"axis": "0"}),
    "arange": Op(("start", "stop", "step", "dtype"), "ops.arange",
                 defaults={"dtype": "'int32'"}),
    "zeros": Op(("shape", "dtype", "name"), "ops.zeros"),
    "ones": Op(("shape", "dtype", "name"), "ops.ones"),
    "relu": Op(("x", "alpha", "max_value", "threshold"), "activations.relu",
               {"alpha": "negative_slope"}),
    "binary_crossentropy": _same("target", "output", "from_logits", positional=2),
    "categorical_crossentropy": _same("target", "output", "from_logits", "axis",
                                      positional=2),
    "sparse_categorical_crossentropy": _same("target", "output", "from_logits", "axis",
                                             positional=2),
    "random_normal": Op(("shape", "mean", "stddev", "dtype", "seed"), "random.normal"),
    "random_uniform": Op(("shape", "minval", "maxval", "dtype", "seed"), "random.uniform"),
    "variable": Op(("value", "dtype", "name", "constraint"), "Variable",
                   defaults={"dtype": "{keras}.backend.floatx()"}),
    "eye": Op(("size", "dtype", "name"), "ops.eye"),
    "size": _same("x", "name"),
    "slice": Op(("x", "start", "size"), "ops.slice", positional=3),
    "identity": _same("x", "name"),
    "is_tensor": _same("x"),
    "reverse": Op(("x", "axes"), "ops.flip", {"axes": "axis"}),
    "truncated_normal": Op(("shape", "mean", "stddev", "dtype", "seed"),
                           "random.truncated_normal"),
    "dropout": Op(("x", "level", "noise_shape", "seed"), "random.dropout", {"level": "rate"}),
    "name_scope": Op(("name",), "name_scope"),
    "l2_normalize": Op(("x", "axis"), "ops.normalize", defaults={"axis": "None"}),
}
NO_EQUIVALENT = {
    "function": "build keras.Model(inputs, outputs) and call it (model(x) or "
    "model.predict(x)); Keras 3 has no graph functions",
    "gradients": "compute gradients with the backend's own tool (tf.GradientTape, "
    "jax.grad, torch.autograd)",
    "learning_phase": "pass training=True/False to the layer or model call instead",
    "set_learning_phase": "pass training=True/False to calls; fit/evaluate/predict set it",
    "in_train_phase": "branch on the `training` argument of your layer's call()",
    "in_test_phase": "branch on the `training` argument of your layer's call()",
    "batch_dot": "use keras.ops.matmul or keras.ops.einsum with explicit axes",
    "rnn": "use keras.layers.RNN with a cell",
    "conv1d": "use keras.ops.conv", "conv2d": "use keras.ops.conv",
    "conv3d": "use keras.ops.conv", "pool2d": "use keras.ops.max_pool / average_pool",
    "pool3d": "use keras.ops.max_pool / average_pool",
    "resize_images": "use keras.layers.UpSampling2D or keras.ops.image.resize",
    "ctc_batch_cost": "use keras.ops.ctc_loss", "ctc_decode": "use keras.ops.ctc_decode",
    "hard_sigmoid": "Keras 3's hard_sigmoid is relu6(x + 3) / 6, Keras 2.3's was "
    "clip(0.2x + 0.5, 0, 1): write the latter with keras.ops.clip",
    "print_tensor": "print inside the backend's own debug tools (tf.print, jax.debug.print)",
    "batch_set_value": "call v.assign(value) for each (v, value)",
    "depthwise_conv2d": "K.depthwise_conv2d(x, kernel, strides, padding) is "
    "keras.ops.depthwise_conv(x, kernel, strides=strides, padding=padding)",
    "get_session": "", "set_session": "",  # the TF1 family's
}
MSG_REWRITE = "K.{name} -> {new}{note}"
MSG_SHAPE = (
    "; K.shape returned a 1-D int tensor, keras.ops.shape returns a tuple (ints and scalar "
    "tensors): indexing works, arithmetic on the whole (shape[:1] // n) needs "
    "keras.ops.convert_to_tensor(...)"
)
MSG_UPDATE = (
    "; Keras 2.3 returned an update op for Keras to run (get_updates, add_update), the "
    "variable's method assigns now"
)
MSG_NONE = "K.{name} does not exist in Keras 3: {advice}"
MSG_TF_KERAS_GRADIENTS = (
    "K.gradients is tf.gradients, which works only while TensorFlow traces a graph (inside "
    "fit's train step): Keras 2.3 built every model as a graph, tf_keras builds layers "
    "eagerly, so in a Lambda or layer call it gives [None] (measured: Keras 2.3.1's "
    "mnist_swwae). Compute the gradient with tf.GradientTape there"
)
MSG_TF = "K.tf -> {tf}: Keras 2.3's backend exposed TensorFlow as K.tf"
SPECIAL = frozenset({"int_shape", "shape", "sqrt", "flatten", "batch_flatten", "get_value",
                     "eval", "set_value", "update", "update_add", "update_sub", "switch",
                     "placeholder", "dtype", "constant", "batch_get_value",
                     "set_image_dim_ordering", "image_dim_ordering", "repeat", "bias_add",
                     "cast_to_floatx"})
MSG_BIAS_CHANNELS_FIRST = (
    "data_format is not 'channels_last' (received {received}; rewritten: absent or "
    "'channels_last'): channels_first adds the bias on axis 1, write x + "
    "keras.ops.reshape(bias, (1, -1) + (1,) * (len(x.shape) - 2))"
)
MSG_BIAS_DEFAULT = (
    " (data_format absent: Keras 2.3 read image_data_format(), channels_last unless the "
    "project sets channels_first, where 3-D and wider inputs take the bias on axis 1)"
)
# the parents where `x + b` in place of the call needs no parentheses
_BARE = (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.Return, cst.Arg, cst.Expr,
         cst.Lambda, cst.Element, cst.DictElement)


class BackendRule(Rule):
    NAME = "backend"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.rewritten: Set[int] = set()  # id() of the Name funcs of rewritten calls

    def backend_name(self, node: cst.CSTNode) -> Optional[str]:
        for name in self.ctx.keras_names(node):
            module, _, attr = name.rpartition(".")
            if module in ("keras.backend", "keras.backend.tensorflow_backend"):
                return attr
        return None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value == "tf" and self.backend_name(node) == "tf":
            tf = self.ctx.module_name("tensorflow", node, alias="tf")
            self.ctx.replace(node, cst.Name(tf))
            self.info(node, MSG_TF.format(tf=tf))

    def visit_Call(self, node: cst.Call) -> None:
        name = self.backend_name(node.func)
        if name is None or name in KEPT:
            return
        if self.ctx.target is Target.TF_KERAS:
            if name == "gradients":
                self.warning(node, MSG_TF_KERAS_GRADIENTS)
            if name in TF_KERAS_TO_TF:
                tf = self.ctx.module_name("tensorflow", node, alias="tf")
                new = f"{tf}.{TF_KERAS_TO_TF[name]}"
                self.ctx.replace(node.func, nodes.attr_chain(new))
                self.info(node, MSG_REWRITE.format(name=name, new=new, note=" (tf_keras "
                                                   "dropped it from its backend)"))
            return
        if name in NO_EQUIVALENT:
            if NO_EQUIVALENT[name]:
                self.error(node, MSG_NONE.format(name=name, advice=NO_EQUIVALENT[name]))
            return
        if nodes.has_star(node):
            self.error(node, f"K.{name}(*args): rewrite it to keras.ops by hand")
            return
        if name not in SPECIAL and name not in OPS:
            self.error(node, MSG_NONE.format(name=name, advice="see keras.ops for a "
                                             "replacement"))
            return
        if nodes.bind(node, _params(name)) is None:
            self.error(node, f"K.{name}(...): arguments not matched to Keras 2.3's signature")
            return
        problem = _unconvertible(node, name)
        if problem:
            self.error(node, f"K.{name}(...): {problem}")
            return
        keras = self.ctx.keras_module(node)
        # imported only once the call is rewritten: Keras 2.3's cast_to_floatx was numpy's
        numpy = self.ctx.module_name("numpy", node) if name == "cast_to_floatx" else ""
        bare = isinstance(self.ctx.parent(node), _BARE)
        rewrite = (_special(name, keras, numpy, bare) if name in SPECIAL
                   else _op_rewrite(name, keras))
        assert rewrite is not None
        change, new = rewrite
        self.ctx.edit(node, change)
        if isinstance(node.func, cst.Name):
            self.rewritten.add(id(node.func))
        message = MSG_REWRITE.format(name=name, new=new, note="")
        if name == "shape" and not self.indexed(node):
            self.warning(node, message + MSG_SHAPE)
        elif name in ("update", "update_add", "update_sub"):
            self.warning(node, message + MSG_UPDATE)
        elif name == "bias_add" and "data_format" not in (nodes.bind(node, _params(name))
                                                          or {}):
            self.info(node, message + MSG_BIAS_DEFAULT)
        elif name in UNSEEDED and nodes.kwarg_value(node, "seed") is None and len(
                node.args) <= _params(name).index("seed") and self.in_layer_call(node):
            self.warning(node, message + MSG_UNSEEDED)
        else:
            self.info(node, message)

    def in_layer_call(self, node: cst.CSTNode) -> bool:
        """Inside a layer's forward pass (`call`, or a `_Merge`'s `_merge_function`, which
        the internals family renames `call`), which Keras 3 traces."""
        current = self.ctx.parent(node)
        while current is not None:
            if isinstance(current, cst.FunctionDef):
                return current.name.value in ("call", "_merge_function")
            current = self.ctx.parent(current)
        return False

    def indexed(self, node: cst.Call) -> bool:
        """`K.shape(x)[0]`: an integer index means the same on a tuple and a tensor."""
        parent = self.ctx.parent(node)
        if not isinstance(parent, cst.Subscript) or len(parent.slice) != 1:
            return False
        index = parent.slice[0].slice
        return isinstance(index, cst.Index) and nodes.number_value(index.value) is not None

    def finish(self) -> None:
        """`from keras.backend import int_shape`: the import goes when every use went."""
        for stmt in self.ctx.module.body:
            if isinstance(stmt, cst.SimpleStatementLine):
                for small in stmt.body:
                    if isinstance(small, cst.ImportFrom):
                        self.claim_rewritten(small)

    def claim_rewritten(self, node: cst.ImportFrom) -> None:
        from kerasmgpu.migrate.engine import canonical_keras_name

        if canonical_keras_name(nodes.module_of(node)) not in (
                "keras.backend", "keras.backend.tensorflow_backend"):
            return
        if isinstance(node.names, cst.ImportStar):
            return
        scope = self.ctx.scopes.get(node)
        for alias in node.names:
            local = nodes.dotted(alias.asname.name if alias.asname else alias.name) or ""
            name = nodes.dotted(alias.name) or ""
            if scope is None or name in KEPT:
                continue
            uses = [access.node for assignment in scope.assignments[local]
                    if getattr(assignment, "node", None) is node
                    for access in assignment.references]
            if uses and all(id(use) in self.rewritten for use in uses):
                self.ctx.claimed.add(local)


RULE = BackendRule


# --------------------------------------------------------------------------------------
# Rewrites (pure): each returns (edit, description)

Rewrite = Tuple[Callable[[cst.CSTNode], cst.CSTNode], str]


def _unconvertible(call: cst.Call, name: str) -> str:
    """Why a special rewrite cannot keep this call's meaning ("" when it can)."""
    bound = nodes.bind(call, _params(name)) or {}
    if name == "placeholder" and "shape" not in bound:
        return ("a placeholder without shape= (ndim only) has no keras.Input equivalent: "
                "write keras.Input(batch_shape=...) with the shape")
    if name == "set_image_dim_ordering":
        value = nodes.string_value(bound["dim_ordering"].value) if bound else None
        if value not in ("th", "tf"):
            return "not a literal 'th'/'tf': call keras.backend.set_image_data_format by hand"
    if name == "constant" and "shape" in bound:
        return "shape= (a filled tensor): use keras.ops.full(shape, value)"
    if name == "bias_add" and "data_format" in bound:
        data_format = bound["data_format"].value
        if nodes.string_value(data_format) != "channels_last":
            return MSG_BIAS_CHANNELS_FIRST.format(received=_code(data_format))
    return ""


def _params(name: str) -> Tuple[str, ...]:
    if name in OPS:
        return OPS[name].params
    return SPECIAL_PARAMS.get(name, ("x",))


SPECIAL_PARAMS: Dict[str, Tuple[str, ...]] = {
    "set_value": ("x", "value"), "update": ("x", "new_x"), "update_add": ("x", "increment"),
    "update_sub": ("x", "decrement"), "switch": ("condition", "then_expression",
                                                 "else_expression"),
    "placeholder": ("shape", "ndim", "dtype", "sparse", "name"),
    "constant": ("value", "dtype", "shape", "name"), "batch_get_value": ("ops",),
    "set_image_dim_ordering": ("dim_ordering",), "image_dim_ordering": (),
    "repeat": ("x", "n"), "bias_add": ("x", "bias", "data_format"), "cast_to_floatx": ("x",),
}


def _op_rewrite(name: str, keras: str) -> Optional[Rewrite]:
    op = OPS.get(name)
    if op is None:
        return None
    target = f"{keras}.{op.target or 'ops.' + name}"
    return functools.partial(_call_op, op=op, target=target), target


def _call_op(updated: cst.CSTNode, op: Op, target: str) -> cst.CSTNode:
    assert isinstance(updated, cst.Call)
    bound = nodes.bind(updated, op.params) or {}
    args: List[cst.Arg] = []
    for index, param in enumerate(op.params):
        if param not in bound:
            if param in op.defaults:
                default = op.defaults[param].format(keras=target.split(".")[0])
                args.append(nodes.kwarg(param, nodes.expr(default)))
            continue
        arg = bound[param]
        if index < op.positional and not any(p in bound and bound[p].keyword is not None
                                             for p in op.params[:index + 1]):
            args.append(arg.with_changes(keyword=None, equal=cst.MaybeSentinel.DEFAULT))
        else:
            args.append(nodes.as_keyword(arg, op.renames.get(param, param)))
    for key, value in op.defaults.items():
        if key not in op.params and key not in bound:
            args.append(nodes.kwarg(key, nodes.expr(value)))
    return nodes.with_args(updated, args, func=nodes.attr_chain(target))


def _first(call: cst.Call, params: Tuple[str, ...], key: str) -> Optional[cst.BaseExpression]:
    bound = nodes.bind(call, params) or {}
    return bound[key].value if key in bound else None


def _expr_of(updated: cst.CSTNode, build: Callable[[cst.Call], str]) -> cst.CSTNode:
    """Replace a call by an expression written from its argument code."""
    assert isinstance(updated, cst.Call)
    new = nodes.expr(build(updated))
    return new.with_changes(lpar=updated.lpar, rpar=updated.rpar) if hasattr(
        new, "lpar") and updated.lpar else new


def _code(node: Optional[cst.CSTNode]) -> str:
    return "" if node is None else cst.Module(body=[]).code_for_node(node)


def _arg(call: cst.Call, name: str, key: str) -> str:
    return _code(_first(call, _params(name), key))


def _atom(code: str) -> str:
    """`code` safe to follow with `.attr` (parenthesised unless a name/call/attribute)."""
    node = nodes.expr(code)
    simple = (cst.Name, cst.Attribute, cst.Call, cst.Subscript)
    return code if isinstance(node, simple) else f"({code})"


def _special(name: str, keras: str, numpy: str = "numpy",
             bare: bool = True) -> Optional[Rewrite]:
    """`numpy`: its name in the file (cast_to_floatx); `bare`: the call's place takes a
    sum without parentheses (bias_add)."""
    ops = f"{keras}.ops"
    add = "{} + {}" if bare else "({} + {})"
    builders: Dict[str, Tuple[Callable[[cst.Call], str], str]] = {
        "int_shape": (lambda c: f"tuple({_atom(_arg(c, name, 'x'))}.shape)", "tuple(x.shape)"),
        "shape": (lambda c: f"{ops}.shape({_arg(c, name, 'x')})", f"{ops}.shape"),
        "sqrt": (lambda c: f"{ops}.sqrt({ops}.maximum({_arg(c, name, 'x')}, 0.0))",
                 f"{ops}.sqrt({ops}.maximum(x, 0.0))"),
        "flatten": (lambda c: f"{ops}.reshape({_arg(c, name, 'x')}, (-1,))", f"{ops}.reshape"),
        "batch_flatten": (lambda c: "{o}.reshape({x}, ({o}.shape({x})[0], -1))".format(
            o=ops, x=_arg(c, name, "x")), f"{ops}.reshape"),
        "get_value": (lambda c: f"{ops}.convert_to_numpy({_arg(c, name, 'x')})",
                      f"{ops}.convert_to_numpy"),
        "eval": (lambda c: f"{ops}.convert_to_numpy({_arg(c, name, 'x')})",
                 f"{ops}.convert_to_numpy"),
        "batch_get_value": (lambda c: f"[{ops}.convert_to_numpy(v) for v in "
                                      f"{_arg(c, name, 'ops')}]", f"{ops}.convert_to_numpy"),
        "set_value": (lambda c: f"{_atom(_arg(c, name, 'x'))}.assign({_arg(c, name, 'value')})",
                      "x.assign"),
        "update": (lambda c: f"{_atom(_arg(c, name, 'x'))}.assign({_arg(c, name, 'new_x')})",
                   "x.assign"),
        "update_add": (lambda c: "{}.assign_add({})".format(
            _atom(_arg(c, name, "x")), _arg(c, name, "increment")), "x.assign_add"),
        "update_sub": (lambda c: "{}.assign_sub({})".format(
            _atom(_arg(c, name, "x")), _arg(c, name, "decrement")), "x.assign_sub"),
        "switch": (lambda c: "{}.where({}, {}, {})".format(
            ops, _arg(c, name, "condition"), _arg(c, name, "then_expression"),
            _arg(c, name, "else_expression")), f"{ops}.where"),
        "dtype": (lambda c: f"{keras}.backend.standardize_dtype({_atom(_arg(c, name, 'x'))}"
                            ".dtype)", f"{keras}.backend.standardize_dtype"),
        "constant": (lambda c: "{}.convert_to_tensor({}, dtype={})".format(
            ops, _arg(c, name, "value"), _arg(c, name, "dtype") or f"{keras}.backend.floatx()"),
            f"{ops}.convert_to_tensor"),
        "placeholder": (lambda c: _placeholder(c, keras), f"{keras}.Input"),
        "set_image_dim_ordering": (lambda c: "{}.backend.set_image_data_format({!r})".format(
            keras, {"th": "channels_first", "tf": "channels_last"}.get(
                nodes.string_value(_first(c, _params(name), "dim_ordering")) or "",
                "channels_last")), f"{keras}.backend.set_image_data_format"),
        # Keras 2.3: tile(expand_dims(x, 1), [1, n, 1]), x of shape (batch, features)
        "repeat": (lambda c: "{o}.repeat({o}.expand_dims({x}, 1), {n}, axis=1)".format(
            o=ops, x=_arg(c, name, "x"), n=_arg(c, name, "n")),
            f"{ops}.repeat({ops}.expand_dims(x, 1), n, axis=1)"),
        # channels_last (the only one let through): tf.nn.bias_add or x + reshape(bias,
        # (1,) + bias.shape), both the broadcast sum
        "bias_add": (lambda c: add.format(_atom(_arg(c, name, "x")),
                                          _atom(_arg(c, name, "bias"))), "x + bias"),
        "cast_to_floatx": (lambda c: f"{numpy}.asarray({_arg(c, name, 'x')}, "
                                     f"dtype={keras}.backend.floatx())",
                           f"{numpy}.asarray(x, dtype={keras}.backend.floatx())"),
        "image_dim_ordering": (lambda c: f"('th' if {keras}.backend.image_data_format() == "
                                         "'channels_first' else 'tf')",
                               f"{keras}.backend.image_data_format"),
    }
    if name not in builders:
        return None
    build, description = builders[name]
    return functools.partial(_expr_of, build=build), description


def _placeholder(call: cst.Call, keras: str) -> str:
    bound = nodes.bind(call, _params("placeholder")) or {}
    parts = [f"batch_shape={_code(bound['shape'].value)}"] if "shape" in bound else []
    parts += [f"{key}={_code(bound[key].value)}" for key in ("dtype", "sparse", "name")
              if key in bound]
    return f"{keras}.Input({', '.join(parts)})"
