"""Small JSON documents the agent keeps on disk: written atomically, checksummed, moved aside when unusable.

Used by the checkpoint (host state) and the transient-policy store. A write is
a temporary file, write, fsync, rename, fsync of the folder, so a crash leaves
either the old document or the new one. A read that fails says why; it never
raises or blocks, whatever is at the path: it reads regular files only (a FIFO
or a device is refused without reading it), up to :data:`MAX_BYTES`, and JSON
nested deeper than the interpreter can parse is refused like any other damage.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the largest document read; a checkpoint of 16,384 allocations takes about 2 MiB
MAX_BYTES = 16 << 20
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write(path: Path, key: str, payload: dict) -> None:
    """Store ``payload`` under ``key`` with its checksum, atomically (mode 0600)."""
    data = (json.dumps({"checksum": digest(payload), key: payload}, indent=1, sort_keys=True) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read(path: Path, key: str) -> tuple[Any, str | None]:
    """(payload, None), or (None, reason) when the file is missing, unreadable, not a regular file, larger
    than MAX_BYTES, not JSON or fails its checksum.

    A missing file's reason is ``"missing"``. The file is opened without blocking (a FIFO would wait for a
    writer forever) and checked before a byte is read.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                return None, f"not a regular file but {_KINDS.get(stat.S_IFMT(mode), 'something else')}"
            with open(fd, "rb", closefd=False) as fh:
                raw = fh.read(MAX_BYTES + 1)
        finally:
            os.close(fd)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror or exc}"
    if len(raw) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES} bytes: not written by the agent"
    try:
        doc = json.loads(raw)
        payload = doc[key]
        intact = doc.get("checksum") == digest(payload)
    except RecursionError:
        return None, f"not a valid {key} document: JSON nested too deeply"
    except (ValueError, KeyError, TypeError) as exc:
        return None, f"not a valid {key} document: {exc!r}"
    if not intact:
        return None, "checksum mismatch (truncated or edited file)"
    return payload, None


def quarantine(path: Path) -> Path | None:
    """Move an unusable file aside (kept for inspection); where it went, or None."""
    if not os.path.lexists(path):  # a dangling or looping symbolic link is moved aside too
        return None
    dest = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    try:
        os.replace(path, dest)
    except OSError as exc:
        log.warning("could not move the unusable file %s aside: %s", path, exc)
        return None
    return dest
