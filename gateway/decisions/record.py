"""A decision as the log keeps it: plain values by name (:func:`keep`), and the record a reader gets.

:func:`keep` takes what the log keeps of one decision: no object of the request, the units' outcomes or the
engine's decision outlives it. ``orjson.dumps`` serialises it into one bytes object (JSON) on the request
path; :func:`record_of` builds the JSON-able record a reader gets from it, with its plain-language summary
(:mod:`vmsched.gateway.decisions.summary`). :func:`matches` answers the ``GET /v1/decisions`` filters.
Everything a plugin supplied (errors, host IDs it returned) is kept as data; whoever renders it must escape it.
"""

from __future__ import annotations

import itertools
import re
import secrets
import socket
from typing import Any

from vmsched.gateway.decisions.summary import SUMMARIES
from vmsched.decide.rules import ALL_FILTERS_FAILED, Decision
from vmsched.decide.weights import finite

OPS = ("filter", "score", "balance")

_ID_PREFIX = secrets.token_hex(8)  # this process's; IDs differ across gateway replicas and restarts
_ID_COUNTER = itertools.count()


def new_id() -> str:
    """A decision ID: 32 hex digits, a random per-process prefix and a counter (no system call per record)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def gateway_label(configured: str = "") -> str:
    """A routing-key-safe label of this gateway: the setting, else the host name."""
    label = re.sub(r"[^A-Za-z0-9_-]", "-", configured or socket.gethostname())[:64]
    return label or "gateway"


def record_of(kept: dict[str, Any], record_id: str, at: float, gateway: str) -> dict[str, Any]:
    """The record readers get (the API, the console, the other replicas, the stdout line) of what :func:`keep`
    kept."""
    units = [_unit_record(u, kept["hosts"]) for u in kept["units"]]
    record: dict[str, Any] = {
        "id": record_id,
        "time": at,
        "op": kept["op"],
        "gateway": gateway,
        "vm": kept["vm"],
        "hosts": list(kept["hosts"]),
        "units": units,
        "result": kept["result"],
        "result_code": 1 if kept["plugin_errors"] or kept["errors"] else 0,
        "plugin_errors": kept["plugin_errors"],
        "errors": list(kept["errors"]),
        # nothing ran, or every unit failed
        "fallback": kept["bus_failed"] or not any(u["ok"] for u in units) or ALL_FILTERS_FAILED in kept["errors"],
        "duration": round(kept["duration"], 6),
        "facts_age": kept["facts_age"],
        "missing_facts": kept["missing_facts"],
    }
    if kept["op"] == "balance":
        record["unit"] = kept["unit"]
    record["summary"] = SUMMARIES[kept["op"]](record)
    return record


def keep(op: str, req: Any, decision: Decision, outcomes: Any, bus_failed: bool, duration: float,
         facts_age: dict[str, float] | None = None) -> dict[str, Any]:
    """What the log keeps of one decision: plain values (strings, numbers, lists, dicts) by name, which
    ``orjson.dumps`` makes one bytes object (a non-finite float is written as null, as the record shows it);
    ``outcomes`` as the operation's ``outcomes``/``no_outcomes`` gave them (a list of outcomes, or a balance's one
    outcome or None).

    ``units`` holds each unit's outcome as a dict: ``unit``, ``kind``, ``ok``, ``error``, ``timed_out``,
    ``duration``, ``reasons``, and by kind ``dropped`` (filter: the requested hosts it dropped), ``factor`` and
    ``scores`` (score: its ``(host, score)`` pairs), ``vm``, ``hosts`` and ``reason`` (balance). ``unit`` is the
    balancer asked (balance), "" otherwise; ``missing_facts`` a messages.MissingFacts as a dict.
    """
    hosts = list(req.hosts)
    if op == "filter":
        units = _filter_units(hosts, outcomes or [], decision.dropped)
    elif op == "score":
        units = [{**_head(o), "factor": o.factor, "scores": o.scores} for o in outcomes or []]
    elif outcomes is not None:  # a balance's one outcome
        units = [{**_head(outcomes), "vm": outcomes.vm, "hosts": outcomes.hosts, "reason": outcomes.reason}]
    else:
        units = []
    # req.unit only on a balance request: getattr(req, "unit", "") on another one makes pydantic raise (slow)
    return {"op": op, "vm": req.vm if op != "balance" else "", "unit": req.unit if op == "balance" else "",
            "hosts": hosts, "units": units, "result": decision.result, "plugin_errors": decision.plugin_errors,
            "errors": decision.errors, "bus_failed": bus_failed, "duration": duration, "facts_age": facts_age or {},
            "missing_facts": decision.missing_facts.model_dump() if decision.missing_facts is not None else None}


def _head(o: Any) -> dict[str, Any]:
    return {"unit": o.unit, "kind": o.kind, "ok": o.ok, "error": o.error, "timed_out": o.timed_out,
            "duration": o.duration, "reasons": o.reasons}


def _filter_units(hosts: list[str], outcomes: list[Any], dropped: list[set[str] | None] | None) -> list[dict[str, Any]]:
    """Each filter unit keeps the hosts it dropped, not the ones it kept: filter_decision's sets when it made them
    (one per outcome), else worked out here. A failing filter drops nothing."""
    if dropped is None or len(dropped) != len(outcomes):
        offered = set(hosts)
        dropped = [offered.difference(o.hosts) if o.ok else None for o in outcomes]
    return [{**_head(o), "dropped": list(gone) if o.ok and gone else []} for o, gone in zip(outcomes, dropped)]


def _unit_record(kept: dict[str, Any], hosts: list[str]) -> dict[str, Any]:
    """A unit's part of the record: what :func:`keep` kept of it, in the same order."""
    unit = {**kept, "duration": round(kept["duration"], 6), "reasons": dict(kept["reasons"])}
    if "dropped" in kept:
        gone = set(kept["dropped"])
        unit["dropped"] = [h for h in hosts if h in gone]  # in the engine's order
    if "scores" in kept:
        # JSON has no infinity: a plugin's infinite score shows as null (strict JSON for the API and the log lines)
        unit["scores"] = {h: s if finite(s) else None for h, s in kept["scores"]}
    if "reason" in kept:
        unit["hosts"] = list(kept["hosts"])
    return unit


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
