"""Check kerasmgpu on a machine WITH NVIDIA GPUs, and keep every figure in one JSON file.

    python benchmarks/gpu_check.py                         # writes gpu-check.json
    python benchmarks/gpu_check.py --output h100x8.json --timeout 1200

Runs, each in its own subprocess with a timeout (`--timeout`, seconds per step):

    doctor   kerasmgpu doctor --json
    demo     kerasmgpu demo --json                      (every GPU, beside one GPU)
    bench    kerasmgpu bench --replicas 1,2,...,N --output DIR --json   (N = all GPUs)
    monitor  this script --monitor-run: parallelize() a CNN on every GPU and fit it with
             DeviceMonitor(interval=0.2), printing the monitor's summary() - real NVML
             readings of how busy each GPU was, epoch by epoch
    cnn, lstm, transformer
             kerasmgpu bench --model M --replicas 1,2,4,8 (those <= N) --json: scaling
             efficiency against one GPU for the other model shapes of benchmarks/suite.py
    allreduce
             this script --allreduce-run: the all-reduce bus bandwidth over every GPU
             (JAX psum, or a tf.distribute all-reduce), 1 MiB to 256 MiB of float32
    suite    benchmarks/suite.py --replicas N: kerasmgpu against the engine by hand,
             four model shapes, even and padded batches (its table, not JSON)
    counts   benchmarks/counts.py --json BENCH_DIR-counts.json: the same four shapes on
             2 GPUs, each step counted beside the engine by hand - collectives and
             bytes, programs, ops, Python calls, transfers - with the gates of
             docs/performance.md (the figures go into the JSON file under this step)

and writes everything (commands, exit codes, seconds, parsed JSON, output tails) into
ONE JSON file, then prints a short summary. Exit 0 when every step exited 0.

Set-up, beside kerasmgpu (`pip install -e ".[tools]"` in a checkout, which brings
nvidia-ml-py and matplotlib) and scikit-learn (for the demo):

    Keras 3 on JAX:        pip install keras "jax[cuda12]" scikit-learn
                           KERAS_BACKEND=jax python benchmarks/gpu_check.py
    Keras 3 on TensorFlow: pip install "tensorflow[and-cuda]" scikit-learn
                           python benchmarks/gpu_check.py
    tf_keras (Keras 2):    pip install "tensorflow[and-cuda]" tf_keras scikit-learn
                           TF_USE_LEGACY_KERAS=1 python benchmarks/gpu_check.py

On a machine without GPUs the script stops (exit 2) unless `--allow-no-gpu` is given;
then the children run on 2 virtual CPU devices, which checks the plumbing only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

STEPS = ("doctor", "demo", "bench", "monitor", "cnn", "lstm", "transformer", "allreduce",
         "suite", "counts")
MODEL_STEPS = ("cnn", "lstm", "transformer")  # bench --model M (bench itself: the mlp)
DEFAULT_OUTPUT = "gpu-check.json"
DEFAULT_BENCH_DIR = "gpu-check-bench"
DEFAULT_TIMEOUT = 900.0
TAIL = 4000  # characters of each output kept in the JSON file
NO_GPU_VIRTUAL = 2

Runner = Callable[[str, Sequence[str], float, Mapping[str, str]], Dict[str, Any]]


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line; `--help` prints the module's first paragraph."""
    parser = argparse.ArgumentParser(
        prog="gpu_check.py",
        description="Run kerasmgpu doctor, demo, bench and a DeviceMonitor training on this "
        "machine's NVIDIA GPUs; write every result into one JSON file.",
    )
    parser.add_argument("--output", default=DEFAULT_OUTPUT,
                        help=f"the JSON file to write (default {DEFAULT_OUTPUT})")
    parser.add_argument("--bench-dir", default=DEFAULT_BENCH_DIR,
                        help=f"folder for bench.json and scaling.png (default {DEFAULT_BENCH_DIR})")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                        help=f"seconds each step may take (default {DEFAULT_TIMEOUT:g})")
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs to use (default: every GPU NVML or nvidia-smi sees)")
    parser.add_argument("--steps", default=",".join(STEPS),
                        help=f"steps to run, comma-separated (default {','.join(STEPS)})")
    parser.add_argument("--python", default=sys.executable,
                        help="the Python that has kerasmgpu and the framework installed")
    parser.add_argument("--allow-no-gpu", action="store_true",
                        help=f"run without GPUs on {NO_GPU_VIRTUAL} virtual CPU devices "
                        "(checks the plumbing only)")
    parser.add_argument("--monitor-epochs", type=int, default=5,
                        help="epochs of the DeviceMonitor training (default 5)")
    parser.add_argument("--monitor-steps", type=int, default=100,
                        help="steps per epoch of the DeviceMonitor training (default 100)")
    parser.add_argument("--monitor-run", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allreduce-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in STEPS]
    if unknown or not steps:
        parser.error(f"Invalid `--steps`. Received: --steps={args.steps}. Allowed: a "
                     f"comma-separated subset of {','.join(STEPS)}. Fix: e.g. --steps doctor,bench")
    for name in ("timeout", "monitor_epochs", "monitor_steps"):
        if getattr(args, name) <= 0:
            flag = "--" + name.replace("_", "-")
            parser.error(f"Invalid `{flag}`. Received: {flag}={getattr(args, name)}. "
                         f"Allowed: a number > 0. Fix: leave it out for the default.")
    if args.gpus is not None and args.gpus < 1:
        parser.error(f"Invalid `--gpus`. Received: --gpus={args.gpus}. Allowed: an integer "
                     ">= 1. Fix: leave it out to use every GPU.")
    args.steps = steps
    return args


