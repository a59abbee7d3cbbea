"""Several processes: the engines that must start before their frameworks' runtimes.

`kerasmgpu launch` gives every worker its rank and the coordinator address (see
`kerasmgpu.launch` and `kerasmgpu.env.cluster`). In such a worker, `import kerasmgpu`
registers what each engine needs before its runtime starts - without importing any
framework itself:

* TensorFlow (tf.keras 2.x, tf_keras): a `MultiWorkerMirroredStrategy`, created the
  moment `tensorflow` finishes importing ("Collective ops must be configured at program
  startup"; it reads TF_CONFIG);
* JAX: gloo CPU collectives and `jax.distributed.initialize` (coordinator, process
  count and id), before the first JAX computation;
* torch: the process's GPU (`LOCAL_RANK`), and later, in `parallelize()`,
  `torch.distributed.init_process_group` (gloo on CPU, nccl on GPUs).

So a launched script must `import kerasmgpu` before it imports TensorFlow or JAX (and
before Keras, which imports them); otherwise parallelize() explains that.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from kerasmgpu import _hooks
from kerasmgpu.env.cluster import launched, local_process_index, process_count, process_index
from kerasmgpu.env.versions import KerasLine, backend_for, detect_keras_line

_tf_strategy: Any = None
_tf_error: Optional[BaseException] = None
_jax_error: Optional[BaseException] = None


# --- set-up at import -------------------------------------------------------------------


def _start_tensorflow() -> None:
    global _tf_strategy, _tf_error
    line, _ = detect_keras_line()
    if line not in (KerasLine.TF_KERAS, KerasLine.TF_KERAS_LEGACY):
        return  # Keras 3 on TF cannot train under it (keras-team/keras#20585)
    try:
        import tensorflow as tf

        _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except Exception as exc:  # reported by parallelize(), never at import
        _tf_error = exc


def _start_jax() -> None:
    global _jax_error
    try:
        import jax

        # CPU devices of different processes only reach each other through gloo.
        try:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except (AttributeError, ValueError):  # older/newer jax: default is fine
            pass
        jax.distributed.initialize(
            coordinator_address=os.environ.get("JAX_COORDINATOR_ADDRESS"),
            num_processes=process_count(),
            process_id=process_index(),
        )
    except Exception as exc:
        _jax_error = exc


def _start_torch() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count():
        # Each worker sees its own GPUs (`launch --gpus-per-proc`) or all of them.
        torch.cuda.set_device(local_process_index() % torch.cuda.device_count())


def setup_at_import() -> None:
    """In a launched worker, arrange for each engine to start before its runtime does."""
    if not launched():
        return
    line, _ = detect_keras_line()
    backend = backend_for(line)
    if backend == "tensorflow":
        _hooks.after_import("tensorflow", _start_tensorflow)
    elif backend == "jax":
        _hooks.after_import("jax", _start_jax)
    elif backend == "torch":
        _hooks.after_import("torch", _start_torch)


# --- what the routes ask for ---------------------------------------------------------------


def _too_late(engine: str, detail: Any) -> RuntimeError:
    return RuntimeError(
        f"Invalid import order: {engine} started before kerasmgpu could set up the "
        f"multi-process engine ({detail}). Allowed: `import kerasmgpu` before "
        "tensorflow, jax, keras or tf_keras in a script run by `kerasmgpu launch`. "
        "Fix: move `import kerasmgpu` to the top of the script."
    )


def tf_strategy() -> Any:
    """The worker's MultiWorkerMirroredStrategy (created when TF was imported)."""
    if _tf_strategy is not None:
        return _tf_strategy
    if _tf_error is not None:
        raise _too_late("TensorFlow", _tf_error) from _tf_error
    raise _too_late("TensorFlow", "no strategy was created at import")


def ensure_jax() -> None:
    if _jax_error is not None:
        raise _too_late("JAX", _jax_error) from _jax_error
    import jax

    if jax.process_count() != process_count():
        raise _too_late("JAX", f"jax.process_count() is {jax.process_count()}")


def torch_process_group() -> Any:
    """Join (once) the run's torch.distributed group; gloo on CPU, nccl on GPUs."""
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = os.environ.get("KERASMGPU_TORCH_BACKEND") or (
            "nccl" if _torch_has_gpu() else "gloo"
        )
        dist.init_process_group(backend=backend, init_method="env://",
                                rank=process_index(), world_size=process_count())
    return dist


def _torch_has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.device_count())
