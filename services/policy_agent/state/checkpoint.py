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
from typing import Iterable

from pydantic import BaseModel, Field, ValidationError

from vmsched import cpuset

from ..plural import plural
from ..policy.allocation import AllocationHint, Pools
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


@dataclass
class Recovered:
    """Host state at start: a usable checkpoint's, else an empty one to rebuild from the guests."""

    pools: Pools
    rebuild: bool = False  # True: no usable checkpoint, state comes from the guests
    reason: str | None = None  # why the checkpoint was not used
    quarantined: Path | None = None  # where an unusable checkpoint was moved
    previous_host_id: str | None = None  # the host ID the checkpoint was written under (for logging a rename)


def save(path: Path, ckpt: Checkpoint) -> None:
    durable.write(path, "checkpoint", ckpt.model_dump(mode="json"))


def load(path: Path, machine: str, host_cpus: frozenset[int]) -> tuple[Recovered | None, str | None]:
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
        pools = Pools(host_cpus=host_cpus, pool=cpuset.parse(ckpt.pool, host=host_cpus) if ckpt.pool else frozenset())
        for uuid, held in ckpt.allocations.items():
            pools.assign(uuid, held.name, cpuset.parse(held.cpus, host=host_cpus))
    except ValueError as exc:
        return None, f"invalid CPU set: {exc}"
    if problems := pools.consistency_errors():
        more = f"; and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
        return None, "inconsistent: " + "; ".join(problems[:SHOWN]) + more
    return Recovered(pools, previous_host_id=ckpt.host_id), None


def load_or_rebuild(path: Path, machine: str, host_cpus: frozenset[int]) -> Recovered:
    """The pools from the checkpoint at ``path``; an unusable one is moved aside and an empty state returned."""
    loaded, reason = load(path, machine, host_cpus)
    if loaded is not None:
        return loaded
    return Recovered(Pools(host_cpus=host_cpus), rebuild=True, reason=reason, quarantined=durable.quarantine(path))


def pool_from_hints(hints: Iterable[AllocationHint | None], machine: str, pools: Pools) -> frozenset[int]:
    """The dedicated pool the guests' allocation records give for this machine (empty if unusable)."""
    pool = frozenset[int]().union(*(h.pool for h in hints if h is not None and h.host == machine)) & pools.host_cpus
    if pool and pools.check_pool(pool):
        log.warning("the guests' allocation records give the unusable pool %s: starting without a pool"
                    " (pass --dedicated-pool)", cpuset.fmt(pool))
        return frozenset()
    if pool:
        log.warning("dedicated pool %s recovered from the guests' allocation records"
                    " (pass --dedicated-pool to set it explicitly)", cpuset.fmt(pool))
    return pool


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

