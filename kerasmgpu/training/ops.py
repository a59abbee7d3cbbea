"""What training needs from an engine, owned by training: the parallel model, its feeds
and the template link call only these members. Every engine (`kerasmgpu.engines.base.
Engine` and its subclasses) has them; training never imports the engines, so the
engines sit above training with no import cycle, and an engine hands a model to training
(`training.model.attach` / `adopt` / `hold`) instead of writing its state."""

from __future__ import annotations

from typing import Any, Callable, ClassVar, ContextManager, Dict, List, Protocol, Sequence

from kerasmgpu.batching import Planner
from kerasmgpu.data.feeds import Feed
from kerasmgpu.env.cluster import ClusterEnvironment
from kerasmgpu.registry import FeedKind, Route


class EngineOps(Protocol):
    """An engine as training sees it (see `kerasmgpu.engines.base.Engine` for each)."""

    route: ClassVar[Route]
    feed_kind: ClassVar[FeedKind]
    metrics_per_process: ClassVar[bool]
    slices_in_graph: ClassVar[bool]
    one_program: ClassVar[bool]
    combines_assigned_variables: ClassVar[bool]
    job: ClusterEnvironment

    @property
    def planner(self) -> Planner: ...

    def scope(self) -> ContextManager[Any]: ...

    def distribute_feed(self, feed: Feed) -> Feed: ...

    def step_iterator(self, dataset: Any) -> Any: ...

    def prepare_replica(self, replica: Any) -> None: ...

    def prepare_compiled(self, replica: Any) -> None: ...

    def epoch_end(self, replica: Any) -> None: ...

    def equalize(self, replica: Any) -> None: ...

    def any_process(self, flag: bool) -> bool: ...

    def any_processes(self, flags: Sequence[bool]) -> List[bool]: ...

    def broadcast_arrays(self, arrays: List[Any]) -> List[Any]: ...

    def step_gradients(self, compute: Callable[..., List[Any]],
                       parts: Sequence[Sequence[Any]]) -> List[Any]: ...

    def replica_outputs(self, compute: Callable[..., List[Any]],
                        parts: Sequence[Sequence[Any]]) -> List[Any]: ...

    def owns_optimizer(self, optimizer: Any) -> bool: ...

    def shuffle_seed(self) -> int: ...

    def callback_flags(self, callbacks: List[Any]) -> List[bool]: ...

    def use_callback_flags(self, flags: List[bool]) -> None: ...

    def worker_callbacks(self, callbacks: List[Any]) -> List[Any]: ...

    def describe(self) -> Dict[str, str]: ...


__all__ = ["EngineOps"]
