"""How much one scheduling request may ask: hosts, units, string lengths.

The same limits hold for XML-RPC and JSON (:class:`~vmsched.gateway.engine.scheduler.Scheduler`
checks them before anything goes on the bus); each refusal names the limit
and the setting that raises it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Iterable

from pydantic import BaseModel


class OverLimit(ValueError):
    """A request over one or more limits; ``problems`` lists each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def _setting(name: str) -> str:
    return f"setting {name}: --{name.replace('_', '-')} or VMSCHED_{name.upper()}"


@dataclass(frozen=True)
class Limits:
    max_hosts: int = 10000
    max_units: int = 200
    max_string: int = 4096

    def check(self, req: BaseModel) -> None:
        """Raise :class:`OverLimit` naming every limit ``req`` (a filter, score or balance request) is over."""
        out: list[str] = []
        hosts: list[str] = getattr(req, "hosts", [])
        units = _unit_names(req)
        if len(hosts) > self.max_hosts:
            out.append(f"hosts: {len(hosts)} host IDs, more than the limit of {self.max_hosts} ({_setting('max_hosts')})")
        if len(units) > self.max_units:
            out.append(f"units: {len(units)} units, more than the limit of {self.max_units} ({_setting('max_units')})")
        properties: dict[str, str] = getattr(req, "properties", {})
        fields: list[tuple[str, Iterable[str]]] = [
            ("hosts", hosts), ("units", units), ("vm", [getattr(req, "vm", "")]),
            ("properties", chain(properties, properties.values())),
        ]
        for name, strings in fields:
            longest = max(map(len, strings), default=0)  # fast path: one C loop per field
            if longest > self.max_string:
                out.append(f"{name}: a string of {longest} characters, longer than the limit of {self.max_string} "
                           f"({_setting('max_string')})")
        if out:
            raise OverLimit(out)


def _unit_names(req: BaseModel) -> list[str]:
    units = getattr(req, "units", None)
    if units is None:
        return [req.unit] if hasattr(req, "unit") else []  # balance: one unit
    return [u if isinstance(u, str) else u.name for u in units]
