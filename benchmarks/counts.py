"""Counts, not times: what a step of kerasmgpu's fit costs beside the engine written by hand.

    KERASMGPU_VIRTUAL_DEVICES=2 python benchmarks/counts.py [--models mlp,convnet,lstm,transformer]
        [--cases even,padded] [--json FILE]
    kerasmgpu launch --nproc 2 benchmarks/counts.py ...        (Keras 3 on PyTorch)

Run it once per route, in that route's environment (the active Keras decides): Keras 3
on JAX, Keras 3 on TensorFlow, tf_keras / tf.keras 2, Keras 3 on PyTorch. The
hand-written engine is `benchmarks/suite.py`'s (`by_hand`): `DataParallel`,
`MirroredStrategy`, or Keras's own fit per process with one hand all-reduce per step.

Timing on a shared 2-core CPU cannot settle a few per cent; counts are exact under any
load. Each contender fits the model of `benchmarks/_common.py` (global batch 64 on 2
replicas; `even`: every batch divides, `padded`: kerasmgpu's epoch ends with a batch
of 1 row, padded and masked, the hand-written engine's with 2 rows, which it can take)
once to compile, then fits of 3 and 9 steps (one epoch) and of 2 epochs of 3 steps.
Per step is (count of the 9-step fit - count of the 3-step fit) / 6 - the full steps;
per epoch and per fit what is left. Counted:

* **collectives** and their bytes per step (and per epoch, per fit): JAX - the
  all-reduces (all-gathers, ...) of the compiled step's HLO, times the step's runs;
  TensorFlow - the strategy's `reduce_to` / `batch_reduce_to` calls of the traced step
  (and any run eagerly), each value's bytes on one replica; torch - every
  `torch.distributed` call;
* **programs** compiled (JAX, XLA's dump of `jit_train_step`) or traced (TensorFlow,
  `experimental_get_tracing_count` of Keras's train function) after the first fit;
* **ops** of the step program that ran the full batches, and of the one that ran the
  padded batch: JAX - HLO instructions of the optimized module (compute: all but
  parameter, constant, tuple, get-tuple-element, bitcast); TensorFlow - nodes of the
  traced step's graph and of the functions it calls (compute: all but constants,
  identities, placeholders, variable reads, call wrappers, iterator reads and shape
  queries); torch - the torch functions a step calls (`torch.overrides.TorchFunctionMode`);
  "diff" counts the ops that are not matched one for one by type;
* **masked** runs: steps that ran a program fed kerasmgpu's packing (the masked step);
* **Python calls** per step (every call and C call in every thread, `sys.setprofile`),
  and of those the frames (Python functions);
* **host-to-device transfers** per step: JAX - arrays handed to
  `jax.make_array_from_process_local_data` / `jax.device_put`; TensorFlow - the tensors
  of the iterator's element that the step reads; torch - the arrays of the batch
  handed to the step; and their bytes.

Gates (issue 32; exit 1 where one is missed): collectives and bytes per step equal the
hand-written engine's (a few scalars' bytes allowed); no program compiled or traced
after the first fit; the full-batch step's compute ops within 1.02x, the padded one's
within 1.50x of the hand-written program that ran the same batch, and no full batch
masked; Python calls per step within 1.10x; transfers per step equal. On torch also
the collectives per epoch and per fit beyond the hand-written fit's, each named
(`TORCH_EXTRAS`). Each (model, case) runs in its own process off torch (as in
`suite.py`); each line's figures come from one run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

os.environ.setdefault("KERASMGPU_VIRTUAL_DEVICES", "2")
DUMP = os.environ.get("KERASMGPU_COUNTS_DUMP")
if os.environ.get("KERAS_BACKEND") == "jax":
    flags = os.environ.get("XLA_FLAGS", "")
    if "multi_thread_eigen" not in flags:  # see suite.py: fewer XLA all-reduce stalls
        flags += " --xla_cpu_multi_thread_eigen=false"
    if DUMP:
        flags += f" --xla_dump_to={DUMP} --xla_dump_hlo_as_text"
    os.environ["XLA_FLAGS"] = flags.strip()

from _common import MODELS, compile_model, keras_module, model_data  # noqa: E402
from suite import by_hand  # noqa: E402

import kerasmgpu  # noqa: E402

BATCH = 64
# The rows of a replica's full batch: the bytes of a batch axis a trace left unknown.
ROWS = [BATCH // 2]
PACKING = "kerasmgpu_packing"  # kerasmgpu.data.bundle.PACKING_KEY: a masked step's input
# Gates (issue 32, "Done when").
FULL_OPS, PADDED_OPS, PY_CALLS = 1.02, 1.50, 1.10
SCALAR_BYTES = 64  # "a few scalars allowed" beside equal collectives
# torch: the collectives kerasmgpu's fit makes beyond the hand-written fit's, each what
# correctness needs (docs/performance.md says why).
TORCH_EXTRAS = {
    "per fit": {"callbacks agreement (note_callbacks: every process sums per step alike)": 1},
    "per epoch": {"metric sums (History holds the global figures)": 1},
}


# --- what one fit did ----------------------------------------------------------------------


@dataclass
class Program:
    """One compiled or traced step program."""

    masked: bool
    ops: int = 0
    compute: int = 0
    histogram: Dict[str, int] = field(default_factory=dict)
    collectives: List[int] = field(default_factory=list)  # bytes of each


@dataclass
class Log:
    """What the fit being counted did: its steps (program key each), the collectives
    run outside a program, the transfers, the torch ops, the programs it made."""

    steps: List[Tuple[int, str]] = field(default_factory=list)  # (model id, key)
    eager: List[int] = field(default_factory=list)
    transfers: List[int] = field(default_factory=list)
    ops: int = 0
    new_programs: int = 0


LOG = Log()
PROGRAMS: Dict[Tuple[int, str], Program] = {}
# While Keras's step function runs (its replicas' threads included): a reduction made
# then belongs to the program being traced.
_tracing = {"on": False}
_nested = threading.local()


def nbytes(value: Any, like: Any = None) -> int:
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return 0
    known = getattr(like, "shape", None)
    if known is not None and None in tuple(shape) and None not in tuple(known):
        shape = known
    size = getattr(dtype, "itemsize", None) or getattr(dtype, "size", None)
    if size is None:
        import numpy as np

        size = np.dtype(str(getattr(dtype, "name", dtype))).itemsize
    count = 1
    for dim in shape:
        count *= int(dim) if dim is not None else ROWS[0]  # a dynamic batch: a full one's
    return count * int(size)


class Recorder:
    """Keras's step function of one model (`model.train_function`), recording each call:
    which program ran (its input's structure and shapes) and what a call compiled."""

    def __init__(self, model: Any, original: Any, probe: Probe) -> None:
        self.model_id, self.original, self.probe = id(model), original, probe

    def __call__(self, *args: Any) -> Any:
        return self.probe.call(self, *args)


# --- per route: how programs, collectives and transfers are seen ---------------------------


class Probe:
    backend = ""

    def __init__(self) -> None:
        self.restore: List[Tuple[Any, str, Any]] = []  # (owner, name, what it held)

    def patch(self, owner: Any, name: str, value: Any) -> None:
        self.restore.append((owner, name, owner.__dict__[name] if name in vars(owner)
                             else None))
        setattr(owner, name, value)

    def uninstall(self) -> None:
        """Undo `install` and `watch_strategy` (a test's process goes on)."""
        for owner, name, held in reversed(self.restore):
            if held is None:
                delattr(owner, name)
            else:
                setattr(owner, name, held)
        self.restore.clear()

    def install(self, keras: Any) -> None:
        original = keras.Model.make_train_function
        probe = self

        def make_train_function(model: Any, force: bool = False) -> Any:
            before = model.train_function
            made = original(model, force)
            if model.train_function is not before:  # Keras made a new one: record it
                model.train_function = Recorder(model, model.train_function, probe)
            return model.train_function if made is not None else made

        self.patch(keras.Model, "make_train_function", make_train_function)

    def call(self, recorder: Recorder, *args: Any) -> Any:
        raise NotImplementedError

    def counting(self) -> Any:
        """Patches that count transfers and collectives while a fit is counted."""
        import contextlib

        return contextlib.nullcontext()


class JaxProbe(Probe):
    backend = "jax"
    _MODULE = re.compile(r"^module_\d+\.jit_(train|stateless)_step\.[^-]*after_optimizations\.txt$")

    def __init__(self) -> None:
        super().__init__()
        self.seen: set = set()

    def _new_modules(self) -> List[str]:
        found = [f for f in os.listdir(DUMP or ".") if self._MODULE.match(f)] if DUMP else []
        new = sorted(f for f in found if f not in self.seen)
        self.seen.update(new)
        return new

    def call(self, recorder: Recorder, state: Any, iterator: Any) -> Any:
        batch: List[Any] = []

        class Peek:
            def __iter__(self) -> Any:
                return self

            def __next__(self) -> Any:
                batch.append(next(iterator))
                return batch[-1]

        self._new_modules()
        if isinstance(iterator, (list, tuple)):
            # Keras 3.3 - 3.7 hand the step its batches, not an iterator.
            batch.extend(iterator)
            result = recorder.original(state, iterator)
        else:
            result = recorder.original(state, Peek())
        import jax

        leaves, tree = jax.tree_util.tree_flatten(batch[0])
        key = f"{tree} {[tuple(getattr(leaf, 'shape', ())) for leaf in leaves]}"
        LOG.steps.append((recorder.model_id, key))
        for name in self._new_modules():
            with open(os.path.join(DUMP or ".", name)) as f:
                PROGRAMS[(recorder.model_id, key)] = hlo_program(f.read(), PACKING in key)
            LOG.new_programs += 1
        # Without XLA's dump (a test): which steps were masked, no HLO.
        PROGRAMS.setdefault((recorder.model_id, key), Program(PACKING in key))
        return result

    def counting(self) -> Any:
        import contextlib

        import jax

        @contextlib.contextmanager
        def patched() -> Any:
            # `make_array_from_process_local_data` is JAX 0.4.27+ (Keras 3.3's pin
            # predates it: its fit hands the data to `device_put` alone).
            originals = {n: getattr(jax, n) for n in ("make_array_from_process_local_data",
                                                      "device_put") if hasattr(jax, n)}

            def wrap(fn: Callable[..., Any], data_at: int) -> Callable[..., Any]:
                def counted(*args: Any, **kwargs: Any) -> Any:
                    data = args[data_at] if len(args) > data_at else None
                    if data is not None:
                        LOG.transfers.extend(nbytes(leaf) for leaf in
                                             jax.tree_util.tree_leaves(data))
                    return fn(*args, **kwargs)
                return counted

            if "make_array_from_process_local_data" in originals:
                jax.make_array_from_process_local_data = wrap(
                    originals["make_array_from_process_local_data"], 1)
            jax.device_put = wrap(originals["device_put"], 0)
            try:
                yield
            finally:
                for name, fn in originals.items():
                    setattr(jax, name, fn)

        return patched()


def hlo_program(text: str, masked: bool) -> Program:
    """Instructions of an optimized HLO module (every computation), by opcode."""
    line = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(\(.*?\)|\S+)\s+([a-z][\w\-]*)\(")
    program = Program(masked)
    histogram: Counter = Counter()
    for text_line in text.splitlines():
        found = line.match(text_line)
        if not found:
            continue
        shape, opcode = found.groups()
        histogram[opcode] += 1
        if opcode.startswith(("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                              "collective-permute")) and not opcode.endswith("-done"):
            program.collectives.append(hlo_bytes(shape))
    bookkeeping = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
    program.histogram = dict(histogram)
    program.ops = sum(histogram.values())
    program.compute = sum(n for op, n in histogram.items() if op not in bookkeeping)
    return program


def hlo_bytes(shape: str) -> int:
    sizes = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2,
             "s16": 2, "u16": 2, "s8": 1, "u8": 1, "pred": 1}
    total = 0
    for dtype, dims in re.findall(r"([a-z]+\d*)\[([\d,]*)\]", shape):
        count = 1
        for dim in filter(None, dims.split(",")):
            count *= int(dim)
        total += count * sizes.get(dtype, 4)
    return total


class TfProbe(Probe):
    backend = "tensorflow"
    _BOOKKEEPING = {"Const", "Identity", "IdentityN", "NoOp", "Placeholder", "_Arg", "_Retval",
                    "StopGradient", "ReadVariableOp", "VarHandleOp", "PartitionedCall",
                    "StatefulPartitionedCall", "MultiDeviceIteratorGetNextFromShard",
                    "IteratorGetNext", "IteratorGetNextAsOptional", "OptionalGetValue",
                    "OptionalHasValue", "Shape", "ShapeN", "Size", "Rank"}

    def __init__(self) -> None:
        super().__init__()
        self.collectives: List[Tuple[int, int]] = []  # (graph, bytes) of the call's traces

    def call(self, recorder: Recorder, iterator: Any) -> Any:
        import tensorflow as tf

        functions = traced_functions(recorder.original)
        traced = sum(f.experimental_get_tracing_count() for f in functions)
        self.collectives = []
        _tracing["on"] = True
        try:
            result = recorder.original(iterator)
        finally:
            _tracing["on"] = False
        spec = getattr(iterator, "element_spec", None)
        key = str(spec)
        LOG.steps.append((recorder.model_id, key))
        LOG.transfers.extend(nbytes(s) for s in tf.nest.flatten(spec, expand_composites=True))
        if sum(f.experimental_get_tracing_count() for f in functions) != traced:
            # The function of the iterator: the whole step program (the replicas' step,
            # a function it calls, included).
            outer = [f for f in functions if first_parameter(f.python_function) == "iterator"]
            graph = outer[0].get_concrete_function(iterator).graph
            program = self.graph_program(graph.as_graph_def(), PACKING in key)
            last = self.collectives[-1][0] if self.collectives else None
            program.collectives = [size for graph, size in self.collectives if graph == last]
            PROGRAMS[(recorder.model_id, key)] = program
            LOG.new_programs += 1
        return result

    def graph_program(self, graph_def: Any, masked: bool) -> Program:
        histogram: Counter = Counter(node.op for node in graph_def.node)
        for function in graph_def.library.function:
            histogram.update(node.op for node in function.node_def)
        program = Program(masked, histogram=dict(histogram))
        program.ops = sum(histogram.values())
        program.compute = sum(n for op, n in histogram.items() if op not in self._BOOKKEEPING)
        return program

    def watch_strategy(self, strategy: Any) -> None:
        """Count the strategy's reductions (its class's public methods): in a trace they
        belong to the program being traced, else they ran eagerly in the fit."""
        extended = type(strategy.extended)
        if any(owner is extended for owner, _, _ in self.restore):
            return
        probe = self

        def wrap(name: str) -> None:
            original = getattr(extended, name)

            def counted(this: Any, reduce_op: Any, *args: Any, **kwargs: Any) -> Any:
                if getattr(_nested, "depth", 0):  # one reduction calling the other
                    return original(this, reduce_op, *args, **kwargs)
                if name == "batch_reduce_to":
                    pairs = list(args[0] if args else kwargs["value_destination_pairs"])
                else:
                    pairs = [(args[0] if args else kwargs["value"],
                              args[1] if len(args) > 1 else kwargs.get("destinations"))]
                # A value's bytes on one replica; its destination's shape (a variable's,
                # static) where the value's is not known in a trace.
                sizes = [nbytes(getattr(value, "values", [value])[0], like=destination)
                         for value, destination in pairs]
                import tensorflow as tf

                # In a trace of Keras's step function: the program's, run at every step
                # (by graph: tf.function traces twice where the first trace creates
                # variables, and only the last trace is the program).
                if _tracing["on"] and tf.inside_function():
                    graph = id(tf.compat.v1.get_default_graph())
                    probe.collectives.extend((graph, size) for size in sizes)
                else:
                    LOG.eager.extend(sizes)
                _nested.depth = 1
                try:
                    return original(this, reduce_op, *args, **kwargs)
                finally:
                    _nested.depth = 0

            self.patch(extended, name, counted)

        wrap("reduce_to")
        wrap("batch_reduce_to")


def traced_functions(function: Any, depth: int = 3) -> List[Any]:
    """The tf.functions a step function is or calls through its closure (Keras 3 wraps
    a tf.function of the iterator, which calls one of the data, in a Python function;
    tf.keras's is the tf.function itself)."""
    if hasattr(function, "experimental_get_tracing_count"):
        inner = getattr(function, "python_function", None)
        return [function] + (traced_functions(inner, depth - 1) if depth and inner else [])
    found: List[Any] = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if callable(value) and depth:
            found.extend(f for f in traced_functions(value, depth - 1) if f not in found)
    return found


def first_parameter(function: Any) -> str:
    import inspect

    try:
        return next(iter(inspect.signature(function).parameters), "")
    except (TypeError, ValueError):
        return ""


class TorchProbe(Probe):
    backend = "torch"
    _COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                    "reduce_scatter", "reduce", "barrier", "all_gather_object",
                    "broadcast_object_list", "all_to_all")

    def call(self, recorder: Recorder, data: Any) -> Any:
        import torch

        leaves = [leaf for leaf in _leaves(data) if hasattr(leaf, "shape")]
        shapes = [tuple(leaf.shape) for leaf in leaves]
        key = f"{_structure(data)} {shapes}"
        LOG.steps.append((recorder.model_id, key))
        LOG.transfers.extend(nbytes(leaf) if not isinstance(leaf, torch.Tensor)
                             else leaf.numel() * leaf.element_size() for leaf in leaves)
        if (recorder.model_id, key) not in PROGRAMS:
            PROGRAMS[(recorder.model_id, key)] = Program(PACKING in key)
        return recorder.original(data)

    def counting(self) -> Any:
        import contextlib

        import torch
        import torch.distributed as dist

        class Ops(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: Any = (),
                                   kwargs: Any = None) -> Any:
                LOG.ops += 1
                return func(*args, **(kwargs or {}))

        @contextlib.contextmanager
        def patched() -> Any:
            originals = {n: getattr(dist, n) for n in self._COLLECTIVES if hasattr(dist, n)}

            def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
                def counted(*args: Any, **kwargs: Any) -> Any:
                    tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
                    LOG.eager.append(0 if tensor is None else
                                     tensor.numel() * tensor.element_size())
                    return fn(*args, **kwargs)
                return counted

            for name, fn in originals.items():
                setattr(dist, name, wrap(fn))
            try:
                with Ops():
                    yield
            finally:
                for name, fn in originals.items():
                    setattr(dist, name, fn)

        return patched()


def _leaves(data: Any) -> List[Any]:
    if isinstance(data, dict):
        return [leaf for key in data for leaf in _leaves(data[key])]
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in _leaves(item)]
    return [] if data is None else [data]


def _structure(data: Any) -> str:
    if isinstance(data, dict):
        return "{" + ",".join(f"{k}:{_structure(v)}" for k, v in data.items()) + "}"
    if isinstance(data, (list, tuple)):
        return "(" + ",".join(_structure(v) for v in data) + ")"
    return "*"


# --- Python calls ------------------------------------------------------------------------


class Calls:
    """Every Python call and C call, and the Python frames, in every thread."""

    def __init__(self) -> None:
        self.calls = self.frames = 0
        self.named: Counter = Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            self.calls += 1
            self.frames += 1
            name = frame.f_code.co_name
            if name in ("make_array_from_process_local_data", "device_put"):
                self.named[name] += 1
        elif event == "c_call":
            self.calls += 1


def python_calls(fit: Callable[[], Any]) -> Calls:
    calls = Calls()
    threading.setprofile(calls)
    sys.setprofile(calls)
    try:
        fit()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return calls


# --- one contender: three fits, counted twice ---------------------------------------------


# (steps, epochs) of the counted fits: A and B give the figures per step, C (where
# present) those per epoch and per fit.
FITS = {"A": (3, 1), "B": (9, 1), "C": (3, 2)}


def measure(probe: Probe, model: Any, fit: Callable[[int, int], Any],
            fits: Dict[str, Tuple[int, int]]) -> Dict[str, Any]:
    """The counts of one contender (`fit(steps, epochs)` fits it, `model` is the Keras
    model whose train function runs). Its first fit compiled already."""
    out: Dict[str, Any] = {"fits": fits}
    recorder = model.train_function
    global LOG
    for name, (steps, epochs) in fits.items():
        # Python calls without the recorder between Keras and its step function.
        model.train_function = recorder.original
        try:
            # Calls are counted in every thread, so anything else the process runs
            # meanwhile counts too: a garbage collection freeing earlier objects (their
            # finalizers), another thread's work. Each only adds calls, so the fewer of
            # two fits is the fit's own (one CI run counted 1.46x the hand-written fit's
            # calls per step where every other run, before and after, counted under 1.1x).
            gc.collect()
            calls = min((python_calls(lambda s=steps, e=epochs: fit(s, e)) for _ in range(2)),
                        key=lambda c: c.calls)
        finally:
            model.train_function = recorder
        LOG = Log()
        with probe.counting():
            fit(steps, epochs)
        out[name] = {"calls": calls.calls, "frames": calls.frames, "named": dict(calls.named),
                     "steps": list(LOG.steps), "eager": list(LOG.eager),
                     "transfers": list(LOG.transfers), "ops": LOG.ops,
                     "new_programs": LOG.new_programs}
    out["programs"] = {key: vars(p) for (mid, key), p in PROGRAMS.items() if mid == id(model)}
    return out


def summarize(raw: Dict[str, Any]) -> Dict[str, Any]:
    """Per step, per epoch and per fit figures of one contender's raw counts."""
    programs = {k: Program(**v) for k, v in raw["programs"].items()}

    def fit_totals(fit: Dict[str, Any]) -> Dict[str, float]:
        run = [programs.get(key) for _, key in fit["steps"]]
        in_programs = [b for p in run if p is not None for b in p.collectives]
        return {"calls": fit["calls"], "frames": fit["frames"],
                "device_put": fit["named"].get("device_put", 0),
                "make_array": fit["named"].get("make_array_from_process_local_data", 0),
                "collectives": len(in_programs) + len(fit["eager"]),
                "coll_bytes": sum(in_programs) + sum(fit["eager"]),
                "eager": len(fit["eager"]),
                "transfers": len(fit["transfers"]), "in_bytes": sum(fit["transfers"]),
                "masked": sum(1 for p in run if p is not None and p.masked),
                "ops": fit["ops"], "new_programs": fit["new_programs"]}

    (a_steps, _), (b_steps, _) = raw["fits"]["A"], raw["fits"]["B"]
    totals = {name: fit_totals(raw[name]) for name in raw["fits"]}
    a, b, c = totals["A"], totals["B"], totals.get("C")
    out: Dict[str, Any] = {}
    for key in a:
        step = (b[key] - a[key]) / (b_steps - a_steps)
        epoch = c[key] - a[key] - a_steps * step if c else float("nan")
        # "once": what a fit of one epoch has beyond its steps (its epoch and itself).
        out[key] = {"step": step, "epoch": epoch, "fit": a[key] - a_steps * step - epoch,
                    "once": a[key] - a_steps * step,
                    "total": sum(t[key] for t in totals.values())}
    first, last = raw["A"]["steps"][0][1], raw["A"]["steps"][-1][1]
    out["full_program"] = vars(programs[first]) if first in programs else None
    out["last_program"] = vars(programs[last]) if last in programs else None
    return out


def measure_pair(probe: Probe, contenders: Dict[str, Tuple[Any, Any]], x: Any, y: Any,
                 batch: int, case: str, replicas: int,
                 fits: Optional[Dict[str, Tuple[int, int]]] = None) -> Dict[str, Any]:
    """Both contenders' figures ({"hand": ..., "ours": ...}); `contenders`: (what to fit,
    the Keras model whose step function runs) each. `padded`: kerasmgpu's fits end with
    a batch of 1 row, the hand-written engine's with `replicas` rows; `x` holds enough
    rows for the longest fit."""
    fits = fits or FITS
    ROWS[0] = batch // replicas
    extra = {"hand": replicas if case == "padded" else 0, "ours": 1 if case == "padded" else 0}
    results: Dict[str, Any] = {}
    for who, (target, model) in contenders.items():

        def fit(steps: int, epochs: int, target: Any = target, who: str = who) -> Any:
            rows = (steps - (1 if extra[who] else 0)) * batch + extra[who]
            return target.fit(x[:rows], y[:rows], batch_size=batch, epochs=epochs,
                              verbose=0, shuffle=False)

        fit(fits["A"][0], 1)  # compiles or traces its step programs
        results[who] = summarize(measure(probe, model, fit, fits))
    return results


# --- the contenders -------------------------------------------------------------------------


def contenders(keras: Any, name: str, probe: Probe) -> Dict[str, Tuple[Any, Any]]:
    """(fit target, Keras model) of the hand-written engine and of kerasmgpu."""
    def build() -> Any:
        return MODELS[name](keras)

    backend = kerasmgpu.environment().backend
    gpus = None if backend == "torch" else 2
    ours = kerasmgpu.parallelize(compile_model(keras, build()), gpus=gpus)
    hand = by_hand(keras, build, 2)
    if isinstance(probe, TfProbe):
        probe.watch_strategy(ours.distribute_strategy)
    return {"hand": (hand, getattr(hand, "model", hand)), "ours": (ours, ours)}


def run_case(keras: Any, probe: Probe, name: str, case: str) -> Dict[str, Any]:
    replicas = int(os.environ.get("WORLD_SIZE", "1")) if probe.backend == "torch" else 2
    x, y = model_data(name, 9 * BATCH + replicas)
    return measure_pair(probe, contenders(keras, name, probe), x, y, BATCH, case, replicas)


# --- gates and the table ---------------------------------------------------------------------


def gates(hand: Dict[str, Any], ours: Dict[str, Any], case: str,
          backend: str) -> List[Tuple[str, bool, str]]:
    """(gate, passed, figures) of one (model, case)."""
    out = []
    coll = (ours["collectives"]["step"] == hand["collectives"]["step"]
            and abs(ours["coll_bytes"]["step"] - hand["coll_bytes"]["step"]) <= SCALAR_BYTES)
    out.append(("collectives/step", coll, f"{hand['collectives']['step']:g} "
                f"({hand['coll_bytes']['step']:g} B) -> {ours['collectives']['step']:g} "
                f"({ours['coll_bytes']['step']:g} B)"))
    new = ours["new_programs"]["total"]
    out.append(("no new program after the first fit", new == 0, f"{new:g} new"))
    out.append(("transfers/step", ours["transfers"]["step"] == hand["transfers"]["step"]
                and ours["in_bytes"]["step"] == hand["in_bytes"]["step"],
                f"{hand['transfers']['step']:g} ({hand['in_bytes']['step']:g} B) -> "
                f"{ours['transfers']['step']:g} ({ours['in_bytes']['step']:g} B)"))
    ratio = ours["calls"]["step"] / hand["calls"]["step"]
    out.append((f"Python calls/step <= {PY_CALLS}x", ratio <= PY_CALLS,
                f"{hand['calls']['step']:.0f} -> {ours['calls']['step']:.0f} ({ratio:.3f}x)"))
    if backend == "torch":
        ratio = ours["ops"]["step"] / max(hand["ops"]["step"], 1)
        out.append((f"torch ops/step <= {FULL_OPS}x", ratio <= FULL_OPS,
                    f"{hand['ops']['step']:.0f} -> {ours['ops']['step']:.0f} ({ratio:.3f}x)"))
        for when in ("fit", "epoch"):
            more = ours["collectives"][when] - hand["collectives"][when]
            allowed = sum(TORCH_EXTRAS[f"per {when}"].values())
            out.append((f"collectives/{when} beyond the hand-written <= {allowed}",
                        more <= allowed, f"{more:+g}"))
    else:
        full_h, full_o = hand["full_program"], ours["full_program"]
        if full_h and full_o and full_h["compute"]:  # (no HLO without XLA's dump)
            ratio = full_o["compute"] / full_h["compute"]
            out.append((f"full-batch step compute ops <= {FULL_OPS}x", ratio <= FULL_OPS,
                        f"{full_h['compute']} -> {full_o['compute']} ({ratio:.3f}x, "
                        f"{unmatched(full_h, full_o)} unmatched)"))
    masked_steps = ours["masked"]["step"]
    masked_epoch = ours["masked"]["once"]
    want = 1 if case == "padded" else 0
    out.append(("masked step only for the padded batch", masked_steps == 0 and
                masked_epoch == want, f"{masked_steps:g}/step, {masked_epoch:g}/epoch"))
    last_h, last_o = hand["last_program"], ours["last_program"]
    if case == "padded" and backend != "torch" and last_h and last_o and last_h["compute"]:
        ratio = last_o["compute"] / last_h["compute"]
        out.append((f"padded step compute ops <= {PADDED_OPS}x", ratio <= PADDED_OPS,
                    f"{last_h['compute']} -> {last_o['compute']} ({ratio:.3f}x)"))
    return out


def unmatched(a: Dict[str, Any], b: Dict[str, Any]) -> int:
    ha, hb = Counter(a["histogram"]), Counter(b["histogram"])
    return sum(((ha - hb) + (hb - ha)).values())


COLUMNS = (("coll/step", "collectives", "step"), ("B/step", "coll_bytes", "step"),
           ("coll/epoch", "collectives", "epoch"), ("coll/fit", "collectives", "fit"),
           ("new progs", "new_programs", "total"), ("masked/step", "masked", "step"),
           ("calls/step", "calls", "step"), ("frames/step", "frames", "step"),
           ("in/step", "transfers", "step"), ("in B/step", "in_bytes", "step"))


def table(rows: List[Tuple[str, str, Dict[str, Any]]], backend: str) -> List[str]:
    head = f"{'model':<12}{'case':<8}{'who':<6}" + "".join(f"{c[0]:>12}" for c in COLUMNS)
    head += f"{'step ops':>16}{'padded ops':>16}" if backend != "torch" else f"{'ops/step':>12}"
    lines = [head]
    failed = 0
    for model, case, result in rows:
        for who in ("hand", "ours"):
            r = result[who]
            line = f"{model if who == 'hand' else '':<12}{case if who == 'hand' else '':<8}{who:<6}"
            line += "".join(f"{r[k][w]:>12.6g}" for _, k, w in COLUMNS)
            if backend == "torch":
                line += f"{r['ops']['step']:>12.6g}"
            else:
                for p in (r["full_program"], r["last_program"] if case == "padded" else None):
                    line += f"{(str(p['compute']) + '/' + str(p['ops'])) if p else '-':>16}"
            lines.append(line)
        for gate, ok, figures in gates(result["hand"], result["ours"], case, backend):
            failed += not ok
            lines.append(f"{'':<26}{'ok    ' if ok else 'MISSED'} {gate}: {figures}")
    lines.append(f"{failed} gate(s) missed" if failed else "every gate met")
    return lines


def markdown(rows: List[Tuple[str, str, Dict[str, Any]]], route: str, backend: str
             ) -> List[str]:
    """The rows of docs/performance.md's table for this route: hand-written -> kerasmgpu."""
    def pair(hand: Any, ours: Any) -> str:
        return f"{hand:g}" if hand == ours else f"{hand:g} -> {ours:g}"

    lines = []
    for model, case, result in rows:
        h, o = result["hand"], result["ours"]
        if backend == "torch":
            ops = pair(h["ops"]["step"], o["ops"]["step"])
            padded = "-"
        else:
            full_h, full_o = h["full_program"] or {}, o["full_program"] or {}
            ops = pair(full_h.get("compute", 0), full_o.get("compute", 0))
            last_h, last_o = h["last_program"] or {}, o["last_program"] or {}
            padded = (pair(last_h.get("compute", 0), last_o.get("compute", 0))
                      if case == "padded" else "-")
        extra = ", ".join(f"{o['collectives'][w] - h['collectives'][w]:+g}/{w}"
                          for w in ("fit", "epoch"))
        lines.append(
            f"| {route} | {model} {case} | {pair(h['collectives']['step'], o['collectives']['step'])}"
            f" ({pair(h['coll_bytes']['step'], o['coll_bytes']['step'])} B); {extra} | "
            f"{o['new_programs']['total']:g} | {ops} | {padded} | "
            f"{o['masked']['step']:g} / {o['masked']['once']:g} | "
            f"{h['calls']['step']:.0f} -> {o['calls']['step']:.0f} "
            f"({o['calls']['step'] / h['calls']['step']:.3f}x) | "
            f"{pair(h['transfers']['step'], o['transfers']['step'])} |")
    return lines


# --- running it -------------------------------------------------------------------------------


def probe_for(backend: str) -> Probe:
    return {"jax": JaxProbe, "tensorflow": TfProbe, "torch": TorchProbe}[backend]()


def child(args: argparse.Namespace) -> int:
    keras = keras_module()
    probe = probe_for(kerasmgpu.environment().backend)
    probe.install(keras)
    out = [(m, c, run_case(keras, probe, m, c)) for m in args.models.split(",")
           for c in args.cases.split(",")]
    if os.environ.get("RANK", "0") == "0":
        print("COUNTS " + json.dumps(out), flush=True)
    return 0


# Read from the run without XLA's dump on JAX: with `--xla_dump_to` JAX dispatches every
# step through Python (about 600 calls more per step), so programs and Python calls are
# counted in two processes there.
CALL_KEYS = ("calls", "frames", "device_put", "make_array")


def in_children(args: argparse.Namespace, backend: str) -> Tuple[List[Any], int]:
    """One process per (model, case) (see suite.py, `_each_in_its_own_process`)."""
    rows, lost = [], 0
    for model in args.models.split(","):
        for case in args.cases.split(","):
            with tempfile.TemporaryDirectory() as dump:
                found = _child(model, case, dump)
                if found is not None and backend == "jax":
                    calls = _child(model, case, None)
                    for who in ("hand", "ours"):
                        for key in CALL_KEYS:
                            if calls is not None:
                                found[2][who][key] = calls[2][who][key]
                    found = found if calls is not None else None
            if found is None:
                lost += 1
                continue
            rows.append(found)
    if lost:
        print(f"{lost} (model, case) line(s) lost", flush=True)
    return rows, lost


def _child(model: str, case: str, dump: Optional[str]) -> Optional[Any]:
    env = dict(os.environ)
    env.pop("KERASMGPU_COUNTS_DUMP", None)
    if dump:
        env["KERASMGPU_COUNTS_DUMP"] = dump
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--models", model,
                           "--cases", case, "--child"], stdout=subprocess.PIPE, text=True,
                          env=env)
    found = [ln for ln in done.stdout.splitlines() if ln.startswith("COUNTS ")]
    if done.returncode or not found:
        print(f"{model} {case}: no result, the process ended with {done.returncode} (its "
              "error output is above)", flush=True)
        return None
    return json.loads(found[-1][len("COUNTS "):])[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cases", default="even,padded")
    parser.add_argument("--json", help="also write the raw figures to this file")
    parser.add_argument("--markdown", action="store_true",
                        help="also print the rows of docs/performance.md's table")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    env = kerasmgpu.environment()
    if args.child:
        return child(args)
    if env.backend == "torch":
        if int(os.environ.get("WORLD_SIZE", "1")) < 2:
            raise SystemExit("Keras 3 on PyTorch: run `kerasmgpu launch --nproc 2 "
                             "benchmarks/counts.py` (one process per replica)")
        keras = keras_module()
        probe = probe_for("torch")
        probe.install(keras)
        rows = [(m, c, run_case(keras, probe, m, c)) for m in args.models.split(",")
                for c in args.cases.split(",")]
        lost = 0
        if os.environ.get("RANK", "0") != "0":
            return 0
    else:
        rows, lost = in_children(args, env.backend)
    print(f"{env.keras_line.value} ({env.backend}), 2 replicas, global batch {BATCH}; per "
          "step = (9-step fit - 3-step fit) / 6")
    lines = table(rows, env.backend)
    print("\n".join(lines), flush=True)
    if args.markdown:
        route = f"{env.keras_line.value} {env.keras_version} ({env.backend})"
        print("\n".join(markdown(rows, route, env.backend)), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if lost or lines[-1] != "every gate met" else 0


if __name__ == "__main__":
    raise SystemExit(main())
