"""Waiting for a condition, with a deadline: polled, never a fixed sleep."""

from __future__ import annotations

import time
from typing import Any, Callable


class Timeout(AssertionError):
    """The condition was not met in time."""


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.01,
               what: str = "condition", *, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Raises :class:`Timeout`, naming ``what`` and the last value, after ``timeout`` seconds. An
    exception of a type in ``retry_on`` counts as "not yet" (a probe racing a starting process);
    any other propagates at once.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    error: BaseException | None = None
    while True:
        try:
            last = predicate()
            error = None
            if last:
                return last
        except retry_on as exc:
            error = exc
        if time.monotonic() >= deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}; last value {last!r}"
                          + (f", last error {error!r}" if error else ""))
        time.sleep(interval)


def wait_for(observe: Callable[[], Any], expected: Any, timeout: float = 20.0, what: str = "value",
             interval: float = 0.01, *, retry_on: tuple[type[BaseException], ...] = ()) -> Any:
    """Poll ``observe()`` until it equals ``expected`` (or ``expected(value)`` is true): the value.

    On timeout the message names what was expected and what was last observed.
    """
    ok = expected if callable(expected) else (lambda v: v == expected)
    seen: list[Any] = [None]

    def matches() -> bool:
        seen[0] = observe()
        return bool(ok(seen[0]))

    try:
        wait_until(matches, timeout, interval, what, retry_on=retry_on)
    except Timeout as exc:
        wanted = (getattr(expected, "__doc__", None) or repr(expected)) if callable(expected) else repr(expected)
        raise Timeout(f"{what}: expected {wanted}, observed {seen[0]!r} ({exc})") from None
    return seen[0]
