"""The plugin contract: each unit kind's method, arguments and result check.

The one place that says what a plugin unit is. The worker process lists a
class's units with :data:`KINDS`; the services call ``KIND[kind].method`` with
``KIND[kind].args(...)`` and read what came back with ``KIND[kind].read``
(the checked value and the reasons the unit gave per host);
docs/plugins.md's contract table is checked against :data:`KINDS` by the tests.

Reasons are optional and plugin-supplied: a filter may return ``{host: reason}``
for the hosts it drops instead of the list it keeps, a score unit
``(host, score, reason)`` triples, a balance unit a third element (a reason, or
``{host: reason}``). They are bounded here (:data:`MAX_REASON` characters,
:data:`MAX_REASONS` hosts, control characters blanked); whoever shows them
must still escape them, and they never go to the engine.

This module imports only the standard library: the worker process imports it.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from vmsched.words import counted

#: characters of one reason kept (longer ones end with "...")
MAX_REASON = 160
#: reasons kept per unit and call
MAX_REASONS = 1000

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


class BadResult(ValueError):
    """The unit ran but its result does not have the contract's shape."""


@dataclass(frozen=True)
class Verdict:
    """A unit's checked result: the value in the old shape, and the unit's reasons."""

    value: Any  # kept host IDs | [(host ID, score)] | (vm, [host IDs])
    reasons: dict[str, str] = field(default_factory=dict)  # host ID -> why (only hosts of the request)
    reason: str = ""  # a balance unit's reason for its proposal


def host_list(value: Any, what: str) -> list[str]:
    """A list of host ID strings, as a filter (or a balance proposal) returns it."""
    if not isinstance(value, list):
        raise BadResult(f"{what} returned {_kind(value)}, expected a list of host IDs")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise BadResult(f"{what} returned a non-string host ID: {bad[0]!r}")
    return value


