"""The audit trail of the JSON API: one JSON line per operate call or refused call.

Lines go to the ``vmsched.audit`` logger, in the process's log format
(:mod:`vmsched.logs`): with ``--log-format json`` each is the bare JSON object
below, so that log shippers parse it whole; in text, its fields as
``key=value``. Every call to a protected route is also counted in
``vmsched_gateway_audit_total{role,outcome}``. A token's value never appears:
only its name from the tokens file.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from vmsched import metrics
from vmsched.logs import JsonFormatter
from vmsched.tokens import Identity, Role

log = logging.getLogger("vmsched.audit")
QUOTED = frozenset(' ="\\')  # a text value with one of these is written as a JSON string


def _setup() -> None:
    """Without a configured log (the gateway's app embedded elsewhere), audit lines still reach stderr, as JSON."""
    if not log.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        log.addHandler(handler)
        log.propagate = False
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)  # audit lines are written whatever the log level


def _value(text: str) -> str:
    """A field's text as written: plain, else (empty, or with a character of QUOTED) as a JSON string."""
    return text if text and QUOTED.isdisjoint(text) else json.dumps(text)


def _text(line: dict[str, Any]) -> str:
    pairs = (f"{key}={_value(str(value))}" for key, value in line.items()
             if key not in ("ts", "event") and value is not None)
    return "audit " + " ".join(pairs)


for _role in (*(role.value for role in Role), "none"):  # every series at 0 from start-up
    for _outcome in ("ok", "refused", "error", "unauthenticated", "forbidden"):
        metrics.AUDIT.labels(role=_role, outcome=_outcome)


def outcome_of(status: int) -> str:
    if status == 401:
        return "unauthenticated"
    if status == 403:
        return "forbidden"
    if status >= 500:
        return "error"
    if status >= 400:
        return "refused"
    return "ok"


def record(*, role: Role | None, identity: Identity | None, method: str, route: str, operation: str,
           params: dict[str, Any], status: int, client: str | None) -> None:
    """Count the call; write the audit line for operate calls and for every refusal (401/403)."""
    outcome = outcome_of(status)
    metrics.AUDIT.labels(role=role.value if role else "none", outcome=outcome).inc()
    if role is not Role.OPERATE and outcome not in ("unauthenticated", "forbidden"):
        return
    _setup()
    line = {
        "ts": round(time.time(), 3),
        "event": "vmsched.audit",
        "who": identity.name if identity else None,
        "via": identity.kind if identity else "none",
        "role": role.value if role else None,
        "method": method,
        "route": route,
        "operation": operation,
        "host": params.get("host"),
        "guest": params.get("guest"),
        "status": status,
        "outcome": outcome,
        "client": client,
    }
    log.info(_text(line), extra={"fields": line})
