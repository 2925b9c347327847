"""The log of a vmsched process: every line in one format, text or JSON (``--log-format``).

Text: ``TIME LEVEL LOGGER: MESSAGE``. JSON: one object a line, ``ts``, ``level``,
``logger``, ``message`` (and ``exc``); a record that carries ``fields`` (an
audit line) is written as those fields alone, so shippers parse it whole.

Also how lines name a broker (:func:`broker`: never its password), and :class:`Throttle`, which keeps
a lasting trouble met by several threads to a few lines.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from typing import Callable
from urllib.parse import unquote, urlsplit

TEXT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            return json.dumps(fields)
        line = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
                "message": record.getMessage()}
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line)


def formatter(kind: str) -> logging.Formatter:
    if kind not in FORMATS:
        raise ValueError(f"log format {kind!r}: expected text or json")
    return JsonFormatter() if kind == "json" else logging.Formatter(TEXT)


def setup(level: str, kind: str = "text") -> None:
    """Every logger of the process writes to stderr in ``kind`` at ``level`` and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(kind))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


def broker(url: str) -> str:
    """A broker as log lines name it: ``amqp://HOST:PORT (vhost V, user U)`` for each node of ``url`` (a
    cluster's nodes are separated by ``;``), never its password."""
    return "; ".join(_node(part.strip()) for part in url.split(";") if part.strip())


def _node(url: str) -> str:
    try:
        parts = urlsplit(url)
        port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    except ValueError:
        return f"{url.split('://', 1)[0]}://(a URL that does not parse)"
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    return f"{parts.scheme}://{parts.hostname or 'localhost'}:{port} (vhost {vhost}, user {unquote(parts.username or 'guest')})"


class Throttle:
    """Log lines about a lasting trouble (a broker that does not answer), shared by the threads that meet it.

    The first line goes out at once, the next ones ever further apart (``first_gap``, twice that, ... at most
    ``longest`` seconds), each saying how many were held back; :meth:`clear` when the trouble is over.
    """

    def __init__(self, first_gap: float = 1.0, longest: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.first_gap, self.longest, self.clock = first_gap, longest, clock
        self._lock = threading.Lock()
        self._state: dict[str, tuple[float, float, int]] = {}  # key -> (next line at, gap after it, held back)

    def allow(self, key: str) -> str | None:
        """None: hold this line back; else the line may go out, with this ending (``""`` or how many were held)."""
        now = self.clock()
        with self._lock:
            due, gap, held = self._state.get(key, (now, self.first_gap, 0))
            if now < due:
                self._state[key] = (due, gap, held + 1)
                return None
            self._state[key] = (now + gap, min(gap * 2, self.longest), 0)
        return f" ({held} more like it since the last line)" if held else ""

    def clear(self, key: str) -> None:
        with self._lock:
            self._state.pop(key, None)


#: The process's lines about a broker it cannot reach, keyed by its URL: one line for all its threads.
BROKER_TROUBLE = Throttle()
