"""The surface every route has, so that the public API never branches on the engine.

A route owns an engine (a tf.distribute strategy, a keras.distribution layout, a torch
process group) built for a fixed set of devices, and knows:

* `available_devices()` - what it could run on;
* `replicas` - how many copies of the model train in step;
* `scope()` - the context that models and optimizers must be built in;
* `parallelize(model)` - a model that trains on all of them;
* `describe()` - the engine and all-reduce in words (for `doctor` and `demo`);
* `shutdown()` - release the engine.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, ClassVar, ContextManager, Dict, Iterator, List, Sequence

from kerasmgpu.detection import Device
from kerasmgpu.parallel.family import Family
from kerasmgpu.routes import Route


class BaseRoute(abc.ABC):
    route: ClassVar[Route]
    # How fit() input reaches this engine: "tf" (tf.data) or "python" (PyDataset).
    feed_kind: ClassVar[str] = "python"

    def __init__(self, family: Family, devices: Sequence[Device]) -> None:
        self.family = family
        self.devices = tuple(devices)

    @classmethod
    @abc.abstractmethod
    def available_devices(cls, family: Family) -> List[Device]:
        """Devices this route could place replicas on."""

    @property
    @abc.abstractmethod
    def replicas(self) -> int:
        """How many replicas the engine reports (its own count, not ours)."""

    @abc.abstractmethod
    def scope(self) -> ContextManager[Any]:
        """Build models and optimizers in here to place them on every replica."""

    @abc.abstractmethod
    def owns(self, model: Any) -> bool:
        """Whether `model` was built in this route's scope (then no copy is needed)."""

    @classmethod
    def single_device_passthrough(cls, family: Family) -> bool:
        """Whether one device means "return the model unchanged" (true for most)."""
        return True

    def parallelize(self, model: Any) -> Any:
        from kerasmgpu.parallel import model as parallel_model

        if self.owns(model):
            return parallel_model.adopt(self, self.family, model)
        return parallel_model.parallel_copy(self, self.family, model)

    def describe(self) -> Dict[str, str]:
        return {"route": self.route.value, "replicas": str(self.replicas)}

    def shutdown(self) -> None:  # noqa: B027 - optional hook, most routes hold nothing
        """Release what the engine holds; the default has nothing to release."""


@contextlib.contextmanager
def nothing() -> Iterator[None]:
    yield
