"""The host map file (``--facts-host-map``): engine host IDs to agent host IDs (docs/facts.md, "Host identity")."""

from __future__ import annotations

import json
from pathlib import Path


def load_host_map(path: Path | None) -> dict[str, str]:
    """``engine host ID = agent host ID`` lines (``#`` comments), or JSON object; {} without a file."""
    if path is None:
        return {}
    text = Path(path).read_text()
    if text.lstrip().startswith("{"):
        data = json.loads(text)
        if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
            raise ValueError(f"{path}: expected a JSON object of engine host ID -> agent host ID strings")
        return data
    mapping: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{path}:{number}: expected ENGINE_HOST_ID = AGENT_HOST_ID")
        mapping[key.strip()] = value.strip()
    return mapping