def replica_counts(gpus: int) -> List[int]:
    """Every replica count from 1 to `gpus`: the bench's --replicas."""
    return list(range(1, max(1, gpus) + 1))


def power_counts(gpus: int) -> List[int]:
    """1, 2, 4, 8 (those up to `gpus`) and `gpus` itself: the model benches' --replicas."""
    return sorted({n for n in (1, 2, 4, 8) if n <= gpus} | {max(1, gpus)})


def build_commands(python: str, gpus: int, bench_dir: str, script: str,
                   monitor_epochs: int = 5, monitor_steps: int = 100) -> Dict[str, List[str]]:
    """The subprocess command of each step (pure: nothing runs)."""
    kerasmgpu = [python, "-m", "kerasmgpu"]
    return {
        "doctor": kerasmgpu + ["doctor", "--json"],
        "demo": kerasmgpu + ["demo", "--json"],
        "bench": kerasmgpu + ["bench", "--replicas", ",".join(map(str, replica_counts(gpus))),
                              "--output", bench_dir, "--json"],
        "monitor": [python, script, "--monitor-run", "--monitor-epochs", str(monitor_epochs),
                    "--monitor-steps", str(monitor_steps)],
        **{model: kerasmgpu + ["bench", "--model", model, "--replicas",
                               ",".join(map(str, power_counts(gpus))),
                               "--output", f"{bench_dir}-{model}", "--json"]
           for model in MODEL_STEPS},
        "allreduce": [python, script, "--allreduce-run"],
        "suite": [python, os.path.join(os.path.dirname(script), "suite.py"),
                  "--replicas", str(max(2, gpus))],
        "counts": [python, os.path.join(os.path.dirname(script), "counts.py"), "--json",
                   counts_file(bench_dir)],
    }


def counts_file(bench_dir: str) -> str:
    """Where the counts step writes its figures (read into the report)."""
    return f"{bench_dir}-counts.json"


def parse_json_output(text: Optional[str]) -> Any:
    """The JSON object a child printed on stdout, or None.

    The kerasmgpu commands print exactly one object with --json; should anything have
    printed before it, the object is read from the last line that opens one.
    """
    if not text or not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].startswith("{"):
            try:
                return json.loads("\n".join(lines[start:]))
            except ValueError:
                continue
    return None


def _tail(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value)[-TAIL:]


def run_step(name: str, command: Sequence[str], timeout: float,
             env: Mapping[str, str]) -> Dict[str, Any]:
    """Run one step; never raises (a timeout or a missing program is a result too)."""
    start = time.perf_counter()
    result: Dict[str, Any] = {"command": list(command), "returncode": None, "timed_out": False}
    try:
        done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout,
                              env=dict(env))
        result["returncode"] = done.returncode
        stdout, stderr = done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        result["timed_out"] = True
        stdout, stderr = _tail(exc.stdout), _tail(exc.stderr)
    except OSError as exc:
        stdout, stderr = "", f"{type(exc).__name__}: {exc}"
    result["seconds"] = round(time.perf_counter() - start, 2)
    result["json"] = parse_json_output(stdout)
    result["stdout_tail"] = "" if result["json"] is not None else _tail(stdout)
    result["stderr_tail"] = _tail(stderr)
    return result


