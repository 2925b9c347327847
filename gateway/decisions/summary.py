"""Decision summaries: one line per record, by operation, with the reasons units gave.

"kept 3 of 5 hosts: vmsched_Memory dropped 2 (h1: free 1.2 GiB < 4.1 GiB needed; h3: ...)"
(:mod:`vmsched.runtime.contract` says how units give reasons).
"""

from __future__ import annotations

import textwrap
from typing import Any, Callable

from vmsched.gateway.decisions import ranking

#: hosts named in one summary clause at most
SHOWN = 3
#: characters of a unit's error in a summary at most
MAX_TEXT = 160


def _short(hosts: list[str]) -> str:
    shown = ", ".join(h for h in hosts[:SHOWN])
    return shown + (f" and {len(hosts) - SHOWN} more" if len(hosts) > SHOWN else "")


def _and(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``, ``a, b, c and 2 more``: whole names only."""
    if len(names) > SHOWN:
        return _short(names)
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def _clip(text: str, size: int = MAX_TEXT) -> str:
    """``text`` in at most ``size`` characters, shortened by whole words (an ID in it is never cut mid-way),
    ending with `` ...`` when shortened; only a first word longer than that is cut."""
    if len(text) <= size:
        return text
    short = textwrap.shorten(text, size, placeholder=" ...")
    return short if short != "..." else text[: size - 4] + " ..."


def _failed_clauses(units: list[dict[str, Any]]) -> list[str]:
    out = []
    for u in units:
        if not u["ok"]:
            what = "timed out" if u["timed_out"] else f"failed ({_failure_text(u)})"
            out.append(f"{u['unit']} {what}, ignored")
    return out


def _failure_text(u: dict[str, Any]) -> str:
    text = (u.get("error") or "").strip()
    return _clip(text.splitlines()[0]) if text else "no reason given"


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
    return _line(record, head, clauses)


def score_summary(record: dict[str, Any]) -> str:
    ranked = ranking.places(record)  # the engine's weights: lower is better
    best = [p for p in ranked if p.rank == 1]
    if len(best) == 1:
        head = f"best {best[0].host} (weight {best[0].weight}, lowest) of {len(ranked)} scored hosts"
    elif best:
        head = f"best {_and([p.host for p in best])}, tied at weight {best[0].weight}, of {len(ranked)} scored hosts"
    else:
        head = "no host scored"
    idle = ranking.idle(record)
    units = record["units"]
    ok = [u for u in units if u["ok"]]
    clauses = [f"{len(ok) - len(idle)} of {len(units)} units scored"] if units else []
    why_idle: dict[str, list[str]] = {}
    for unit, why in idle.items():
        why_idle.setdefault(why, []).append(unit)
    clauses += [f"{_and(names)} scored no host ({why})" for why, names in why_idle.items()]
    scored = {p.host for p in ranked}
    unscored = [h for h in record["hosts"] if h not in scored]
    if unscored and ranked:
        clauses.append(f"no score for {_short(unscored)}")
    first = best[0].host if best else None
    clauses += [f"{u['unit']} on {first}: {u['reasons'][first]}" for u in ok if first in u.get("reasons", {})][:SHOWN]
    return _line(record, head, clauses)


def balance_summary(record: dict[str, Any]) -> str:
    result = record["result"]
    vm, hosts = (result[0], result[1]) if isinstance(result, list) and len(result) == 2 else ("", [])
    name = record["units"][0]["unit"] if record["units"] else record.get("unit", "the balancer")
    head = (f"{name} proposes migrating VM {vm} to one of {len(hosts)} hosts ({_short(hosts)})" if vm
            else f"{name}: no migration")
    return _line(record, head, [u["reason"] for u in record["units"] if u["ok"] and u.get("reason")])


def _line(record: dict[str, Any], head: str, clauses: list[str]) -> str:
    """``head: clause; ...``: the operation's clauses, then the failed units' and the missing facts'; last, the
    reason of a fallback."""
    clauses = clauses + _failed_clauses(record["units"]) + _missing_facts_clauses(record)
    line = head + (": " + "; ".join(clauses) if clauses else "")
    if not record["fallback"]:
        return line
    return f"{line} [fallback: {'; '.join(record['errors'][:2]) or 'nothing ran'}]"


def _missing_facts_clauses(record: dict[str, Any]) -> list[str]:
    """``no facts for 3 of 5 hosts (no agent reports them) for vmsched_Memory``: the hosts the units that read
    facts found none for, how many and why (grouped by why)."""
    missing = record.get("missing_facts") or {}
    causes: dict[str, list[str]] = missing.get("hosts") or {}
    count = sum(len(hosts) for hosts in causes.values())
    if not count:
        return []
    why = "; ".join(f"{len(hosts)}: {cause}" if len(causes) > 1 else cause for cause, hosts in causes.items())
    return [f"no facts for {count} of {len(record['hosts'])} hosts ({why}) for {', '.join(missing.get('units', []))}"]


SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "filter": filter_summary, "score": score_summary, "balance": balance_summary}
