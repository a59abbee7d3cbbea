"""One shape for every error a user can trigger: what came in, what is allowed, the fix.

Keras 3 says "Expected one of ... Received: x=..."; Lightning adds the fix. We do
both, so a message read in a CI log is enough to repair the call.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, Iterator, Type


def _fmt(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def explain(argument: str, received: Any, allowed: str, fix: str, *, raw: bool = False) -> str:
    """Build the three-part message: received / allowed / fix."""
    shown = received if raw else _fmt(received)
    return f"Invalid `{argument}`. Received: {argument}={shown}. Allowed: {allowed}. Fix: {fix}"


@contextlib.contextmanager
def part_of(whole: str) -> Iterator[None]:
    """Errors in the three-part form raised inside, for an `x`, `y` or `sample_weight`
    that is part of `whole` (`validation_data`): said of `whole`'s. The feeds name the
    arguments of the call they build; the same feed builds fit's and its validation's."""
    try:
        yield
    except (ValueError, TypeError) as error:
        text = str(error)
        head = re.match(r"Invalid `([^`]+)`\.", text)
        if type(error) not in (ValueError, TypeError) or head is None:
            raise
        raise type(error)(f"Invalid `{head.group(1)}` of `{whole}`."
                          + text[head.end():]) from None


def bad_value(
    argument: str, received: Any, allowed: str, fix: str, *, raw: bool = False
) -> ValueError:
    return ValueError(explain(argument, received, allowed, fix, raw=raw))


def bad_type(
    argument: str, received: Any, allowed: str, fix: str, *, raw: bool = False
) -> TypeError:
    return TypeError(explain(argument, received, allowed, fix, raw=raw))


class NotYetSupportedError(NotImplementedError):
    """A route or feature that exists in the design but not on this line yet."""


class TooLateError(RuntimeError):
    """Device configuration asked for after the framework already started."""


class InvalidClusterError(RuntimeError):
    """A multi-process job whose launcher does not give an engine what it needs (e.g.
    TensorFlow needs every process's address)."""


class NotCompiledError(RuntimeError, ValueError):
    """A parallel model trained or evaluated before `compile()`.

    Keras raises a RuntimeError there on tf.keras, tf_keras and Keras 2.3 and a
    ValueError on Keras 3; this is both, so code that catches Keras's own still does,
    on every route.
    """


def not_compiled(model: Any, call: str) -> NotCompiledError:
    """What to do when `call` (fit, evaluate, ...) meets an uncompiled parallel model."""
    name = getattr(model, "name", None)
    shown = f"{type(model).__name__}{f' {name!r}' if name else ''}, not compiled, in {call}()"
    return NotCompiledError(explain(
        "model", shown,
        "a compiled model for fit(), evaluate(), train_on_batch() and test_on_batch() (and "
        "their *_generator forms), as in Keras; predict() and predict_on_batch() work "
        "uncompiled",
        f"call `compile(optimizer=..., loss=...)` on your model before `parallelize()`, or "
        f"on the model `parallelize()` returned, before {call}()",
        raw=True,
    ))


def error(kind: Type[Exception], argument: str, received: Any, allowed: str, fix: str) -> Exception:
    return kind(explain(argument, received, allowed, fix))


class VerificationError(RuntimeError):
    """`parallelize(verify=True)` (or KERASMGPU_VERIFY=1) found the parallel model's
    loss, gradients or outputs on a checked batch differing from the template's on one
    device; raised before the optimizer applies anything."""
