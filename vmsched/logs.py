"""The log of a vmsched process: every line in one format, text or JSON (``--log-format``).

Text: ``TIME LEVEL LOGGER: MESSAGE``. JSON: one object a line, ``ts``, ``level``,
``logger``, ``message`` (and ``exc``); a record that carries ``fields`` (an
audit line) is written as those fields alone, so shippers parse it whole.
"""

from __future__ import annotations

import json
import logging
import sys

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
