"""Several processes: the engines that must start before their frameworks' runtimes.

Whatever started the processes - `kerasmgpu launch`, torchrun, `mpirun`, `srun`, or a
cluster's TF_CONFIG (see `kerasmgpu.env.cluster`) - `import kerasmgpu` in each one
registers what its engine needs before the runtime starts, without importing any
framework itself:

* TensorFlow (tf.keras 2.x, tf_keras): a `MultiWorkerMirroredStrategy`, created the
  moment `tensorflow` finishes importing ("Collective ops must be configured at program
  startup"), with TensorFlow's own cluster resolver where one fits the job
  (TF_CONFIG: `TFConfigClusterResolver`; srun on several machines: `SlurmClusterResolver`)
  and the job's addresses otherwise;
* JAX: gloo CPU collectives and `jax.distributed.initialize` (coordinator, process count
  and id, bounded start-up, heartbeat and shutdown), before the first JAX computation;
* torch: the process's GPU (local rank), and later, in `parallelize()`, the process
  group (gloo on CPU, nccl on GPUs) with a bounded timeout.

So a multi-process script must `import kerasmgpu` before it imports TensorFlow or JAX
(and before Keras, which imports them); otherwise parallelize() explains that.

Each engine owns its start-up (`Engine.start`, in its own module: `mirrored`,
`keras_distribution`, `torch_ddp`), given the job's `ClusterEnvironment`; this module
only registers it for the moment the framework is imported, where the registry entry of
the active Keras says it starts at import. How a process of such a job ends (at once when
it fails, without the frameworks' shutdown) is `kerasmgpu.process.ending`'s; each
start-up tells it when its framework has started.
"""

from __future__ import annotations

from kerasmgpu import _hooks, registry
from kerasmgpu.env import cluster
from kerasmgpu.process import ending


def setup_at_import(job: cluster.ClusterEnvironment) -> None:
    """In a process of `job`, a job of several processes, start the engine of the active
    Keras (`Engine.start`, where its registry entry starts at import) before its runtime
    does, and learn how the process ends. The engine's module is imported then, after
    its framework: `import kerasmgpu` itself stays light."""
    if job.world_size() < 2:
        return
    ending.watch(job)
    entry = registry.active().entry
    if entry is None or not entry.starts_at_import:
        return

    def start() -> None:
        registry.resolve(entry.engine).start(job)

    _hooks.after_import(entry.backend, start)
