"""The multi_gpu family's advice-only patterns: found and reported, never rewritten.

* A template built in `with tf.device('/cpu:0')` (the multi_gpu_model recipe): kerasmgpu
  places the replicas itself, the template no longer needs to live on the CPU.
* A `batch_size` multiplied by a GPU count: batch_size is the global batch in kerasmgpu,
  split across the replicas as multi_gpu_model did.

`MultiGpuAdvice` is the base of `MultiGpuRule` (`multi_gpu.py`), which keeps `functions`
(the defs being visited) and checks its assignments with `check_batch` and `gpuish`.
"""

from __future__ import annotations

import re
from typing import List, Optional, Set

import libcst as cst

from kerasmgpu.migrate import nodes, wrappers
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.multi_gpu_edits import _MGM

_TF_DEVICE = frozenset(
    {"tensorflow.device", "tensorflow.compat.v1.device", "tensorflow.compat.v2.device"}
)
# "/cpu:0", "cpu:0", "/CPU:0", "/device:CPU:0", "/job:localhost/replica:0/task:0/device:CPU:0".
_CPU0 = re.compile(r"(?:^|/)(?:device:)?cpu:0$", re.IGNORECASE)

MSG_CPU = (
    "{scope}: kerasmgpu places the replicas itself; the template no longer needs to live on "
    "the CPU (build the model outside this device scope)"
)
MSG_BATCH = (
    "{name} is multiplied by the GPU count; batch_size is the global batch in kerasmgpu "
    "(split across the replicas, as multi_gpu_model did): keep multiplying only if you want "
    "each GPU to see the old per-GPU batch"
)


class MultiGpuAdvice(Rule):
    """The advice half of the multi_gpu family: `MultiGpuRule` is this with the rewrites."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.gpu_names: Set[str] = {"G"}  # G = args["gpus"] is the pyimagesearch idiom
        self.functions: List[str] = []  # the defs being visited (MultiGpuRule keeps it)

    def visit_With(self, node: cst.With) -> None:
        if "make_parallel" in self.functions or _MGM in self.functions:
            return  # their own CPU merge scope: the def itself is advised already
        if self.ctx.target.modern and wrappers.inside_wrapper(self.ctx, node):
            return  # the wrappers family replaces the function around it
        for item in node.items:
            call = item.item
            if not isinstance(call, cst.Call) or not call.args:
                continue
            func_name = nodes.dotted(call.func) or ""
            is_tf_device = bool(self.ctx.qualified(call.func) & _TF_DEVICE) or (
                func_name == "tf.device" or func_name.endswith(".tf.device")
            )
            devices = _string_choices(call.args[0].value)
            if is_tf_device and any(_CPU0.search(device.strip()) for device in devices):
                scope = f"with {self.ctx.code(call)}"
                self.info(node, MSG_CPU.format(scope=scope))

    def gpuish(self, node: cst.BaseExpression) -> bool:
        """Whether an expression reads as a GPU count."""
        if isinstance(node, cst.Name):
            return "gpu" in node.value.lower() or node.value in self.gpu_names
        if isinstance(node, cst.Attribute):
            return "gpu" in node.attr.value.lower()
        if isinstance(node, cst.Subscript):
            key = _target_name(node)
            return key is not None and "gpu" in key.lower()
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.args:
            if node.func.value == "len":
                return "gpu" in self.ctx.code(node.args[0].value).lower()
            if node.func.value == "int":
                return self.gpuish(node.args[0].value)
        return False

    def gpu_product(self, node: cst.BaseExpression) -> bool:
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.args:
            if node.func.value in ("int", "round"):
                return self.gpu_product(node.args[0].value)
        factors = _mul_operands(node)
        return len(factors) > 1 and any(self.gpuish(factor) for factor in factors)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        name = _target_name(node.target)
        if (
            isinstance(node.operator, cst.MultiplyAssign)
            and name is not None
            and "batch" in name.lower()
            and self.gpuish(node.value)
        ):
            self.info(node, MSG_BATCH.format(name=name))

    def check_batch(
        self, node: cst.CSTNode, target: cst.BaseExpression, value: cst.BaseExpression
    ) -> None:
        name = _target_name(target)
        if name is not None and "batch" in name.lower() and self.gpu_product(value):
            self.info(node, MSG_BATCH.format(name=name))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None and node.keyword.value == "batch_size":
            if self.gpu_product(node.value):
                self.info(node.keyword, MSG_BATCH.format(name="batch_size"))


def _target_name(node: cst.CSTNode) -> Optional[str]:
    """The name an assignment target ends in: `batch_size`, `args.batch_size`, `cfg["bs"]`."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return node.attr.value
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        index = node.slice[0].slice
        if isinstance(index, cst.Index):
            return nodes.string_value(index.value)
    return None


def _string_choices(node: cst.BaseExpression) -> List[str]:
    """The string literals an expression can be: itself, or each branch of `a if c else b`.

    `tf.device("/cpu:0" if n > 1 else "/gpu:0")` builds the template on the CPU in the
    multi-GPU case, the one that matters here.
    """
    if isinstance(node, cst.IfExp):
        return _string_choices(node.body) + _string_choices(node.orelse)
    value = nodes.string_value(node)
    return [] if value is None else [value]


def _mul_operands(node: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The factors of `a * b * c` (one factor when `node` is not a product)."""
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _mul_operands(node.left) + _mul_operands(node.right)
    return [node]
