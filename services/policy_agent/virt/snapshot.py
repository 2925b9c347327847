"""Read a guest as it is now: one snapshot per domain (state, persistence, both XML scopes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import libvirt

from ..errors import GuestNotFound
from .apply import Applier
from .domxml import DomainXml


@dataclass
class Snapshot:
    dom: "libvirt.virDomain"
    uuid: str
    name: str
    state: int
    persistent: bool
    seq: int  # the inventory's event sequence number when the read started
    cfg: DomainXml | None
    live: DomainXml | None

    @property
    def active(self) -> bool:
        return self.live is not None

    @property
    def run(self) -> int | None:
        """The guest's run: its domain ID (cached in the domain object, no call to libvirtd), None when stopped."""
        if not self.active:
            return None
        try:
            return int(self.dom.ID())
        except libvirt.libvirtError:
            return None

    @property
    def xml(self) -> DomainXml:
        """The definition that is the source of truth: persistent, else (transient guest) the live one."""
        return self.cfg if self.cfg is not None else self.live  # type: ignore[return-value]


def gone(exc: libvirt.libvirtError) -> bool:
    """The error says the domain no longer exists."""
    return exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN


def read(applier: Applier, dom: "libvirt.virDomain", seq: int) -> Snapshot:
    state = dom.state()[0]
    persistent = bool(dom.isPersistent())
    active = bool(dom.isActive())
    cfg = applier.read(dom, live=False) if persistent else None
    live = applier.read(dom, live=True) if active else None
    return Snapshot(dom, dom.UUIDString(), dom.name(), state, persistent, seq, cfg, live)


def scan(conn: "libvirt.virConnect", read_one: Callable[["libvirt.virDomain"], Snapshot]) -> list[Snapshot]:
    """Every domain of the connection, each read by ``read_one``; those that vanish while being read are skipped."""
    snaps = []
    for dom in conn.listAllDomains(0):
        try:
            snaps.append(read_one(dom))
        except libvirt.libvirtError as exc:
            if not gone(exc):
                raise
    return snaps


def lookup(conn: "libvirt.virConnect", key: str, uuid: str | None) -> "libvirt.virDomain":
    """The domain ``key`` names (a UUID or a name), trying the cached ``uuid`` first."""
    for how, arg in (("uuid", uuid), ("uuid", key), ("name", key)):
        if not arg:
            continue
        try:
            return conn.lookupByUUIDString(arg) if how == "uuid" else conn.lookupByName(arg)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() not in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_INVALID_ARG):
                raise
    raise GuestNotFound(f"no guest named or with UUID {key!r} on this host")
