"""A feed in parts: the epoch's last batch runs a step program of its own.

A tf.data pipeline's elements share one traced step. kerasmgpu's array feed on the
TensorFlow routes therefore comes in parts when the epoch ends in a batch of another
size (`data.arrays.Arrays._tf_parts`): Keras reads the full batches - static shapes,
the user's data, the very program a hand-written `MirroredStrategy` fit traces - and
the last batch, padded and masked when it must be, comes from a pipeline of its own
(`Feed.tail`). While a call runs, the model's step function (`train_function`,
`test_function`: public on every Keras line with a TensorFlow feed) is wrapped so
that the `steps`-th call of every `steps` runs the same function on the tail's
iterator: a second trace, for that batch only.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from kerasmgpu.data.feeds import Feed
from kerasmgpu.training.ops import EngineOps


@contextlib.contextmanager
def split_steps(engine: EngineOps, model: Any, feeds: Dict[str, Optional[Feed]]
                ) -> Iterator[None]:
    """While a fit/evaluate runs: each step kind ("train", "test") whose feed has a
    tail reads it in the last step of every `feed.steps`."""
    installed: List[Tuple[str, Any]] = []
    try:
        for kind, feed in feeds.items():
            if feed is None or feed.tail is None:
                continue
            original = _step_function(model, kind)
            setattr(model, f"{kind}_function", _reading_tail(engine, original, feed))
            installed.append((kind, original))
        yield
    finally:
        for kind, original in installed:
            setattr(model, f"{kind}_function", original)


def _step_function(model: Any, kind: str) -> Any:
    """The model's step function of `kind`, made now where Keras has not yet: Keras's
    fit and evaluate then keep it (they make one only when there is none)."""
    getattr(model, f"make_{kind}_function")()
    return getattr(model, f"{kind}_function")


def _reading_tail(engine: EngineOps, original: Callable[..., Any], feed: Feed
                  ) -> Callable[..., Any]:
    every = feed.steps
    assert every is not None
    calls = [feed.offset]
    tail: List[Any] = []

    def step_function(iterator: Any, *args: Any) -> Any:
        call = calls[0]
        calls[0] = call + 1
        if call % every != every - 1:
            return original(iterator, *args)
        if not tail:  # made at the first tail step: a fit stopped before needs none
            tail.append(engine.step_iterator(feed.tail))
        return original(tail[0], *args)

    return step_function