def detect_gpus() -> Dict[str, Any]:
    """{"count", "names", "source", "nvml"}: NVML first, then `nvidia-smi -L`."""
    info: Dict[str, Any] = {"count": 0, "names": [], "source": None, "nvml": None}
    try:
        from kerasmgpu import nvml

        summary = nvml.summary()
        info["nvml"] = summary
        if summary.get("available"):
            names = [str(d.get("name")) for d in summary.get("devices", [])]
            info.update(count=len(names), names=names, source="nvml")
            return info
    except Exception as exc:  # kerasmgpu missing or broken: nvidia-smi may still answer
        info["nvml"] = {"available": False, "reason": f"{type(exc).__name__}: {exc}"}
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
            names = [line.split(":", 1)[1].split("(")[0].strip()
                     for line in listing.stdout.splitlines() if line.startswith("GPU ")]
            if names:
                info.update(count=len(names), names=names, source="nvidia-smi")
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def summarize(report: Mapping[str, Any]) -> List[str]:
    """A few lines a person reads after the run (the JSON file has the rest)."""
    lines = [f"gpu_check: {report['gpus']} GPU(s) {', '.join(report['gpu_names']) or ''}".rstrip()]
    for name, step in report["steps"].items():
        status = ("timed out" if step["timed_out"] else
                  "ok" if step["returncode"] == 0 else f"exit {step['returncode']}")
        detail = ""
        data = step.get("json") or {}
        try:
            if name == "doctor" and data:
                route = data.get("route", {})
                detail = (f"route {route.get('route')}, all-reduce {route.get('all_reduce')}, "
                          f"{len(data.get('devices', []))} device(s)")
            elif name == "demo" and data:
                runs = [data.get("single") or {}, data.get("parallel") or {}]
                # Null on virtual devices (--allow-no-gpu): not a GPU's speed.
                speeds = [r.get("samples_per_s") for r in runs if r]
                speed = ("samples/s " + " vs ".join(f"{v:.0f}" for v in speeds)
                         if None not in speeds else "samples/s not compared (virtual devices)")
                detail = (f"max weight difference {data.get('max_weight_difference')}, "
                          + speed + ", val accuracy " + " vs ".join(
                              f"{r.get('val_accuracy', 0):.4f}" for r in runs if r))
            elif name == "allreduce" and data:
                detail = "; ".join(f"{r['bytes'] >> 20} MiB: {r['busbw_gbs']:.1f} GB/s"
                                   for r in data.get("results", []))
            elif name in ("bench",) + MODEL_STEPS and data:
                detail = "; ".join(
                    f"{r['replicas']}: {r['samples_per_s']:.0f}/s ({100 * r['efficiency']:.0f}%)"
                    for r in data.get("results", []))
            elif name == "counts":
                verdicts = [ln for ln in (step.get("stdout_tail") or "").splitlines()
                            if "gate" in ln and not ln.startswith(" ")]
                detail = verdicts[-1] if verdicts else ""
            elif name == "monitor" and data:
                last = (data.get("summary") or [{}])[-1]
                utils = [f"{k.split('_')[0]} {v:.0f}%" for k, v in sorted(last.items())
                         if k.startswith("gpu") and k.endswith("_util") and k[3].isdigit()]
                detail = f"last epoch: {', '.join(utils) or 'no readings'}"
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            detail = "(unexpected JSON; see the file)"
        lines.append(f"  {name:<8} {status:<10} {step['seconds']:>7.1f} s  {detail}".rstrip())
    lines.append(f"wrote {report['output']}")
    return lines


