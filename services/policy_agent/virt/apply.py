"""Verify a guest's pins and scheduler parameters and repair what differs.

Always the persistent config first (so the policy is in force before vCPU
threads spawn at the next start), then the live domain. Only what differs is
written, so verifying a correct guest costs the XML reads and nothing else.

Driver differences are explicit in :class:`Caps`: libvirt's test driver
accepts only ``flags=0`` for ``pinVcpuFlags`` (so config pins of a running
guest cannot be written) and has no scheduler parameters; those parts are
skipped there (and logged once), everything else runs the same code as QEMU.
"""

from __future__ import annotations

import collections
import logging
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import libvirt

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..errors import ApplyError, DefinitionChanged
from ..policy.model import DEFAULT_PERIOD, DEFAULT_SHARES
from ..policy.validation import Desired
from . import domxml

log = logging.getLogger(__name__)

CONFIG = libvirt.VIR_DOMAIN_AFFECT_CONFIG
SCHED_NAMES = {"cpu_shares": "weight", "vcpu_quota": "cap", "vcpu_period": "cap"}  # policy words
LIVE = libvirt.VIR_DOMAIN_AFFECT_LIVE
INACTIVE = libvirt.VIR_DOMAIN_XML_INACTIVE


@dataclass(frozen=True)
class Caps:
    driver: str
    vcpu_pin_flags: bool = True  # pinVcpuFlags accepts AFFECT_LIVE / AFFECT_CONFIG (else: live via flags=0 only)
    scheduler: bool = True  # cpu_shares / vcpu_quota / vcpu_period are supported
    pinnable: CpuSet | None = None  # the CPUs a pin can hold (None: every host CPU)

    @classmethod
    def detect(cls, conn: "libvirt.virConnect") -> "Caps":
        driver = conn.getType()
        if driver.upper() == "TEST":
            # the test driver keeps only the CPUs of its fixed 8-CPU map in a pin, whatever its capabilities list
            pinnable = frozenset(range(conn.getCPUMap()[0]))
            log.warning(
                "libvirt %s driver: vCPU pins are applied live only (pinVcpuFlags accepts flags=0 and"
                " refuses inactive guests), a pin holds only CPUs %s (the rest of a pin is left out) and"
                " weight/cap are not applied (no scheduler parameters); emulator pins and metadata behave"
                " as on QEMU",
                driver, cpuset.fmt(pinnable),
            )
            return cls(driver, vcpu_pin_flags=False, scheduler=False, pinnable=pinnable)
        return cls(driver)

    def storable(self, cpus: CpuSet) -> CpuSet:
        """The part of a pin the driver keeps."""
        return cpus if self.pinnable is None else frozenset(cpus & self.pinnable)


@dataclass
class Result:
    config: list[str] = field(default_factory=list)  # changes written to the persistent config
    live: list[str] = field(default_factory=list)  # changes written to the running guest
    deferred: list[str] = field(default_factory=list)  # what libvirt could not change live: at the next start

    @property
    def changed(self) -> bool:
        return bool(self.config or self.live)

    def all(self) -> list[str]:
        return [f"config {c}" for c in self.config] + [f"live {c}" for c in self.live]


def sched_equal(key: str, want: int, have: int | None) -> bool:
    """Compare a scheduler parameter; absent from the XML means libvirt's default."""
    if key == "vcpu_quota":
        have = -1 if have in (None, 0) else have
        return have < 0 if want < 0 else want == have
    if have in (None, 0):
        have = DEFAULT_PERIOD if key == "vcpu_period" else DEFAULT_SHARES
    return want == have


def diff(actual: domxml.DomainXml, desired: Desired, host: CpuSet, caps: Caps, pins: bool = True,
         live: bool = False) -> list[tuple]:
    """What must change: ``("vcpu", i, cpus)``, ``("emulator", None, cpus)``, ``("sched", key, value)``.

    Live, only online vCPUs can be pinned (QEMU refuses the others; their
    config pins apply when they are plugged)."""
    out: list[tuple] = []
    if desired.vcpus is not None and pins:
        have = actual.effective_vcpus(host)
        for i, want in sorted(desired.vcpus.items()):
            want = caps.storable(want)
            if live and actual.online is not None and i not in actual.online:
                continue
            if want and i < actual.nvcpus and have.get(i) != want:
                out.append(("vcpu", i, want))
    emulator = caps.storable(desired.emulator) if desired.emulator is not None else None
    if emulator and actual.effective_emulator(host) != emulator:
        out.append(("emulator", None, emulator))
    if caps.scheduler:
        out += [("sched", key, want) for key, want in sorted(desired.sched.items())
                if not sched_equal(key, want, actual.sched.get(key))]
    nodes = desired.memory_nodes
    if nodes is not None and (actual.memory_nodes != nodes or (not live and actual.memory_mode != "strict")):
        out.append(("memory", None, nodes))  # live: the nodeset only (libvirt changes no mode of a running guest)
    return out


