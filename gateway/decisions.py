"""A scheduling decision as the decision log keeps it: what each unit did to each host, and why.

Pure functions: :func:`build` turns one request, the units' full outcomes and
the engine's decision into a JSON-able record with a plain-language
``summary`` ("kept 3 of 5 hosts: vmsched_Memory dropped 2 (h1: free 1.2 GiB < 4.1 GiB
needed; h3: ...)", with the reasons units gave, :mod:`vmsched.runtime.contract`), and
:func:`matches` answers the ``GET /v1/decisions`` filters. Everything a
plugin supplied (errors, host IDs it returned) is kept as data; whoever
renders it must escape it.
"""

from __future__ import annotations

import itertools
import secrets
import time
from typing import Any, Callable


from vmsched.gateway.render import ALL_FILTERS_FAILED, Decision
from vmsched.gateway.scores import finite
from vmsched.messages import BalanceOutcome, FilterOutcome, ScoreOutcome

#: hosts named in one summary clause at most
SHOWN = 3
_ID_PREFIX = secrets.token_hex(8)  # this process's; IDs differ across gateway replicas and restarts
_ID_COUNTER = itertools.count()


def new_id() -> str:
    """A decision ID: 32 hex digits, a random per-process prefix and a counter (no system call per record)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def _short(hosts: list[str]) -> str:
    shown = ", ".join(h for h in hosts[:SHOWN])
    return shown + (f" and {len(hosts) - SHOWN} more" if len(hosts) > SHOWN else "")


def _failure(o: Any) -> str:
    if o.timed_out:
        return "timed out"
    return (o.error or "failed").splitlines()[0][:200] if (o.error or "").strip() else "failed"


def _base(o: Any) -> dict[str, Any]:
    return {"unit": o.unit, "kind": o.kind, "ok": o.ok, "error": o.error, "timed_out": o.timed_out,
            "duration": round(o.duration, 6), "reasons": dict(o.reasons)}


def _filter_units(hosts: list[str], outcomes: list[FilterOutcome]) -> list[dict[str, Any]]:
    units = []
    for o in outcomes:
        unit = _base(o)
        returned = set(o.hosts)  # kept: the others (readers get them from for_reader; records stay small)
        unit["dropped"] = [h for h in hosts if h not in returned] if o.ok else []  # a failing filter drops nothing
        units.append(unit)
    return units


def for_reader(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the API shows it: a filter unit's ``kept`` hosts spelled out (the ring keeps only ``dropped``)."""
    if record.get("op") != "filter":
        return record
    hosts = record["hosts"]
    units = []
    for u in record["units"]:
        dropped = set(u.get("dropped", []))
        units.append({**u, "kept": [h for h in hosts if h not in dropped]})
    return {**record, "units": units}


def _score_units(outcomes: list[ScoreOutcome]) -> list[dict[str, Any]]:
    units = []
    for o in outcomes:
        unit = _base(o)
        unit["factor"] = o.factor
        # JSON has no infinity: a plugin's infinite score shows as null (strict JSON for the API and the log lines)
        unit["scores"] = {h: s if finite(s) else None for h, s in o.scores}
        units.append(unit)
    return units


def _balance_units(outcome: BalanceOutcome | None) -> list[dict[str, Any]]:
    if outcome is None:
        return []
    unit = _base(outcome)
    unit["vm"], unit["hosts"], unit["reason"] = outcome.vm, list(outcome.hosts), outcome.reason
    return [unit]


def _failed_clauses(units: list[dict[str, Any]]) -> list[str]:
    out = []
    for u in units:
        if not u["ok"]:
            what = "timed out" if u["timed_out"] else f"failed ({_failure_text(u)})"
            out.append(f"{u['unit']} {what}, ignored")
    return out


def _failure_text(u: dict[str, Any]) -> str:
    text = (u.get("error") or "").strip()
    return text.splitlines()[0][:160] if text else "no reason given"


def _reason_text(u: dict[str, Any], hosts: list[str]) -> str:
    """``h1, h2: why; h3: other`` (hosts grouped by the unit's reason), or just the hosts without reasons."""
    reasons = u.get("reasons") or {}
    if not any(h in reasons for h in hosts):
        return _short(hosts)
    groups: dict[str, list[str]] = {}
    for h in hosts:
        groups.setdefault(reasons.get(h, ""), []).append(h)
    parts = [f"{_short(hs)}: {why}" if why else _short(hs) for why, hs in groups.items()]
    more = f"; {len(parts) - SHOWN} more reasons" if len(parts) > SHOWN else ""
    return "; ".join(parts[:SHOWN]) + more