def monitor_run(epochs: int, steps: int) -> int:
    """Child mode: fit on every device with DeviceMonitor(interval=0.2); print JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import kerasmgpu
    from kerasmgpu import adapters as adapter
    from kerasmgpu.callbacks import DeviceMonitor
    from kerasmgpu.cli import bench

    env = kerasmgpu.environment()
    keras = adapter.load(env.keras_line, env.backend).keras
    model = bench.build_model(keras, "cnn")
    pmodel = kerasmgpu.parallelize(model)
    description = kerasmgpu.describe(model=pmodel) if pmodel is not model else {"replicas": "1"}
    replicas = int(description.get("replicas", "1") or 1)
    batch = 256 * replicas
    x, y = bench.make_data("cnn", batch * steps)
    monitor = DeviceMonitor(interval=0.2, verbose=False)
    start = time.perf_counter()
    history = pmodel.fit(x, y, batch_size=batch, epochs=epochs, verbose=0, callbacks=[monitor])
    print(json.dumps({
        "describe": dict(description),
        "epochs": epochs,
        "steps_per_epoch": steps,
        "global_batch": batch,
        "seconds": round(time.perf_counter() - start, 2),
        "summary": monitor.summary(),
        "history": {k: [float(v) for v in values] for k, values in history.history.items()},
    }, default=str))
    return 0


def allreduce_run(sizes: Sequence[int] = (1 << 20, 16 << 20, 256 << 20), repeats: int = 10
                  ) -> int:
    """Print (JSON) the all-reduce bandwidth over every device of the active backend.

    busbw = 2 (n - 1) / n * bytes / seconds, as nccl-tests reports it: comparable across
    device counts, near the link's bandwidth when the all-reduce saturates it.
    """
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        count = jax.device_count()
        reduce = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")

        def timed(size: int) -> float:
            value = jnp.ones((count, size // 4), jnp.float32)
            reduce(value).block_until_ready()
            start = time.perf_counter()
            for _ in range(repeats):
                out = reduce(value)
            out.block_until_ready()
            return (time.perf_counter() - start) / repeats
    elif backend == "tensorflow":
        import tensorflow as tf

        strategy = tf.distribute.MirroredStrategy()
        count = int(strategy.num_replicas_in_sync)

        def timed(size: int) -> float:
            with strategy.scope():
                value = tf.Variable(tf.ones([size // 4]))

            @tf.function
            def step() -> Any:
                def one() -> Any:
                    context = tf.distribute.get_replica_context()
                    return context.all_reduce(tf.distribute.ReduceOp.SUM, value.read_value())
                return strategy.run(one)

            strategy.experimental_local_results(step())[0].numpy()
            start = time.perf_counter()
            for _ in range(repeats):
                out = step()
            strategy.experimental_local_results(out)[0].numpy()
            return (time.perf_counter() - start) / repeats
    else:
        print(json.dumps({"backend": backend, "results": [],
                          "note": "measured for JAX and TensorFlow only"}))
        return 0
    results = []
    for size in sizes:
        seconds = timed(size)
        results.append({"bytes": size, "seconds": seconds, "algbw_gbs": size / seconds / 1e9,
                        "busbw_gbs": 2 * (count - 1) / count * size / seconds / 1e9})
    print(json.dumps({"backend": backend, "devices": count, "results": results}))
    return 0


def main(argv: Optional[Sequence[str]] = None, runner: Runner = run_step) -> int:
    """Run the steps and write the JSON file; `runner` is replaceable for tests."""
    args = parse_args(argv)
    if args.monitor_run:
        return monitor_run(args.monitor_epochs, args.monitor_steps)
    if args.allreduce_run:
        return allreduce_run()
    found = detect_gpus()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    gpus = args.gpus or found["count"]
    if not found["count"]:
        if not args.allow_no_gpu:
            print("gpu_check: no NVIDIA GPU found (NVML: "
                  f"{(found['nvml'] or {}).get('reason')}). This script is for GPU machines. "
                  "Fix: run it where `nvidia-smi -L` lists GPUs, or pass --allow-no-gpu to "
                  f"check the plumbing on {NO_GPU_VIRTUAL} virtual CPU devices.", file=sys.stderr)
            return 2
        env.setdefault("KERASMGPU_VIRTUAL_DEVICES", str(args.gpus or NO_GPU_VIRTUAL))
        raw = env["KERASMGPU_VIRTUAL_DEVICES"].strip()
        gpus = int(raw) if raw.isdigit() and int(raw) > 0 else NO_GPU_VIRTUAL
    elif args.gpus and args.gpus > found["count"]:
        print(f"gpu_check: Invalid `--gpus`. Received: --gpus={args.gpus}. Allowed: at most "
              f"{found['count']} (GPUs found: {', '.join(found['names'])}). Fix: leave it out.",
              file=sys.stderr)
        return 2
    commands = build_commands(args.python, gpus, args.bench_dir, os.path.abspath(__file__),
                              args.monitor_epochs, args.monitor_steps)
    report: Dict[str, Any] = {
        "tool": "benchmarks/gpu_check.py",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "output": args.output,
        "host": {"platform": platform.platform(), "python": platform.python_version(),
                 "cpu_count": os.cpu_count()},
        "variables": {k: os.environ.get(k) for k in (
            "KERAS_BACKEND", "TF_USE_LEGACY_KERAS", "CUDA_VISIBLE_DEVICES",
            "KERASMGPU_VIRTUAL_DEVICES")},
        "gpus": gpus,
        "gpu_names": found["names"],
        "gpu_source": found["source"],
        "nvml": found["nvml"],
        "timeout_s": args.timeout,
        "steps": {},
    }
    for name in args.steps:
        print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
        report["steps"][name] = runner(name, commands[name], args.timeout, env)
        if name == "counts" and os.path.exists(counts_file(args.bench_dir)):
            with open(counts_file(args.bench_dir), encoding="utf-8") as handle:
                report["steps"][name]["json"] = json.load(handle)
        report["ok"] = all(s["returncode"] == 0 for s in report["steps"].values())
        # Written after every step: a later hang or crash keeps what was measured.
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(report, handle, indent=2, default=str)
    for line in summarize(report):
        print(line)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
