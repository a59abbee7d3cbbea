"""The routes: which engine trains a model for each Keras line. Pure: no framework.

| Keras line                               | route                | engine                        |
|------------------------------------------|----------------------|-------------------------------|
| standalone keras <= 2.3, tf.keras <= 2.3 | `multi_gpu_model`    | Keras's own multi_gpu_model   |
| tf.keras 2.4-2.15, tf_keras, Keras 3 TF  | `mirrored`           | tf.distribute (Mirrored / MultiWorkerMirrored) |
| Keras 3 JAX                              | `keras_distribution` | keras.distribution.DataParallel |
| Keras 3 PyTorch                          | `torch_ddp`          | torch.distributed all-reduce  |

This module parses and checks a user's `route=`; the `Route` enum and the choice of a
route for each Keras line and backend are `kerasmgpu.registry`'s, and
`kerasmgpu.engines` holds one module per engine, imported when its route is chosen.
"""

from __future__ import annotations

from typing import Optional, Union

from kerasmgpu import registry
from kerasmgpu._errors import bad_type, bad_value
from kerasmgpu.env.versions import KerasLine
from kerasmgpu.registry import Entry, Route


def parse_route(route: Union[str, Route, None]) -> Optional[Route]:
    """`route=` as given by a user: None, a Route, or its name (case-insensitive)."""
    if route is None or isinstance(route, Route):
        return route
    choices = ", ".join(r.value for r in Route)
    if not isinstance(route, str):
        raise bad_type("route", route, f"None or one of: {choices}", "pass route=None to auto-pick")
    try:
        return Route(route.strip().lower())
    except ValueError:
        raise bad_value(
            "route", route, f"None (auto) or one of: {choices}",
            "leave route=None to let kerasmgpu pick the route for your Keras",
        ) from None


def drives(route: Route) -> str:
    """The Keras lines and backends a route drives, in words (from the registry)."""
    return ", ".join(e.line.value + (f" with the {e.backend} backend"
                                     if e.line is KerasLine.KERAS_3 else "")
                     for e in registry.entries_of(route))


def check_route_fits(route: Route, entry: Entry) -> None:
    """An explicit `route=` must be the one the active Keras's entry runs."""
    if route is entry.route:
        return
    raise bad_value(
        "route", route.value,
        f"for {entry.line.value} (backend {entry.backend}): {entry.route.value!r}; "
        f"{route.value!r} drives {drives(route)}",
        f"pass route={entry.route.value!r} or route=None",
    )


__all__ = ["Route", "check_route_fits", "drives", "parse_route"]
