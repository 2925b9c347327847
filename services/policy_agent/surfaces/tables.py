"""What a person reads of the agent's replies (``--json`` prints the reply as it is): the tables of ``vmsched
policy list``, ``get``, ``set`` and ``explain``, the drawing of ``policy cpus`` and ``pool``, and the few lines
of the other commands."""

from __future__ import annotations

import time
from typing import Any

from ..plural import plural


def summary(value: Any) -> str:
    """One cell: a mapping as ``k=v`` pairs, a list comma-separated, nothing as ``-``."""
    if value is None or value == {} or value == []:
        return "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={summary(v) if not isinstance(v, dict) else _pairs(v)}" for k, v in value.items()
                        if v not in (None, {}, []))
    if isinstance(value, list):
        return ",".join(summary(v) for v in value)
    return str(value)


def _pairs(value: dict) -> str:
    return ",".join(f"{k}:{summary(v)}" for k, v in value.items())


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows) + "\n"


def policies(reply: dict) -> str:
    """``policy list``: one guest a line."""
    rows = [["GUEST", "STATE", "STATUS", "POLICY", "ALLOCATION", "ERROR"]]
    for view in reply.get("policies", []):
        rows.append([str(view.get("guest")), summary(view.get("state")), summary(view.get("status")),
                     summary(view.get("policy")), summary(view.get("allocation")), summary(view.get("error"))])
    return table(rows) if len(rows) > 1 else "no guest has a policy on this host\n"


def policy(view: dict) -> str:
    """``policy get`` and ``policy set``: one field a line; warnings, sentences of their own, separated by ``; ``."""
    rows = [["guest", f"{view.get('guest')} ({view.get('uuid')})"]]
    for key in ("state", "status", "policy", "allocation", "desired", "warnings", "error"):
        value = view.get(key)
        rows.append([key, "; ".join(map(str, value)) if key == "warnings" and value else summary(value)])
    rows += [[key, summary(value)] for key, value in view.items() if key not in {"guest", "uuid", *(r[0] for r in rows)}]
    return table(rows)


def cpus(reply: dict) -> str:
    """``policy cpus``: the host's sockets, NUMA nodes, cores and threads, and who holds each CPU."""
    topo = reply["topology"]
    lines = [f"host {reply.get('host_id')}: CPUs {reply.get('host_cpus') or '-'}; dedicated pool"
             f" {reply.get('dedicated_pool') or 'none'}, free {reply.get('free') or '-'}"]
    rows: list[list[str]] = []
    for socket in topo.get("sockets", []):
        rows.append([f"socket {socket.get('socket')}"])
        for node in socket.get("nodes", []):
            rows.append([f"  node {node.get('node')}", f"({_mib(node.get('memory_mib'))})"])
            for core in node.get("cores", []):
                rows.append([f"    core {core.get('core')}", *(_thread(t) for t in core.get("threads", []))])
    width = max((len(r) for r in rows), default=1)
    lines.append(table([r + [""] * (width - len(r)) for r in rows]).rstrip("\n"))
    if topo.get("offline"):
        lines.append(f"offline: {topo['offline']}")
    return "\n".join(lines) + "\n"


def _thread(t: dict) -> str:
    what = f"{t.get('guest')} {t.get('use')}" if t.get("state") == "held" else t.get("state")
    return f"[{t.get('cpu')} {what}]"


def _mib(value: Any) -> str:
    mib = int(value or 0)
    return f"{mib / 1024:.0f} GiB" if mib >= 1024 else f"{mib} MiB"


def deleted(reply: dict) -> str:
    """``policy delete``."""
    if reply.get("deleted"):
        return f"policy of {reply.get('guest')!r} deleted: its CPUs released, its pins reset\n"
    return f"guest {reply.get('guest')!r} has no policy: nothing to delete\n"


def reconciled(reply: dict) -> str:
    """``policy reconcile``: what the sweep checked and repaired, then every error on a line of its own."""
    lines = [f"checked {plural(reply.get('checked', 0), 'guest')} in {reply.get('duration', 0):.3f} s,"
             f" repaired {reply.get('repaired', 0)}"]
    return "\n".join([*lines, *(f"error: {e}" for e in reply.get("errors", []))]) + "\n"


def domains(reply: dict) -> str:
    """``domain start`` and ``domain stop``: the guests started (stopped) in order, and those that already were."""
    return "".join(f"{key.replace('_', ' ')}: {', '.join(names) or '-'}\n" for key, names in reply.items())


def check_start(reply: dict) -> str:
    """``policy check-start``: the agent's answer when the guest may start (a refusal goes to stderr)."""
    return f"{reply.get('message')}\n" if reply.get("allowed") else ""


def explain(reply: dict) -> str:
    """``policy explain``: the static policy, what is in force and tuned, then the tuners' last decisions."""
    rows = [["guest", f"{reply.get('guest')} ({reply.get('uuid')})"]]
    rows += [[key, summary(reply.get(key))] for key in ("policy", "desired", "tuned", "tuner")]
    decisions = [f"  {time.strftime('%H:%M:%S', time.localtime(d.get('time', 0)))} {d.get('tuner')} {d.get('field')}"
                 f" {summary(d.get('before'))} -> {summary(d.get('after'))} ({d.get('outcome')}): {d.get('reason')}\n"
                 for d in reply.get("decisions", [])]
    return table(rows) + ("decisions:\n" + "".join(decisions) if decisions else "decisions: -\n")
