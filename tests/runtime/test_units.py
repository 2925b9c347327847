"""UnitRunner.lookup: a unit added while the service runs is found on its first call."""

from __future__ import annotations

from vmsched.messages import Kind
from vmsched.runtime.units import UnitRunner


class _WatcherFinishedFirst:
    """A catalog whose watcher thread published the new unit while the lookup waited for its rescan, so the
    lookup's own rescan sees nothing new and says so."""

    def __init__(self) -> None:
        self.published = False

    def unit(self, name: str, kind: Kind) -> object | None:
        return "the unit" if self.published else None

    def refresh(self) -> bool:
        self.published = True  # the watcher's rescan, which held the lock, published it
        return False  # ours found nothing changed since


def test_a_unit_published_by_the_watchers_rescan_is_found() -> None:
    runner = UnitRunner(_WatcherFinishedFirst(), pool=None, timeout_for=lambda name: 1.0)  # type: ignore[arg-type]
    assert runner.lookup("AddedLater", Kind.FILTER) == "the unit"


def test_an_unknown_unit_stays_unknown() -> None:
    class Empty(_WatcherFinishedFirst):
        def unit(self, name: str, kind: Kind) -> object | None:
            return None

    runner = UnitRunner(Empty(), pool=None, timeout_for=lambda name: 1.0)  # type: ignore[arg-type]
    assert runner.lookup("Nothing", Kind.FILTER) is None
