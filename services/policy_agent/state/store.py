"""The agent's own store of the policies of transient guests, by UUID.

A transient guest (created with ``createXML``, as oVirt's vdsm does) has no
persistent definition: its metadata dies with it. Its policy is kept here, in
``STATE_DIR/transient-policies.json``, and applied again whenever a guest
with that UUID starts. Written atomically (temporary file, write, fsync,
rename, fsync of the folder) with a checksum; an unusable file is moved aside
and the store starts empty (never fatal). Persistent guests never use it:
their own definition holds their policy.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import PolicyError
from ..policy.model import GuestPolicy, parse_policy
from . import durable

log = logging.getLogger(__name__)

VERSION = 1
FILENAME = "transient-policies.json"


@dataclass(frozen=True)
class Stored:
    uuid: str
    name: str  # the guest's name when the policy was set (for listing and `policy delete NAME`)
    policy: GuestPolicy
    saved_at: float


class PolicyStore:
    """UUID -> policy of transient guests; every change is on disk before the call returns."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, Stored] = {}
        self.problem: str | None = None  # why the file on disk could not be used, if it could not

    def load(self) -> "PolicyStore":
        entries, problem = _read(self.path)
        if problem is not None:
            self.problem = problem
            moved = durable.quarantine(self.path)
            log.warning("transient policy store %s unusable (%s)%s; starting empty", self.path, problem,
                        f"; moved to {moved}" if moved else "")
        with self._lock:
            self._entries = entries
        return self

    def get(self, uuid: str) -> Stored | None:
        with self._lock:
            return self._entries.get(uuid.lower())

    def find(self, key: str) -> Stored | None:
        """The entry whose UUID or (recorded) name is ``key``."""
        with self._lock:
            hit = self._entries.get(key.lower())
            if hit is not None:
                return hit
            named = [e for e in self._entries.values() if e.name == key]
            return named[0] if len(named) == 1 else None

    def all(self) -> list[Stored]:
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: (e.name, e.uuid))

    def put(self, uuid: str, name: str, policy: GuestPolicy) -> None:
        with self._lock:
            entries = dict(self._entries)
            entries[uuid.lower()] = Stored(uuid.lower(), name, policy, time.time())
            _write(self.path, entries)
            self._entries = entries

    def remove(self, uuid: str) -> bool:
        with self._lock:
            if uuid.lower() not in self._entries:
                return False
            entries = {u: e for u, e in self._entries.items() if u != uuid.lower()}
            _write(self.path, entries)
            self._entries = entries
            return True


def _write(path: Path, entries: dict[str, Stored]) -> None:
    payload = {
        "version": VERSION,
        "guests": {u: {"name": e.name, "policy": e.policy.to_dict(), "saved_at": e.saved_at}
                   for u, e in sorted(entries.items())},
    }
    durable.write(path, "store", payload)


def _read(path: Path) -> tuple[dict[str, Stored], str | None]:
    payload, problem = durable.read(path, "store")
    if problem is not None:
        return {}, None if problem == "missing" else problem
    try:
        if payload.get("version") != VERSION:
            return {}, f"unsupported version {payload.get('version')!r}"
        return {uuid.lower(): Stored(uuid.lower(), str(item["name"]), parse_policy(item["policy"]),
                                     float(item.get("saved_at", 0.0)))
                for uuid, item in payload["guests"].items()}, None
    except PolicyError as exc:
        return {}, f"invalid policy: {exc}"
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return {}, f"not a valid store document: {exc!r}"
