"""A decision's record at once, as the log's ring gives it to a reader later."""

from __future__ import annotations

import time
from typing import Any

from vmsched.gateway.decisions.record import keep, new_id, record_of


def build(op: str, req: Any, decision: Any, outcomes: Any, *, bus_failed: bool, gateway: str, duration: float,
          facts_age: dict[str, float] | None = None, at: float | None = None,
          record_id: str | None = None) -> dict[str, Any]:
    kept = keep(op, req, decision, outcomes, bus_failed, duration, facts_age)
    return record_of(kept, record_id or new_id(), time.time() if at is None else at, gateway)
