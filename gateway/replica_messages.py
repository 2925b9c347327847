"""The messages gateway replicas send each other on the events exchange: JSON objects that carry the
sending replica's token, a random name it draws at start (its own messages come back to it)."""

from __future__ import annotations

import json
import logging
import re
import secrets
from typing import Any

TOKEN = re.compile(r"^[0-9a-f]{12}$")


def new_token() -> str:
    """A replica's token: 12 hex digits."""
    return secrets.token_hex(6)


def read(body: bytes, routing_key: str, limit: int, log: logging.Logger, what: str) -> dict[str, Any] | None:
    """The message as a JSON object; None when it is larger than ``limit`` bytes, not JSON (logged, naming
    ``what`` reads it) or not an object."""
    if len(body) > limit:
        return None
    try:
        message = json.loads(body)
    except ValueError:
        log.warning("%s: a message on %s is not JSON: ignored", what, routing_key)
        return None
    return message if isinstance(message, dict) else None


def from_another(token: Any, own: str) -> bool:
    """``token`` is a well-formed token of another replica."""
    return isinstance(token, str) and TOKEN.match(token) is not None and token != own
