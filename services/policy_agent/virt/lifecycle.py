"""Start, resume, shut down and destroy guests: the libvirt side of dependency orchestration."""

from __future__ import annotations

from typing import Callable

import libvirt

from ..errors import ApplyError


class LibvirtDomains:
    """:class:`~..guests.orchestration.Domains` on a libvirt connection."""

    def __init__(self, conn: Callable[[], "libvirt.virConnect"], name_of: Callable[[str], str]):
        self._conn = conn
        self._name_of = name_of

    def _call(self, uuid: str, what: str, fn: Callable[["libvirt.virDomain"], object]) -> None:
        try:
            fn(self._conn().lookupByUUIDString(uuid))
        except libvirt.libvirtError as exc:
            raise ApplyError(f"{what} {self._name_of(uuid)!r} failed: {exc.get_error_message()}") from exc

    def start(self, uuid: str, resume: bool) -> None:
        self._call(uuid, "starting", lambda d: d.resume() if resume else d.create())

    def shutdown(self, uuid: str) -> None:
        self._call(uuid, "stopping", lambda d: d.shutdown())

    def destroy(self, uuid: str) -> None:
        self._call(uuid, "stopping", lambda d: d.destroy())
