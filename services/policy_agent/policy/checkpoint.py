"""The agent's local checkpoint of host-level state (pool and allocations).

Written atomically (temporary file, write, fsync, rename, fsync of the
folder) with a checksum; validated on load. A checkpoint that is missing,
corrupt or inconsistent is never fatal: :func:`load` says why it cannot be
used and the agent rebuilds the state from the domains' metadata.

Version 2 keys the state to the machine (libvirt's host UUID), not to the
agent's bus name: an agent restarted under another ``--host-id`` keeps its
pool and allocations. Version 1 (keyed by the host ID) is still read and is
rewritten as version 2 by the next save.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from . import cpuset
from .allocation import Pools

log = logging.getLogger(__name__)

VERSION = 2
READABLE = (1, 2)
FILENAME = "checkpoint.json"


class Held(BaseModel):
    name: str
    cpus: str


class Checkpoint(BaseModel):
    version: int = VERSION
    machine: str | None = None  # libvirt's host UUID (v2); v1 had none
    host_id: str  # the agent's host ID (bus name) when it was written
    pool: str = ""
    allocations: dict[str, Held] = Field(default_factory=dict)  # uuid -> held CPUs
    saved_at: float = 0.0

    @classmethod
    def of(cls, machine: str, host_id: str, pools: Pools) -> "Checkpoint":
        return cls(
            machine=machine,
            host_id=host_id,
            pool=cpuset.fmt(pools.pool),
            allocations={u: Held(name=pools.name(u), cpus=cpuset.fmt(c)) for u, c in sorted(pools.allocations.items())},
            saved_at=time.time(),
        )

    def to_pools(self, host_cpus: frozenset[int]) -> Pools:
        pools = Pools(host_cpus=host_cpus, pool=cpuset.parse(self.pool) if self.pool else frozenset())
        for uuid, held in self.allocations.items():
            pools.assign(uuid, held.name, cpuset.parse(held.cpus))
        return pools


@dataclass
class Loaded:
    """A usable checkpoint: the pools, and what it was written as (for logging a rename or a migration)."""

    pools: Pools
    version: int
    host_id: str


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def save(path: Path, ckpt: Checkpoint) -> None:
    payload = ckpt.model_dump(mode="json")
    doc = {"checksum": _digest(payload), "checkpoint": payload}
    data = (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()
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


def load(path: Path, machine: str, host_cpus: frozenset[int]) -> tuple[Loaded | None, str | None]:
    """(loaded, None) when usable; (None, reason) when missing or unusable.

    Usable means: this machine's (v2: same ``machine``; v1 carries no machine key and is taken as this
    machine's, whatever host ID wrote it), valid and consistent. The host ID does not matter.
    """
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "no checkpoint yet"
    except OSError as exc:
        return None, f"cannot read: {exc.strerror}"
    try:
        doc = json.loads(raw)
        payload = doc["checkpoint"]
        if doc.get("checksum") != _digest(payload):
            return None, "checksum mismatch (truncated or edited file)"
        ckpt = Checkpoint.model_validate(payload)
    except (ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ValidationError):
            return None, f"invalid content: {exc.errors()[0].get('msg')}"
        return None, f"not a valid checkpoint document: {exc}"
    if ckpt.version not in READABLE:
        return None, f"unsupported version {ckpt.version}"
    if ckpt.version >= 2 and ckpt.machine != machine:
        return None, f"written for machine {ckpt.machine!r} (host {ckpt.host_id!r}), this is machine {machine!r}"
    try:
        pools = ckpt.to_pools(host_cpus)
    except ValueError as exc:
        return None, f"invalid CPU set: {exc}"
    problems = pools.consistency_errors()
    if problems:
        return None, "inconsistent: " + "; ".join(problems)
    return Loaded(pools, ckpt.version, ckpt.host_id), None


def quarantine(path: Path) -> Path | None:
    """Move an unusable checkpoint aside (kept for inspection)."""
    if not path.exists():
        return None
    dest = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
    try:
        os.replace(path, dest)
    except OSError as exc:
        log.warning("could not move the unusable checkpoint %s aside: %s", path, exc)
        return None
    return dest
