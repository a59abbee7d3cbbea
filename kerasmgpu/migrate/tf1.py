"""TensorFlow 1 sessions, configs and names, which TensorFlow 2 dropped.

`--to keras3` / `--to tf_keras`:

* The session boilerplate Keras 2.3 projects open with,

      config = tf.ConfigProto()
      config.gpu_options.allow_growth = True
      sess = tf.Session(config=config)
      K.set_session(sess)

  (also as one `set_session(tf.Session(config=...))`, with `tf.GPUOptions(...)`, through
  `keras.backend.tensorflow_backend`, `tf.compat.v1`...), becomes what each setting is in
  TensorFlow 2, at the place the config was made: `allow_growth=True` ->
  `tf.config.experimental.set_memory_growth` on every GPU; `log_device_placement` ->
  `tf.debugging.set_log_device_placement`; `intra/inter_op_parallelism_threads` ->
  `tf.config.threading...`; `device_count={'GPU': 0}` -> `tf.config.set_visible_devices([],
  'GPU')`; `allow_soft_placement=True` is TensorFlow 2's default (dropped, INFO). Settings
  with no TensorFlow 2 equivalent (`per_process_gpu_memory_fraction`, `visible_device_list`)
  are dropped with a WARNING that says what to use. The session, `set_session` and the config
  go. A session used for anything else (`sess.run(...)`) stays, with an ERROR.
* `tf.set_random_seed(s)` -> `tf.random.set_seed(s)`; `tf.reset_default_graph()` ->
  `keras.backend.clear_session()` (what Keras code called it for).
* Every other name TensorFlow 2 kept only in `tf.compat.v1` (`tf.log`, `tf.to_float`,
  `tf.random_normal`, `tf.variable_scope`, `tf.train.AdamOptimizer`...) ->
  `tf.compat.v1.<name>`, as `tf_upgrade_v2` does: the same function. Those that need graph
  mode (`tf.placeholder`, `tf.Session`, `K.get_session()`) are ERRORs.

`--to keras23` changes nothing here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst
import libcst.matchers as m

from kerasmgpu.migrate import nodes
from kerasmgpu.migrate.engine import Context, Rule
from kerasmgpu.migrate.report import Target

# Names in tf.compat.v1 that TensorFlow 2.21's `tf` does not have (dir(tf.compat.v1) -
# dir(tf)); the graph-only ones are errors, a few have a TF 2 spelling of their own.
V1_ONLY = frozenset("""
AUTO_REUSE AttrValue ConditionalAccumulator ConditionalAccumulatorBase ConfigProto Dimension
Event FIFOQueue FixedLenFeature FixedLenSequenceFeature FixedLengthRecordReader GPUOptions
GraphDef GraphKeys GraphOptions HistogramProto IdentityReader InteractiveSession LMDBReader
LogMessage MetaGraphDef NameAttrList NoGradient NodeDef NotDifferentiable OpError
OptimizerOptions PaddingFIFOQueue Print PriorityQueue QueueBase RandomShuffleQueue ReaderBase
RunMetadata RunOptions Session SessionLog SparseConditionalAccumulator SparseFeature
SparseTensorValue Summary SummaryMetadata TFRecordReader TensorInfo TextLineReader
VarLenFeature VariableScope WholeFileReader accumulate_n add_check_numerics_ops
add_to_collection add_to_collections all_variables angle app arg_max arg_min
assert_greater_equal assert_integer assert_less_equal assert_near assert_negative
assert_non_negative assert_non_positive assert_none_equal assert_positive
assert_proper_iterable assert_rank_at_least assert_rank_in assert_same_float_dtype
assert_scalar assert_type assert_variables_initialized assign assign_add assign_sub
batch_gather batch_scatter_update batch_to_space_nd betainc bincount ceil check_numerics
cholesky cholesky_solve clip_by_average_norm colocate_with confusion_matrix conj container
count_nonzero count_up_to create_partitioned_variables cross cumprod decode_base64
decode_compressed decode_csv decode_json_example decode_raw depth_to_space dequantize diag
diag_part digamma dimension_at_index dimension_value disable_eager_execution
disable_v2_behavior div div_no_nan enable_eager_execution enable_v2_behavior encode_base64
erf erfc expm1 extract_image_patches fft fft2d fft3d fixed_size_partitioner flags floor_div
floordiv floormod get_collection get_collection_ref get_default_graph get_default_session
get_local_variable get_seed get_variable get_variable_scope gfile global_norm
global_variables global_variables_initializer glorot_normal_initializer
glorot_uniform_initializer ifft ifft2d ifft3d igamma igammac imag initialize_all_tables
initialize_all_variables initialize_local_variables initialize_variables invert_permutation
is_finite is_inf is_nan is_non_decreasing is_numeric_tensor is_strictly_increasing
is_variable_initialized layers lbeta lgamma lin_space local_variables
local_variables_initializer log log1p log_sigmoid logging logical_xor make_template manip
matching_files matrix_band_part matrix_determinant matrix_diag matrix_diag_part
matrix_inverse matrix_set_diag matrix_solve matrix_solve_ls matrix_transpose
matrix_triangular_solve mod model_variables moving_average_variables multinomial
no_regularizer op_scope orthogonal_initializer parse_example parse_single_example
parse_single_sequence_example parse_tensor placeholder placeholder_with_default polygamma
py_func python_io qr quantize quantize_v2 quantized_concat random_crop random_gamma
random_normal random_poisson random_shuffle random_uniform read_file real reciprocal
reduce_join regex_replace report_uninitialized_variables reset_default_graph
resource_loader reverse_v2 rint rsqrt scatter_add scatter_div scatter_max scatter_min
scatter_mul scatter_nd_add scatter_nd_sub scatter_nd_update scatter_sub scatter_update
segment_max segment_mean segment_min segment_prod segment_sum self_adjoint_eig
self_adjoint_eigvals serialize_many_sparse serialize_sparse serialize_tensor set_random_seed
setdiff1d space_to_depth sparse_add sparse_concat sparse_fill_empty_rows sparse_mask
sparse_matmul sparse_maximum sparse_merge sparse_minimum sparse_placeholder sparse_reduce_max
sparse_reduce_max_sparse sparse_reduce_sum sparse_reduce_sum_sparse sparse_reorder
sparse_reset_shape sparse_reshape sparse_retain sparse_segment_mean sparse_segment_sqrt_n
sparse_segment_sum sparse_slice sparse_softmax sparse_split sparse_tensor_dense_matmul
sparse_tensor_to_dense sparse_to_dense sparse_to_indicator sparse_transpose spectral
squared_difference string_join string_split string_strip string_to_hash_bucket
string_to_hash_bucket_fast string_to_hash_bucket_strong string_to_number substr svd
tables_initializer tensor_scatter_add tensor_scatter_sub tensor_scatter_update to_bfloat16
to_complex128 to_complex64 to_double to_float to_int32 to_int64 trace trainable_variables
truncated_normal truncated_normal_initializer uniform_unit_scaling_initializer
unsorted_segment_max unsorted_segment_mean unsorted_segment_min unsorted_segment_prod
unsorted_segment_sqrt_n unsorted_segment_sum variable_axis_size_partitioner
variable_op_scope variable_scope variables_initializer variance_scaling_initializer
verify_tensor_all_finite where_v2 write_file zeta
""".split())
# tf.train's optimizers and friends went to tf.compat.v1.train.
V1_TRAIN = frozenset({"AdamOptimizer", "GradientDescentOptimizer", "MomentumOptimizer",
                      "RMSPropOptimizer", "AdagradOptimizer", "AdadeltaOptimizer",
                      "Optimizer", "Saver", "get_or_create_global_step", "get_global_step",
                      "exponential_decay", "piecewise_constant", "polynomial_decay"})
GRAPH_ONLY = {
    "placeholder": "use keras.Input(shape=...) (no batch dimension) in a model",
    "sparse_placeholder": "use keras.Input(sparse=True)",
    "Session": "TensorFlow 2 runs eagerly: call the model or the function directly",
    "InteractiveSession": "TensorFlow 2 runs eagerly: drop it",
    "get_default_session": "TensorFlow 2 runs eagerly: there is no session",
}
TF_ROOTS = ("tensorflow", "tensorflow.compat.v1")
KERAS_SESSION = ("keras.backend.set_session", "keras.backend.tensorflow_backend.set_session")

MSG_V1 = "{old} -> {new}: TensorFlow 2 keeps it only in tf.compat.v1 (the same function)"
MSG_GRAPH = "{old} needs TensorFlow 1 graph mode: {advice}"
MSG_SESSION = "TF1 session setup -> TensorFlow 2 settings: {done}"
MSG_SESSION_USED = (
    "`{name}`, the tf.Session made from this config, is used beyond setting it up, so the "
    "TF1 setup was left; TensorFlow 2 runs eagerly ({target} has no session): run that code "
    "eagerly, and set the config's options with tf.config (allow_growth: "
    "tf.config.experimental.set_memory_growth)"
)
MSG_GET_SESSION = (
    "K.get_session(): modern Keras has no TensorFlow session: run eagerly (tensors have "
    ".numpy(), variables .assign()), or tf.compat.v1 graph code outside Keras"
)
DROPPED = {
    "per_process_gpu_memory_fraction": "per_process_gpu_memory_fraction has no TensorFlow 2 "
    "equivalent (TF 2 takes a size): use tf.config.set_logical_device_configuration(gpu, "
    "[tf.config.LogicalDeviceConfiguration(memory_limit=MB)]) or memory growth",
    "visible_device_list": "visible_device_list: set CUDA_VISIBLE_DEVICES before TensorFlow "
    "starts, or call tf.config.set_visible_devices",
}


@dataclass
class _Setup:
    """One TF1 session setup found in a block."""

    config: Optional[str] = None
    anchor: Optional[cst.SimpleStatementLine] = None  # where the TF 2 lines go
    settings: Dict[str, cst.BaseExpression] = field(default_factory=dict)
    statements: List[cst.SimpleStatementLine] = field(default_factory=list)
    session: Optional[str] = None
    session_node: Optional[cst.SimpleStatementLine] = None
    done: bool = False  # a set_session call closes it


class TF1Rule(Rule):
    NAME = "tf1"
    TARGETS = frozenset({Target.KERAS3, Target.TF_KERAS})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.handled: Set[int] = set()  # id() of nodes the session rewrite removes
        self.session_names: Set[str] = set()

    # -- names -----------------------------------------------------------------------
    def tf_name(self, node: cst.CSTNode) -> Optional[Tuple[str, str]]:
        """(root, name) for `tf.<name>` / `tf.compat.v1.<name>` / `tf.train.<name>`."""
        for qualified in self.ctx.qualified(node):
            for root in TF_ROOTS:
                if qualified.startswith(root + "."):
                    rest = qualified[len(root) + 1:]
                    if "." not in rest or rest.startswith("train."):
                        return root, rest
        return None

    def visit_Attribute(self, node: cst.Attribute) -> None:
        found = self.tf_name(node)
        if found is None or id(node) in self.handled:
            return
        root, name = found
        if name.startswith("train."):
            if root == "tensorflow" and name[6:] in V1_TRAIN:
                self.to_v1(node, name)
            return
        if root != "tensorflow" or name not in V1_ONLY:
            if name in GRAPH_ONLY and not self.in_setup(node):
                self.error(node, MSG_GRAPH.format(old=self.ctx.code(node),
                                                  advice=GRAPH_ONLY[name]))
            return
        if name in GRAPH_ONLY:
            if not self.in_setup(node):
                self.error(node, MSG_GRAPH.format(old=self.ctx.code(node),
                                                  advice=GRAPH_ONLY[name]))
        elif name == "set_random_seed":
            self.replace_func(node, "random.set_seed")
        elif name == "reset_default_graph":
            keras = self.ctx.keras_module(node)
            self.ctx.replace(node, nodes.attr_chain(f"{keras}.backend.clear_session"))
            self.info(node, f"{self.ctx.code(node)} -> {keras}.backend.clear_session: Keras "
                      "code reset the graph to drop old models")
        elif name not in ("ConfigProto", "GPUOptions") or not self.in_setup(node):
            self.to_v1(node, name)

    def replace_func(self, node: cst.Attribute, new: str) -> None:
        head = self.ctx.code(node).rsplit(".", 1)[0]
        self.ctx.replace(node, nodes.attr_chain(f"{head}.{new}"))
        self.info(node, f"{self.ctx.code(node)} -> {head}.{new}")

    def to_v1(self, node: cst.Attribute, name: str) -> None:
        code = self.ctx.code(node)
        head = code[: len(code) - len(name)].rstrip(".")
        new = f"{head}.compat.v1.{name}"
        self.ctx.replace(node, nodes.attr_chain(new))
        self.info(node, MSG_V1.format(old=code, new=new))

    def in_setup(self, node: cst.CSTNode) -> bool:
        current: Optional[cst.CSTNode] = node
        while current is not None:
            if id(current) in self.handled:
                return True
            current = self.ctx.parent(current)
        return False

    def visit_Call(self, node: cst.Call) -> None:
        for name in self.ctx.keras_names(node.func):
            if name in ("keras.backend.get_session",
                        "keras.backend.tensorflow_backend.get_session"):
                self.error(node, MSG_GET_SESSION)

    # -- the session setup -----------------------------------------------------------
    def visit_Module(self, node: cst.Module) -> None:
        self.scan(node.body)

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        self.scan(node.body)

    def scan(self, body: Sequence[cst.BaseStatement]) -> None:
        setup = _Setup()
        for stmt in body:
            if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
                continue
            small = stmt.body[0]
            if self.config_assign(small, stmt, setup) or self.config_set(small, stmt, setup):
                continue
            if self.session_assign(small, stmt, setup):
                continue
            if self.set_session(small, stmt, setup):
                self.finish_setup(setup)
                setup = _Setup()
        if setup.session_node is not None and setup.config is not None and not setup.done:
            # A session made from the config and never set: in TensorFlow 1 the first
            # session's GPU options configured the process's GPUs, which is what the
            # TensorFlow 2 settings do (when nothing else uses the session).
            setup.statements.append(setup.session_node)
            self.finish_setup(setup)

    def is_call_of(self, node: Optional[cst.BaseExpression], names: Tuple[str, ...]) -> bool:
        if not isinstance(node, cst.Call):
            return False
        found = self.tf_name(node.func)
        return found is not None and found[1] in names

    def config_assign(self, small: cst.BaseSmallStatement, stmt: cst.SimpleStatementLine,
                      setup: _Setup) -> bool:
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and self.is_call_of(small.value, ("ConfigProto",))):
            return False
        assert isinstance(small.value, cst.Call)
        setup.config = small.targets[0].target.value
        setup.anchor = stmt
        setup.statements.append(stmt)
        self.read_config_call(small.value, setup)
        return True

    def read_config_call(self, call: cst.Call, setup: _Setup) -> None:
        for arg in call.args:
            key = nodes.keyword(arg)
            if key == "gpu_options" and self.is_call_of(arg.value, ("GPUOptions",)):
                assert isinstance(arg.value, cst.Call)
                for inner in arg.value.args:
                    setup.settings[nodes.keyword(inner) or "?"] = inner.value
            elif key is not None:
                setup.settings[key] = arg.value
            else:
                setup.settings["?"] = arg.value

    def config_set(self, small: cst.BaseSmallStatement, stmt: cst.SimpleStatementLine,
                   setup: _Setup) -> bool:
        if setup.config is None or not isinstance(small, cst.Assign) or len(small.targets) != 1:
            return False
        target = nodes.dotted(small.targets[0].target) or ""
        for prefix in (f"{setup.config}.gpu_options.", f"{setup.config}."):
            if target.startswith(prefix) and "." not in target[len(prefix):]:
                setup.settings[target[len(prefix):]] = small.value
                setup.statements.append(stmt)
                return True
        return False

    def session_assign(self, small: cst.BaseSmallStatement, stmt: cst.SimpleStatementLine,
                       setup: _Setup) -> bool:
        if not (isinstance(small, cst.Assign) and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and self.is_call_of(small.value, ("Session",))):
            return False
        assert isinstance(small.value, cst.Call)
        if not self.session_config(small.value, setup):
            return False
        setup.session = small.targets[0].target.value
        setup.session_node = stmt
        return True

    def session_config(self, call: cst.Call, setup: _Setup) -> bool:
        """Whether the Session is made from the config seen (or a ConfigProto call)."""
        config = nodes.kwarg_value(call, "config") or (call.args[0].value if call.args and (
            call.args[0].keyword is None) else None)
        if config is None:
            return len(call.args) == 0
        if m.matches(config, m.Name(setup.config)):
            return True
        if self.is_call_of(config, ("ConfigProto",)):
            assert isinstance(config, cst.Call)
            self.read_config_call(config, setup)
            return True
        return False

    def set_session(self, small: cst.BaseSmallStatement, stmt: cst.SimpleStatementLine,
                    setup: _Setup) -> bool:
        if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
            return False
        call = small.value
        names = self.ctx.keras_names(call.func) | {
            n for n in self.ctx.qualified(call.func)
            if n.endswith("keras.backend.set_session")}
        if not any(n in KERAS_SESSION or n.endswith("backend.set_session") for n in names):
            return False
        if len(call.args) != 1:
            return False
        value = call.args[0].value
        if m.matches(value, m.Name(setup.session)):
            pass
        elif self.is_call_of(value, ("Session",)):
            assert isinstance(value, cst.Call)
            if not self.session_config(value, setup):
                return False
            if setup.anchor is None:
                setup.anchor = stmt
        else:
            return False
        if setup.session_node is not None:
            setup.statements.append(setup.session_node)
        setup.statements.append(stmt)
        if setup.anchor is None:
            setup.anchor = stmt
        if isinstance(call.func, cst.Name):
            self.ctx.claimed.add(call.func.value)
        setup.done = True
        return True

    def finish_setup(self, setup: _Setup) -> None:
        if setup.session is not None and self.session_used(setup):
            assert setup.session_node is not None
            target = "Keras 3" if self.ctx.target is Target.KERAS3 else "tf_keras"
            self.error(setup.session_node, MSG_SESSION_USED.format(name=setup.session,
                                                                   target=target))
            # That ERROR is the session's: no second one for its `tf.Session` name.
            self.handled.update(id(n) for n in _walk(setup.session_node))
            return
        assert setup.anchor is not None
        tf = self.ctx.module_name("tensorflow", setup.anchor, alias="tf")
        lines, done = _tf2_lines(setup.settings, tf)
        for statement in setup.statements:
            self.handled.update(id(n) for n in _walk(statement))
            self.ctx.removed.update(id(n) for n in _walk(statement))
            if statement is setup.anchor:
                self.ctx.edit(statement, functools.partial(_replace_with, lines=lines))
            else:
                self.ctx.edit(statement, _remove)
        self.info(setup.anchor, MSG_SESSION.format(done="; ".join(d for d, _ in done if not _)
                                                   or "nothing to set"))
        for message, warn in done:
            if warn:
                self.warning(setup.anchor, message)

    def session_used(self, setup: _Setup) -> bool:
        assert setup.session_node is not None
        scope = self.ctx.scopes.get(setup.session_node.body[0])
        if scope is None or setup.session is None:
            return True
        handled = {id(n) for s in [*setup.statements, setup.session_node] for n in _walk(s)}
        for assignment in scope.assignments[setup.session]:
            for access in assignment.references:
                if id(access.node) not in handled:
                    return True
        return False


RULE = TF1Rule


def _walk(node: cst.CSTNode) -> List[cst.CSTNode]:
    found: List[cst.CSTNode] = []

    class Collect(cst.CSTVisitor):
        def on_visit(self, inner: cst.CSTNode) -> bool:
            found.append(inner)
            return True

    node.visit(Collect())
    return found


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


def _tf2_lines(settings: Dict[str, cst.BaseExpression], tf: str
               ) -> Tuple[List[str], List[Tuple[str, bool]]]:
    """TensorFlow 2 statements for a TF1 session config, and (what was done, is warning)."""
    lines: List[str] = []
    done: List[Tuple[str, bool]] = []
    for key, value in settings.items():
        code = _code(value)
        if key == "allow_growth":
            if code == "True":
                lines.append(f'for gpu in {tf}.config.list_physical_devices("GPU"):\n'
                             f"    {tf}.config.experimental.set_memory_growth(gpu, True)")
                done.append(("allow_growth -> set_memory_growth on every GPU", False))
        elif key == "log_device_placement":
            lines.append(f"{tf}.debugging.set_log_device_placement({code})")
            done.append(("log_device_placement -> tf.debugging.set_log_device_placement",
                         False))
        elif key in ("intra_op_parallelism_threads", "inter_op_parallelism_threads"):
            setter = key.replace("_parallelism_threads", "")
            lines.append(f"{tf}.config.threading.set_{setter}_parallelism_threads({code})")
            done.append((f"{key} -> tf.config.threading", False))
        elif key == "allow_soft_placement":
            done.append(("allow_soft_placement: TensorFlow 2's default", False))
        elif key == "device_count" and "'GPU': 0" in code.replace('"', "'"):
            lines.append(f'{tf}.config.set_visible_devices([], "GPU")')
            done.append(("device_count GPU 0 -> tf.config.set_visible_devices([], 'GPU')",
                         False))
        elif key in DROPPED:
            done.append((f"{key}={code} dropped: {DROPPED[key]}", True))
        else:
            done.append((f"{key}={code} dropped: no TensorFlow 2 setting is known for it",
                         True))
    return lines, done


def _replace_with(updated: cst.CSTNode, lines: List[str]
                  ) -> cst.FlattenSentinel | cst.RemovalSentinel:
    if not lines:
        return cst.RemovalSentinel.REMOVE
    assert isinstance(updated, cst.SimpleStatementLine)
    statements = [cst.parse_statement(line + "\n") for line in lines]
    statements[0] = statements[0].with_changes(leading_lines=updated.leading_lines)
    return cst.FlattenSentinel(statements)


def _remove(updated: cst.CSTNode) -> cst.RemovalSentinel:
    return cst.RemovalSentinel.REMOVE
