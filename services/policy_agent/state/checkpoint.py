"""The agent's local checkpoint of host-level state (pool and allocations).

Written atomically (temporary file, write, fsync, rename, fsync of the
folder) with a checksum; validated on load. A checkpoint that is missing,
corrupt or inconsistent is never fatal: :func:`load` says why it cannot be
used and the agent rebuilds the state from the domains' metadata.

The state is keyed to the machine (libvirt's host UUID), not to the agent's
bus name: an agent restarted under another ``--host-id`` keeps its pool and
allocations. Every CPU set in it must be the host's (:func:`vmsched.cpuset.parse`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from vmsched import cpuset

from ..plural import plural
from ..policy.allocation import Pools
from . import durable

log = logging.getLogger(__name__)

VERSION = 2
FILENAME = "checkpoint.json"
SHOWN = 5  # problems of an inconsistent checkpoint named in its reason


class Held(BaseModel):
    name: str
    cpus: str


class Checkpoint(BaseModel):
    version: int = VERSION
    machine: str  # libvirt's host UUID
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
        pools = Pools(host_cpus=host_cpus, pool=cpuset.parse(self.pool, host=host_cpus) if self.pool else frozenset())
        for uuid, held in self.allocations.items():
            pools.assign(uuid, held.name, cpuset.parse(held.cpus, host=host_cpus))
        return pools


@dataclass
class Loaded:
    """A usable checkpoint: the pools, and the host ID it was written under (for logging a rename)."""

    pools: Pools
    host_id: str


def save(path: Path, ckpt: Checkpoint) -> None:
    durable.write(path, "checkpoint", ckpt.model_dump(mode="json"))


def load(path: Path, machine: str, host_cpus: frozenset[int]) -> tuple[Loaded | None, str | None]:
    """(loaded, None) when usable; (None, reason) when missing or unusable.

    Usable means: this machine's, valid and consistent. The host ID does not matter.
    """
    payload, problem = durable.read(path, "checkpoint")
    if problem is not None:
        return None, "no checkpoint yet" if problem == "missing" else problem
    try:
        ckpt = Checkpoint.model_validate(payload)
    except ValidationError as exc:
        return None, f"invalid content: {exc.errors()[0].get('msg')}"
    if ckpt.version != VERSION:
        return None, f"unsupported version {ckpt.version}"
    if ckpt.machine != machine:
        return None, f"written for machine {ckpt.machine!r} (host {ckpt.host_id!r}), this is machine {machine!r}"
    if len(ckpt.allocations) > len(host_cpus):  # each holds a CPU of its own: checked before any is parsed
        return None, f"inconsistent: {len(ckpt.allocations)} allocations on a host of {plural(len(host_cpus), 'CPU')}"
    try:
        pools = ckpt.to_pools(host_cpus)
    except ValueError as exc:
        return None, f"invalid CPU set: {exc}"
    if problems := pools.consistency_errors():
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        return None, "inconsistent: " + "; ".join(problems[:SHOWN]) + more
    return Loaded(pools, ckpt.host_id), None


def mismatch(path: Path, machine: str, pools: Pools) -> str | None:
    """Why the checkpoint at ``path`` does not hold ``pools`` (missing, unusable, or other allocations);
    None when it holds them."""
    loaded, reason = load(path, machine, pools.host_cpus)
    if loaded is None:
        return reason
    if (loaded.pools.pool, loaded.pools.allocations) == (pools.pool, pools.allocations):
        return None
    return f"it says pool {_describe(loaded.pools)}; the agent holds pool {_describe(pools)}"


def _describe(pools: Pools) -> str:
    held = {pools.name(u): cpuset.fmt(c) for u, c in sorted(pools.allocations.items())}
    return f"{cpuset.fmt(pools.pool) or '(none)'} and allocations {held}"