def describe(change: tuple, actual: domxml.DomainXml, host: CpuSet) -> str:
    kind, key, want = change
    if kind == "vcpu":
        return f"vcpu{key} {cpuset.fmt(actual.effective_vcpus(host)[key])} -> {cpuset.fmt(want)}"
    if kind == "emulator":
        return f"emulator {cpuset.fmt(actual.effective_emulator(host))} -> {cpuset.fmt(want)}"
    if kind == "memory":
        have = f"{actual.memory_mode} {cpuset.fmt(actual.memory_nodes or ())}".strip() if actual.memory_mode else "any"
        return f"memory nodes {have} -> strict {cpuset.fmt(want)}"
    return f"{key} {actual.sched.get(key)} -> {want}"


class Applier:
    def __init__(self, caps: Caps, ncpus: int, host_cpus: CpuSet):
        self.caps = caps
        self.ncpus = ncpus
        self.host = host_cpus
        self._deferred: set[tuple[str, CpuSet]] = set()  # live memory changes libvirt refused (logged once)

    def left_out(self, desired: Desired | None) -> str | None:
        """What of ``desired`` this driver does not apply, said for the guest's status; None: nothing."""
        if desired is None or self.caps.scheduler or not desired.sched:
            return None
        parts = sorted({SCHED_NAMES[k] for k in desired.sched}, reverse=True)  # weight, then cap
        return (f"{' and '.join(parts)} not applied: libvirt's {self.caps.driver} driver has no scheduler"
                " parameters")

    def read(self, dom: "libvirt.virDomain", live: bool) -> domxml.DomainXml:
        return domxml.parse(dom.XMLDesc(0 if live else INACTIVE))

    def verify_and_repair(
        self,
        dom: "libvirt.virDomain",
        desired: Desired,
        active: bool,
        persistent: bool,
        config_xml: domxml.DomainXml | None = None,
        live_xml: domxml.DomainXml | None = None,
    ) -> Result:
        """Bring the config, then the live guest, to ``desired``; raises ApplyError.

        ``config_xml`` is the persistent definition ``desired`` was decided from (a snapshot). libvirt has
        no conditional write, so before anything is written the definition is read again and must still
        be that text, and after the config writes it must hold what was written; otherwise another writer
        (an admin's define, the guest's manager) changed it meanwhile and :class:`DefinitionChanged` is
        raised: the caller decides again from a new read instead of writing a decision made from the older
        definition over the newer one (it would drop a manager's pins). What is left is one round trip:
        a define that lands between that second read and the first write is overwritten unseen."""
        result = Result()
        cfg = (config_xml or self.read(dom, live=False)) if persistent else None
        # without pinVcpuFlags flags (test driver) config vCPU pins cannot be written at all
        cfg_changes = diff(cfg, desired, self.host, self.caps, pins=self.caps.vcpu_pin_flags) if cfg else []
        cur = (live_xml or self.read(dom, live=True)) if active else None
        live_changes = diff(cur, desired, self.host, self.caps, live=True) if cur else []
        base = config_xml if persistent and config_xml is not None and config_xml.raw else None
        if base is not None and (cfg_changes or live_changes) and dom.XMLDesc(INACTIVE) != base.raw:
            raise DefinitionChanged(f"the definition of {base.name!r} changed since it was read")
        if cfg is not None and cfg_changes:
            self._write_all(dom, cfg_changes, CONFIG)
            result.config = [describe(c, cfg, self.host) for c in cfg_changes]
            after = dom.XMLDesc(INACTIVE)
            dup = duplicated(after)  # never an element twice: libvirt would keep the first or refuse the definition
            if dup:
                raise ApplyError(f"the guest's persistent definition holds duplicated elements: {', '.join(dup)}")
            if base is not None:
                written = domxml.parse(after)
                if left := diff(written, desired, self.host, self.caps, pins=self.caps.vcpu_pin_flags):
                    raise DefinitionChanged(f"the definition of {cfg.name!r} changed while it was written (now"
                                            f" {', '.join(describe(c, written, self.host) for c in left)})")
        if cur is not None and live_changes:
            done = self._write_all(dom, live_changes, LIVE)
            result.live = [describe(c, cur, self.host) for c in live_changes if c in done]
            result.deferred = [f"{describe(c, cur, self.host)} at the next start of {cur.name!r}: {why}"
                               for c, why in done.items() if why]
        return result

    def _write_all(self, dom: "libvirt.virDomain", changes: list[tuple], scope: int) -> dict[tuple, str]:
        """Write ``changes``; returns each change written, with why it was left for the next start ("": done)."""
        sched = {key: want for kind, key, want in changes if kind == "sched"}
        done: dict[tuple, str] = {}
        for change in changes:
            if change[0] == "memory" and scope == LIVE:
                done[change] = self._write_memory_live(dom, change)
            elif change[0] != "sched":
                flags = scope if (self.caps.vcpu_pin_flags or change[0] != "vcpu") else 0
                self._write(dom, change, flags)
                done[change] = ""
        if sched:
            # the QEMU driver refuses LIVE|CONFIG together here: one call per scope, all parameters at once
            self._write(dom, ("sched", ", ".join(sorted(sched)), sched), scope)
            done.update((c, "") for c in changes if c[0] == "sched")
        return done

    def _write_memory_live(self, dom: "libvirt.virDomain", change: tuple) -> str:
        """A running guest's memory nodes change where libvirt allows it (strict mode, cgroups' cpuset);
        otherwise the config's binding applies at the next start: say why, once per guest and nodes."""
        try:
            dom.setNumaParameters({libvirt.VIR_DOMAIN_NUMA_NODESET: cpuset.fmt(change[2])}, LIVE)
            return ""
        except libvirt.libvirtError as exc:
            why = exc.get_error_message() or str(exc)
            key = (dom.UUIDString(), change[2])
            if key not in self._deferred:
                self._deferred.add(key)
                log.warning("memory of %r bound to NUMA node(s) %s from its next start: libvirt cannot change it"
                            " live (%s)", dom.name(), cpuset.fmt(change[2]), why)
            return why

    def _write(self, dom: "libvirt.virDomain", change: tuple, flags: int) -> None:
        kind, key, want = change
        scope = {CONFIG: "config", LIVE: "live"}.get(flags, "current")
        try:
            if kind == "vcpu":
                dom.pinVcpuFlags(key, cpuset.to_cpumap(want, self.ncpus), flags)
            elif kind == "emulator":
                dom.pinEmulator(cpuset.to_cpumap(want, self.ncpus), flags)
            elif kind == "memory":
                dom.setNumaParameters({libvirt.VIR_DOMAIN_NUMA_NODESET: cpuset.fmt(want),
                                       libvirt.VIR_DOMAIN_NUMA_MODE: libvirt.VIR_DOMAIN_NUMATUNE_MEM_STRICT}, flags)
            else:
                dom.setSchedulerParametersFlags(want, flags)
        except libvirt.libvirtError as exc:
            what = {"vcpu": f"vCPU {key} pin", "emulator": "emulator pin", "memory": "memory nodes"}.get(kind, key)
            message = exc.get_error_message() or str(exc)
            shown = ", ".join(f"{k}={v}" for k, v in sorted(want.items())) if kind == "sched" else cpuset.fmt(want)
            raise ApplyError(f"libvirt refused the {scope} {what} ({shown}): {message}") from exc


def duplicated(xml: str) -> list[str]:
    """Elements a domain's XML holds more than once where it may hold one: a ``<vcpupin>`` per vCPU,
    ``<emulatorpin>``, a scheduler tunable, one metadata element per namespace."""
    root = ET.fromstring(xml)
    seen = collections.Counter(f"<vcpupin vcpu='{p.get('vcpu')}'>" for p in root.findall("cputune/vcpupin"))
    seen.update(f"<{c.tag}>" for c in root.findall("cputune/*") if c.tag != "vcpupin")
    seen.update(f"metadata {c.tag}" for c in root.findall("metadata/*"))
    return sorted(k for k, n in seen.items() if n > 1)

