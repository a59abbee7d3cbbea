"""How a process of a multi-process job ends, on both sides of `kerasmgpu launch`.

* `status`: the exit statuses the launcher and its workers agree on (a failure, a
  timeout, a signal).
* `ending`: in a worker of a job of several, an uncaught exception or `sys.exit(n)`
  ends the process at once instead of waiting in the framework's shutdown for processes
  that may never come; a normal end shuts down as usual, every wait bounded.

Signals a worker handles itself (SIGTERM: save a backup, then exit) belong here too,
beside `ending`, and their status in `status`. The launcher's own answer to a
preemption signal - stop the workers, do not restart, exit `status.REQUEUE` - is in
`kerasmgpu.launch`.

Nothing here imports a framework. Starting the frameworks' multi-process runtimes stays
with the engines (`Engine.start`, registered by `kerasmgpu.engines.startup`): what each
one needs (a MultiWorkerMirroredStrategy, `jax.distributed`, a torch process group) is
engine knowledge, kept by the engine that made it; each calls `ending` once its framework
has started.
"""
