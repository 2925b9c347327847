"""The plugin contract: each unit kind's method, arguments and result check.

The one place that says what a plugin unit is. The worker process lists a
class's units with :data:`KINDS`; the services call ``KIND[kind].method`` with
``KIND[kind].args(...)`` and check what came back with ``KIND[kind].check``;
docs/plugins.md's contract table is checked against :data:`KINDS` by the tests.

This module imports only the standard library: the worker process imports it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class BadResult(ValueError):
    """The unit ran but its result does not have the contract's shape."""


def host_list(value: Any, what: str) -> list[str]:
    """A list of host ID strings, as a filter (or a balance proposal) returns it."""
    if not isinstance(value, list):
        raise BadResult(f"{what} returned {_kind(value)}, expected a list of host IDs")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise BadResult(f"{what} returned a non-string host ID: {bad[0]!r}")
    return value


def score_pairs(value: Any) -> list[tuple[str, float]]:
    """``[(host ID, number), ...]`` as a score unit returns it (numbers become floats)."""
    if not isinstance(value, list):
        raise BadResult(f"score returned {_kind(value)}, expected a list of (host, score) pairs")
    pairs: list[tuple[str, float]] = []
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise BadResult(f"bad score entry {entry!r}: expected (host ID, number)")
        score = entry[1]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise BadResult(f"bad score for host {entry[0]}: {score!r} is not a number")
        if isinstance(score, float) and math.isnan(score):
            raise BadResult(f"bad score for host {entry[0]}: NaN")
        pairs.append((entry[0], float(score)))
    return pairs


def proposal(value: Any) -> tuple[str, list[str]]:
    """``(vm_id or None/"", [host_ids])`` -> ``(vm, hosts)``; anything else is refused."""
    if not (isinstance(value, list) and len(value) == 2):
        raise BadResult(f"balance returned {value!r:.100}, expected (vm_id, [host_ids])")
    vm, hosts = value
    if vm is None:
        vm = ""
    if not isinstance(vm, str):
        raise BadResult(f"balance returned VM {vm!r}, expected a VM ID string or None")
    return vm, host_list(hosts, "balance")


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__} ({str(value)[:80]!r})"


@dataclass(frozen=True)
class UnitKind:
    """One kind of plugin unit: the method a class defines, what it gets, what it must return."""

    kind: str  # filter | score | balance (the values of vmsched.messages.Kind)
    method: str  # do_filter | do_score | do_balance
    params: tuple[str, ...]  # the method's parameters after self, in order
    operation: str  # the engine's XML-RPC method that runs it
    check: Callable[[Any], Any]  # the unit's raw result -> the checked value, or BadResult

    def args(self, hosts: list[str], vm: str, properties: dict[str, str]) -> tuple[Any, ...]:
        """The positional arguments of ``method`` for one request."""
        values = {"hosts": hosts, "vm": vm, "args": properties}
        return tuple(values[name] for name in self.params)

    @property
    def signature(self) -> str:
        return f"{self.method}(self, {', '.join(self.params)})"


KINDS: tuple[UnitKind, ...] = (
    UnitKind("filter", "do_filter", ("hosts", "vm", "args"), "runFilters", lambda v: host_list(v, "filter")),
    UnitKind("score", "do_score", ("hosts", "vm", "args"), "runCostFunctions", score_pairs),
    UnitKind("balance", "do_balance", ("hosts", "args"), "runLoadBalancing", proposal),
)

#: The same, by kind name.
KIND: dict[str, UnitKind] = {k.kind: k for k in KINDS}
