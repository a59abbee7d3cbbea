"""Work run aside: on a thread of its own, waited for a bounded time.

TensorFlow keeps the stack of entered strategy scopes per thread, so a thread of its own
enters none: the made-up rows kerasmgpu tries a user's metric or layer on before
training (`metric_states`, `training.tried_layers`) then run eagerly on plain variables,
even where `parallelize()` or `fit()` runs in `kerasmgpu.scope()`. The thread is a
daemon: one that never ends (never seen: a few eager ops) is left behind by the wait and
cannot hold the process at exit, as a thread pool's worker would.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, List, TypeVar

T = TypeVar("T")


def outside_scopes(run: Callable[[], T], timeout_s: float, name: str,
                   timed_out: Callable[[], T]) -> T:
    """`run()` on a daemon thread named `kerasmgpu-<name>`, waited for at most
    `timeout_s` seconds: its value, its exception raised here, or `timed_out()`."""
    outcome: List[Any] = []

    def target() -> None:
        try:
            outcome.append((True, run()))
        except BaseException as error:  # raised again in the caller's thread
            outcome.append((False, error))

    thread = threading.Thread(target=target, name=f"kerasmgpu-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        return timed_out()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value
