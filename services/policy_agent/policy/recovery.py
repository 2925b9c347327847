"""Start-up recovery of host state: the checkpoint if it is usable, else a rebuild from the guests.

Pure decisions over the checkpoint file and the guests' allocation hints; the
agent logs and counts what these return.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from . import checkpoint, cpuset
from .allocation import AllocationHint, Pools

log = logging.getLogger(__name__)


@dataclass
class Recovered:
    pools: Pools
    rebuild: bool  # True: no usable checkpoint, state comes from the guests
    reason: str | None = None  # why the checkpoint was not used
    quarantined: Path | None = None  # where an unusable checkpoint was moved


def load_or_rebuild(path: Path, host_id: str, host_cpus: frozenset[int]) -> Recovered:
    """The pools from the checkpoint at ``path``; an unusable one is moved aside and an empty state returned."""
    pools, reason = checkpoint.load(path, host_id, host_cpus)
    if pools is not None:
        return Recovered(pools, rebuild=False)
    moved = checkpoint.quarantine(path) if path.exists() else None
    return Recovered(Pools(host_cpus=host_cpus), rebuild=True, reason=reason, quarantined=moved)


def pool_from_hints(hints: Iterable[AllocationHint | None], host_id: str, pools: Pools) -> frozenset[int]:
    """The dedicated pool the guests' allocation records give for ``host_id`` (empty if unusable)."""
    pool: set[int] = set()
    for hint in hints:
        if hint is not None and hint.host == host_id:
            pool |= hint.pool
    pool &= pools.host_cpus
    if pool and pools.check_pool(frozenset(pool)):
        log.warning("the guests' allocation records give the unusable pool %s: starting without a pool"
                    " (pass --dedicated-pool)", cpuset.fmt(pool))
        return frozenset()
    if pool:
        log.warning("dedicated pool %s recovered from the guests' allocation records"
                    " (pass --dedicated-pool to set it explicitly)", cpuset.fmt(pool))
    return frozenset(pool)
