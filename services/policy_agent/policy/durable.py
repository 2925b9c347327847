"""Small JSON documents the agent keeps on disk: written atomically, checksummed, moved aside when unusable.

Used by the checkpoint (host state) and the transient-policy store. A write is
a temporary file, write, fsync, rename, fsync of the folder, so a crash leaves
either the old document or the new one. A read that fails says why; it never
raises for a missing, truncated or edited file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write(path: Path, key: str, payload: dict) -> None:
    """Store ``payload`` under ``key`` with its checksum, atomically (mode 0600)."""
    data = (json.dumps({"checksum": digest(payload), key: payload}, indent=1, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read(path: Path, key: str) -> tuple[Any, str | None]:
    """(payload, None), or (None, reason) when the file is missing, unreadable, not JSON or fails its checksum.

    A missing file's reason is ``"missing"``.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    try:
        doc = json.loads(raw)
        payload = doc[key]
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"not a valid {key} document: {exc!r}"
    if doc.get("checksum") != digest(payload):
        return None, "checksum mismatch (truncated or edited file)"
    return payload, None


def quarantine(path: Path) -> Path | None:
    """Move an unusable file aside (kept for inspection); where it went, or None."""
    if not path.exists():
        return None
    dest = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    try:
        os.replace(path, dest)
    except OSError as exc:
        log.warning("could not move the unusable file %s aside: %s", path, exc)
        return None
    return dest
