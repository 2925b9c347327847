"""Start-up recovery of host state: the checkpoint if it is usable, else a rebuild from the guests.

Pure decisions over the checkpoint file and the guests' allocation hints; the
agent logs and counts what these return.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from vmsched import cpuset

from ..policy.allocation import AllocationHint, Pools
from . import checkpoint, durable

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    pools: Pools
    rebuild: bool  # True: no usable checkpoint, state comes from the guests
    reason: str | None = None  # why the checkpoint was not used
    quarantined: Path | None = None  # where an unusable checkpoint was moved
    previous_host_id: str | None = None  # the host ID the checkpoint was written under


def load_or_rebuild(path: Path, machine: str, host_cpus: frozenset[int]) -> Recovered:
    """The pools from the checkpoint at ``path``; an unusable one is moved aside and an empty state returned."""
    loaded, reason = checkpoint.load(path, machine, host_cpus)
    if loaded is not None:
        return Recovered(loaded.pools, rebuild=False, previous_host_id=loaded.host_id)
    moved = durable.quarantine(path)
    return Recovered(Pools(host_cpus=host_cpus), rebuild=True, reason=reason, quarantined=moved)


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
