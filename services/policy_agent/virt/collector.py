"""The facts collector: what this hypervisor and its guests look like now.

Host: identity and topology from libvirt's capabilities (read once per
connection, by the agent's one topology reader), CPU use from ``/proc/stat``, load from ``/proc/loadavg``,
memory from ``/proc/meminfo``, hugepages from ``/sys/kernel/mm/hugepages``.
Guests: one bulk ``getAllDomainStats`` per collection with
``VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT`` (a guest whose QEMU monitor is
busy is skipped by libvirt instead of waited for), run in a helper thread
with a timeout; guests missing from the bulk answer (or all of them, when
the bulk call fails or hangs) are read one by one with ``virDomainGetInfo``,
which does not talk to the monitor. This is vdsm's approach.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import libvirt

from vmsched import cpuset
from vmsched.facts.model import GuestFacts, HostFacts, HugePages, NumaCell

from ..facts import arithmetic as calc
from ..facts.arithmetic import topology_facts
from ..guests.inventory import STATE_NAMES
from ..policy.topology import Topology, TopologyError
from .host import host_uuid, read_topology

log = logging.getLogger("vmsched.agent.facts")

STATS = (libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_VCPU
         | libvirt.VIR_DOMAIN_STATS_BALLOON)
NOWAIT = getattr(libvirt, "VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT", 0)
VDSM_ID = Path("/etc/vdsm/vdsm.id")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class Collector:
    """Collects host and guest facts; keeps the previous counters for rates."""

    def __init__(self, proc: Path = Path("/proc"), sys_dir: Path = Path("/sys"), vdsm_id: Path = VDSM_ID,
                 stats_timeout: float = 2.0) -> None:
        self.proc, self.sys, self.vdsm_id = Path(proc), Path(sys_dir), Path(vdsm_id)
        self.stats_timeout = stats_timeout
        self._static: dict[str, Any] | None = None
        self._static_conn: Any = None
        self.topology: Topology | None = None  # the host's, read with the static facts
        self._cpu_before: tuple[calc.CpuTimes | None, dict[int, calc.CpuTimes]] = (None, {})
        self._guest_before: dict[str, int] = {}
        self._when: float | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="facts-stats")
        self._pending: concurrent.futures.Future | None = None
        self.fallbacks = 0  # collections that read guests one by one

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- host -------------------------------------------------------------------
    def static(self, conn: "libvirt.virConnect") -> dict[str, Any]:
        """Identity and topology (from the capabilities, once per connection: :func:`host.read_topology`)."""
        if self._static is not None and self._static_conn is conn:
            return self._static
        facts: dict[str, Any] = {"hostname": socket.gethostname(), "vdsm_id": _read(self.vdsm_id).strip(),
                                 "libvirt_uuid": host_uuid(conn) or ""}
        try:
            topology: Topology | None = read_topology(conn)
        except (libvirt.libvirtError, TopologyError) as exc:
            log.warning("host capabilities unreadable: %s", exc)
            topology = None
        facts["numa"] = []
        if topology is not None:
            facts.update(topology_facts(topology))
            facts["numa"] = [NumaCell(id=c.id, cpus=cpuset.fmt(c.cpus), memory_mib=c.memory_kib // 1024)
                             for c in topology.cells]
        self._static, self._static_conn, self.topology = facts, conn, topology
        return facts

    def host(self, conn: "libvirt.virConnect") -> HostFacts:
        total, per = calc.parse_stat(_read(self.proc / "stat"))
        before_total, before_per = self._cpu_before
        self._cpu_before = (total, per)
        load = _read(self.proc / "loadavg").split()[:3]
        facts = dict(self.static(conn))
        facts.update(calc.memory_mib(calc.parse_meminfo(_read(self.proc / "meminfo"))))
        facts.update(
            cpus=len(self.topology.online) if self.topology is not None else len(per) or os.cpu_count() or 0,
            cpu_pct=calc.busy_pct(before_total, total) if total is not None else 0.0,
            pcpu_pct=[calc.busy_pct(before_per.get(i), t) for i, t in sorted(per.items())],
            load_avg=[float(x) for x in load],
            hugepages=self._hugepages(),
        )
        return HostFacts(**facts)

    def _hugepages(self) -> list[HugePages]:
        try:
            entries = sorted((self.sys / "kernel/mm/hugepages").iterdir())
        except OSError:
            return []
        return [HugePages(size_kib=int(d.name[10:-2]), total=int(_read(d / "nr_hugepages").strip() or 0),
                          free=int(_read(d / "free_hugepages").strip() or 0))
                for d in entries if d.name.startswith("hugepages-") and d.name.endswith("kB")]

    # --- guests -----------------------------------------------------------------
    def guests(self, conn: "libvirt.virConnect") -> list[GuestFacts]:
        now = time.monotonic()
        seconds = now - self._when if self._when is not None else 0.0
        self._when = now
        stats = self._bulk(conn)
        try:
            domains = conn.listAllDomains(0)
        except libvirt.libvirtError as exc:
            log.warning("listing guests failed: %s", exc)
            domains = []
        seen: set[str] = set()
        out: list[GuestFacts] = []
        cpu_now: dict[str, int] = {}
        for dom, record in [*stats, *((dom, {}) for dom in domains)]:  # the guests the bulk call left out: no stats
            try:
                uuid = dom.UUIDString()
                if uuid not in seen:
                    seen.add(uuid)
                    out.append(self._from_stats(dom, uuid, record, seconds, cpu_now))
            except libvirt.libvirtError:
                continue  # gone meanwhile
        self._guest_before = cpu_now
        return out

    def _bulk(self, conn: "libvirt.virConnect") -> list[tuple[Any, dict]]:
        """getAllDomainStats without waiting on busy monitors, abandoned after ``stats_timeout``."""
        if self._pending is not None and not self._pending.done():
            self.fallbacks += 1
            return []  # the previous bulk call still hangs: do not pile up more
        self._pending = self._pool.submit(conn.getAllDomainStats, STATS, NOWAIT)
        try:
            return list(self._pending.result(timeout=self.stats_timeout))
        except concurrent.futures.TimeoutError:
            log.warning("getAllDomainStats did not answer within %.1f s; reading guests one by one", self.stats_timeout)
        except libvirt.libvirtError as exc:
            log.warning("getAllDomainStats failed (%s); reading guests one by one", exc.get_error_message())
        self.fallbacks += 1
        return []

    def _from_stats(self, dom: Any, uuid: str, r: dict, seconds: float, cpu_now: dict[str, int]) -> GuestFacts:
        """A guest from its bulk stats ``r``; what they lack from ``virDomainGetInfo`` (no monitor call)."""
        if "balloon.current" not in r or "vcpu.current" not in r or "cpu.time" not in r:
            state, max_kib, cur_kib, vcpus, cpu_ns = dom.info()
            r = {"state.state": state, "balloon.maximum": max_kib, "balloon.current": cur_kib, "vcpu.current": vcpus,
                 "cpu.time": cpu_ns, **r}
        state, vcpus, cpu_ns = (int(r.get(k, 0)) for k in ("state.state", "vcpu.current", "cpu.time"))
        cpu_now[uuid] = cpu_ns
        return GuestFacts(uuid=uuid, name=dom.name(), state=STATE_NAMES.get(state, str(state)), vcpus=vcpus,
                          memory_mib=int(r.get("balloon.current", 0)) // 1024,
                          max_memory_mib=int(r.get("balloon.maximum", 0)) // 1024,
                          cpu_pct=calc.guest_cpu_pct(self._guest_before.get(uuid), cpu_ns, seconds, vcpus)
                          if state in (1, 2) else 0.0)
