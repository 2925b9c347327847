"""What a tuner plugin sees and what it may return (pure: the sandboxed call is in adaptive/plugins.py).

Input, one JSON object::

    {"interval": 10.0, "hysteresis": 3, "shared": "0-7",
     "host": [{"pcpu_pct": {"0": 12.5, ...}}, ...],                    # oldest first
     "guests": {UUID: {"name", "nvcpus", "policy": {...static + adaptive...},
                       "pins": {"0": "1-3"}, "cpu_shares", "cap_percent",
                       "samples": [{"cpu_pct", "wait_pct"}, ...]}}}      # since its last tuned change

Output: a list of proposals ``{"guest": UUID or name, "field": "cpu_shares" | "vcpu_quota" | "vcpus",
"value": ..., "reason": "..."}``: a weight (int), a cap in percent of one CPU per vCPU (number), or
``{vCPU: CPU set}`` (libvirt syntax). Whatever comes back becomes a :class:`Proposal` that the guard checks
like a built-in tuner's: a malformed one is refused with its reason, never applied.
"""

from __future__ import annotations

from typing import Any

from vmsched import cpuset
from vmsched.runtime.contract import MAX_PROPOSALS, BadResult, tune_result

from .config import TunerConfig
from .types import Proposal, TuneInput

MAX_REASON = 300


def plugin_input(inp: TuneInput, cfg: TunerConfig) -> dict[str, Any]:
    return {
        "interval": cfg.interval,
        "hysteresis": cfg.hysteresis,
        "shared": cpuset.fmt(inp.shared),
        "host": [{"pcpu_pct": {str(c): v for c, v in sorted(s.pcpu_pct.items())}} for s in inp.host],
        "guests": {g.uuid: {"name": g.name, "nvcpus": g.nvcpus, "policy": g.policy.to_dict(),
                            "pins": {str(i): cpuset.fmt(c) for i, c in sorted(g.pins.items())},
                            "cpu_shares": g.cpu_shares, "cap_percent": g.cap_percent,
                            "samples": [{"cpu_pct": s.cpu_pct, "wait_pct": s.wait_pct} for s in g.samples]}
                   for g in inp.guests.values()},
    }


def plugin_proposals(value: Any, tuner: str, inp: TuneInput) -> tuple[list[Proposal], list[str]]:
    """(proposals to check, problems with the result as a whole)."""
    try:
        items = tune_result(value)
    except BadResult as exc:
        return [], [f"{tuner}: {exc}"]
    problems = []
    if len(value) > MAX_PROPOSALS:
        problems.append(f"{tuner} returned {len(value)} proposals; the first {MAX_PROPOSALS} are considered")
    by_name = {g.name: g.uuid for g in inp.guests.values()}
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            out.append(Proposal(f"#{i}", tuner, "?", item, f"proposal {i} is a {type(item).__name__}, not an object"))
            continue
        guest = str(item.get("guest", ""))
        uuid = guest if guest in inp.guests else by_name.get(guest, guest)
        field = str(item.get("field", ""))
        reason = str(item.get("reason") or "no reason given")[:MAX_REASON].replace("\n", " ")
        out.append(Proposal(uuid, tuner, field, _value(field, item.get("value")), reason))
    return out, problems


def _value(field: str, raw: Any) -> Any:
    """Plugin values in the engine's types; what cannot be converted is passed on for the guard to refuse."""
    if field != "vcpus" or not isinstance(raw, dict):
        return raw
    out: dict[Any, Any] = {}
    for k, v in raw.items():
        try:
            vcpu: Any = int(k)
        except (TypeError, ValueError):
            vcpu = k
        try:
            out[vcpu] = cpuset.parse(str(v))
        except cpuset.CpuSetError:
            out[vcpu] = v  # refused by the guard: not a CPU set
    return out