def filter_summary(record: dict[str, Any]) -> str:
    hosts, units = record["hosts"], record["units"]
    kept = record["result"] if isinstance(record["result"], list) else []
    head = f"kept {len(kept)} of {len(hosts)} hosts"
    clauses = [f"{u['unit']} dropped {len(u['dropped'])} ({_reason_text(u, u['dropped'])})"
               for u in units if u["ok"] and u["dropped"]]
    clauses += _failed_clauses(units)
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def score_summary(record: dict[str, Any]) -> str:
    result = record["result"] if isinstance(record["result"], list) else []
    ranked = sorted(result, key=lambda pair: pair[1])  # the engine's weights: lower is better
    head = (f"best {ranked[0][0]} (weight {ranked[0][1]}, lowest) of {len(result)} scored hosts" if ranked
            else "no host scored")
    ok = [u for u in record["units"] if u["ok"]]
    clauses = [f"{len(ok)} of {len(record['units'])} units scored"] if record["units"] else []
    scored = {pair[0] for pair in result}
    unscored = [h for h in record["hosts"] if h not in scored]
    if unscored and result:
        clauses.append(f"no score for {_short(unscored)}")
    best = ranked[0][0] if ranked else None
    clauses += [f"{u['unit']} on {best}: {u['reasons'][best]}" for u in ok if best in u.get("reasons", {})][:SHOWN]
    clauses += _failed_clauses(record["units"])
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def balance_summary(record: dict[str, Any]) -> str:
    result = record["result"]
    vm, hosts = (result[0], result[1]) if isinstance(result, list) and len(result) == 2 else ("", [])
    name = record["units"][0]["unit"] if record["units"] else record.get("unit", "the balancer")
    head = (f"{name} proposes migrating VM {vm} to one of {len(hosts)} hosts ({_short(hosts)})" if vm
            else f"{name}: no migration")
    clauses = [u["reason"] for u in record["units"] if u["ok"] and u.get("reason")]
    clauses += _failed_clauses(record["units"])
    return head + (": " + "; ".join(clauses) if clauses else "") + _fallback_tail(record)


def _fallback_tail(record: dict[str, Any]) -> str:
    if not record["fallback"]:
        return ""
    why = "; ".join(record["errors"][:2]) or "nothing ran"
    return f" [fallback: {why}]"


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "filter": filter_summary, "score": score_summary, "balance": balance_summary}


def build(op: str, req: Any, decision: Decision, outcomes: Any, *, bus_failed: bool, gateway: str,
          duration: float, facts_age: dict[str, float | None] | None = None,
          at: float | None = None, record_id: str | None = None) -> dict[str, Any]:
    """The record of one decision; ``outcomes`` as the operation's ``outcomes``/``no_outcomes`` gave them."""
    hosts = list(getattr(req, "hosts", []))
    if op == "filter":
        units = _filter_units(hosts, outcomes or [])
    elif op == "score":
        units = _score_units(outcomes or [])
    else:
        units = _balance_units(outcomes)
    nothing_ran = not units
    all_failed = bool(units) and not any(u["ok"] for u in units)
    record: dict[str, Any] = {
        "id": record_id or new_id(),
        "time": time.time() if at is None else at,
        "op": op,
        "gateway": gateway,
        "vm": getattr(req, "vm", ""),
        "hosts": hosts,
        "units": units,
        "result": decision.result,
        "result_code": decision.result_code,
        "plugin_errors": decision.plugin_errors,
        "errors": list(decision.errors),
        "fallback": bus_failed or nothing_ran or all_failed or ALL_FILTERS_FAILED in decision.errors,
        "duration": round(duration, 6),
        "facts_age": facts_age or {},
    }
    if op == "balance":
        record["unit"] = getattr(req, "unit", "")
    record["summary"] = SUMMARIES[op](record)
    return record


def has_errors(record: dict[str, Any]) -> bool:
    return bool(record["result_code"] or record["fallback"] or any(not u["ok"] for u in record["units"]))


def matches(record: dict[str, Any], vm: str | None = None, host: str | None = None, op: str | None = None,
            errors_only: bool = False) -> bool:
    """The ``GET /v1/decisions`` filters; ``host`` matches a host the engine offered or a unit proposed."""
    if op and record["op"] != op:
        return False
    if vm and record["vm"] != vm and not any(u.get("vm") == vm for u in record["units"]):
        return False
    if host and host not in record["hosts"]:
        return False
    return not errors_only or has_errors(record)