def reason_text(value: Any, where: str) -> str:
    """A plugin's reason as kept: a string, one line, at most :data:`MAX_REASON` characters."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadResult(f"{where}: the reason must be a string, not {_kind(value)}")
    text = _CONTROL.sub(" ", value[: 4 * MAX_REASON]).strip()
    if not text.isascii():  # no lone surrogates: no JSON or XML encoder could send them
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def reason_map(value: Any, hosts: Sequence[str] | None, where: str) -> dict[str, str]:
    """``{host ID: reason}`` kept for the requested hosts only, at most :data:`MAX_REASONS`."""
    if not isinstance(value, dict):
        raise BadResult(f"{where} returned {_kind(value)}, expected {{host ID: reason}}")
    wanted = None if hosts is None else set(hosts)
    reasons: dict[str, str] = {}
    for host, why in value.items():
        if not isinstance(host, str):
            raise BadResult(f"{where} returned a non-string host ID: {host!r}")
        text = reason_text(why, f"{where}, host {host[:64]}")
        if text and len(reasons) < MAX_REASONS and (wanted is None or host in wanted):
            reasons[host] = text
    return reasons


def filter_result(value: Any, hosts: Sequence[str] | None = None) -> Verdict:
    """Kept host IDs, or ``{host ID: reason}`` for the dropped ones (kept = requested - dropped)."""
    if not isinstance(value, dict):
        return Verdict(host_list(value, "filter"))
    if hosts is None:
        raise BadResult("filter returned {host ID: reason} for dropped hosts: the requested hosts are needed")
    reasons = reason_map(value, hosts, "filter")
    return Verdict([h for h in hosts if h not in value], reasons)


#: the largest integer a float holds (about 1.8e308); past it float() raises OverflowError
_FLOAT_INT = int(sys.float_info.max)


def score_result(value: Any, hosts: Sequence[str] | None = None) -> Verdict:
    """``[(host ID, number), ...]`` or ``(host ID, number, reason)`` triples; numbers become floats."""
    if not isinstance(value, list):
        raise BadResult(f"score returned {_kind(value)}, expected a list of (host, score) pairs")
    wanted = None if hosts is None else set(hosts)
    pairs: list[tuple[str, float]] = []
    reasons: dict[str, str] = {}
    for entry in value:
        if not (isinstance(entry, list) and len(entry) in (2, 3) and isinstance(entry[0], str)):
            raise BadResult(f"bad score entry {entry!r:.200}: expected (host ID, number) or (host ID, number, reason)")
        score = entry[1]
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise BadResult(f"bad score for host {entry[0]}: {score!r} is not a number")
        if isinstance(score, float) and math.isnan(score):
            raise BadResult(f"bad score for host {entry[0]}: NaN")
        if not isinstance(score, float) and not -_FLOAT_INT <= score <= _FLOAT_INT:
            raise BadResult(f"bad score for host {entry[0]}: an integer too large for a float (over 1.8e308)")
        pairs.append((entry[0], float(score)))
        if len(entry) == 3:
            why = reason_text(entry[2], f"score for host {entry[0][:64]}")
            if why and len(reasons) < MAX_REASONS and (wanted is None or entry[0] in wanted):
                reasons[entry[0]] = why
    return Verdict(pairs, reasons)


def aligned_scores(value: Any, hosts: Any) -> list[float] | None:
    """The numbers of a score result that is exactly one ``(host, number)`` pair per requested host, in the
    request's order, each number finite (a float, or an int that a float holds); None for anything else.

    The worker sends such a result as the bare numbers (the pool's ``aligned_scores``): :func:`score_result`
    of the pairs would give these same floats, paired with ``hosts`` in order, and no reasons. Anything else
    (NaN, infinity, bool, a reason, a foreign, missing or duplicate host, another order) goes the usual way.
    """
    if type(value) not in (list, tuple) or type(hosts) is not list or len(value) != len(hosts):
        return None
    # a few passes that run in C (no plugin code runs: only exact built-in types are compared)
    if not set(map(type, value)) <= _SEQUENCES or not set(map(len, value)) <= _PAIR_LEN:
        return None
    names = list(map(_FIRST, value))
    if not set(map(type, names)) <= _STR or names != hosts:
        return None
    numbers = list(map(_SECOND, value))
    kinds = set(map(type, numbers))
    if not kinds <= _NUMBER:
        return None
    if kinds != _FLOAT:
        try:
            numbers = list(map(float, numbers))  # what score_result makes of an int
        except OverflowError:  # an int past a float's range: it goes the usual way
            return None
    return numbers if all(map(math.isfinite, numbers)) else None


_SEQUENCES, _PAIR_LEN, _STR, _FLOAT, _NUMBER = frozenset((list, tuple)), {2}, {str}, {float}, frozenset((int, float))
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def checked_aligned(numbers: Any, hosts: Sequence[str]) -> list[float]:
    """A worker's aligned numbers (:func:`aligned_scores`) as read from its reply, checked again cheaply
    (the plugin's process could write anything): one finite float per requested host; BadResult otherwise."""
    if type(numbers) is not list or len(numbers) != len(hosts):
        raise BadResult(f"the plugin's worker sent {_kind(numbers)} as aligned scores for "
                        f"{counted(len(hosts), 'host')}")
    for score in numbers:
        if type(score) is not float or score - score != 0.0:  # NaN and infinity give NaN
            raise BadResult(f"the plugin's worker sent a bad aligned score: {score!r:.80}")
    return numbers


def balance_result(value: Any, hosts: Sequence[str] | None = None) -> Verdict:
    """``(vm_id or None/"", [host_ids])``, optionally a third element: a reason or ``{host ID: reason}``."""
    if not (isinstance(value, list) and len(value) in (2, 3)):
        raise BadResult(f"balance returned {value!r:.100}, expected (vm_id, [host_ids])")
    vm = "" if value[0] is None else value[0]
    if not isinstance(vm, str):
        raise BadResult(f"balance returned VM {vm!r}, expected a VM ID string or None")
    proposal = (vm, host_list(value[1], "balance"))
    extra = value[2] if len(value) == 3 else None
    if isinstance(extra, dict):
        return Verdict(proposal, reason_map(extra, hosts, "balance"))
    return Verdict(proposal, reason=reason_text(extra, "balance"))


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"a {type(value).__name__} ({str(value)[:80]!r})"


@dataclass(frozen=True)
class UnitKind:
    """One kind of plugin unit: the method a class defines, what it gets, what it must return."""

    kind: str  # filter | score | balance (the values of vmsched.messages.Kind)
    method: str  # do_filter | do_score | do_balance
    params: tuple[str, ...]  # the method's parameters after self, in order
    operation: str  # the engine's XML-RPC method that runs it
    read: Callable[[Any, Sequence[str] | None], Verdict]  # raw result, requested hosts -> Verdict, or BadResult

    def args(self, hosts: list[str], vm: str, properties: dict[str, str]) -> tuple[Any, ...]:
        """The positional arguments of ``method`` for one request."""
        values = {"hosts": hosts, "vm": vm, "args": properties}
        return tuple(values[name] for name in self.params)

    def check(self, value: Any, hosts: Sequence[str] | None = None) -> Any:
        """The unit's raw result -> the checked value in the old shape (reasons left out), or BadResult."""
        return self.read(value, hosts).value

    @property
    def signature(self) -> str:
        return f"{self.method}(self, {', '.join(self.params)})"


KINDS: tuple[UnitKind, ...] = (
    UnitKind("filter", "do_filter", ("hosts", "vm", "args"), "runFilters", filter_result),
    UnitKind("score", "do_score", ("hosts", "vm", "args"), "runCostFunctions", score_result),
    UnitKind("balance", "do_balance", ("hosts", "args"), "runLoadBalancing", balance_result),
)

#: The same, by kind name.
KIND: dict[str, UnitKind] = {k.kind: k for k in KINDS}


# --- tuner plugins of the policy agent (docs/policy-agent.md, "Tuner plugins") -------------------------
# Not scheduling units: not in KINDS, never in the engine's catalog. The agent runs ``Tuner().do_tune(facts)``
# of each file in its own tuner folder through a PluginPool, and checks every proposal itself.
TUNE_CLASS, TUNE_METHOD = "Tuner", "do_tune"
#: proposals kept per tuner plugin and round
MAX_PROPOSALS = 1000


def tune_result(value: Any) -> list[Any]:
    """A tuner plugin's result: a list of proposals (at most :data:`MAX_PROPOSALS` kept); BadResult otherwise.
    Each proposal is checked by the agent (a malformed one is refused there, with its reason)."""
    if not isinstance(value, list):
        raise BadResult(f"do_tune returned {_kind(value)}, expected a list of proposals")
    return value[:MAX_PROPOSALS]
