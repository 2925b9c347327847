"""Tables for people: ``vmsched policy list`` and ``policy get`` (``--json`` prints the reply as it is)."""

from __future__ import annotations

from typing import Any


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
    if len(rows) == 1:
        return "no guest has a policy on this host\n"
    return table(rows)


def policy(view: dict) -> str:
    """``policy get``: one field a line."""
    rows = [["guest", f"{view.get('guest')} ({view.get('uuid')})"]]
    for key in ("state", "status", "policy", "allocation", "desired", "warnings", "error"):
        rows.append([key, summary(view.get(key))])
    rows += [[key, summary(value)] for key, value in view.items() if key not in {"guest", "uuid", *(r[0] for r in rows)}]
    return table(rows)
