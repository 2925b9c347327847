"""Read what is in force from a domain's XML (live or persistent).

One ``XMLDesc`` call gives the name, UUID, vCPU count, the vmsched metadata
and ``<cputune>``, so a sweep costs one call per guest and scope.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..errors import PolicyError
from ..policy.model import GuestPolicy
from . import metadata


@dataclass
class DomainXml:
    name: str
    uuid: str
    nvcpus: int
    vcpu_cpuset: CpuSet | None = None
    online: frozenset[int] | None = None  # vCPUs online (live XML); None: all of them
    vcpupins: dict[int, CpuSet] = field(default_factory=dict)
    emulatorpin: CpuSet | None = None
    sched: dict[str, int] = field(default_factory=dict)
    memory_mode: str | None = None  # <numatune><memory mode=...> (None: no numatune)
    memory_nodes: CpuSet | None = None  # its nodeset
    policy: GuestPolicy | None = None
    hint: metadata.AllocationHint | None = None
    metadata_error: str | None = None
    raw: str = field(default="", repr=False, compare=False)  # the XML text this was read from

    def effective_vcpus(self, host: CpuSet) -> dict[int, CpuSet]:
        default = self.vcpu_cpuset or host
        return {i: self.vcpupins.get(i, default) for i in range(self.nvcpus)}

    def effective_emulator(self, host: CpuSet) -> CpuSet:
        return self.emulatorpin or self.vcpu_cpuset or host


_SCHED = {"shares": "cpu_shares", "period": "vcpu_period", "quota": "vcpu_quota"}


def _cpus(elem: ET.Element | None, attr: str = "cpuset") -> CpuSet | None:
    """The CPU set (or NUMA nodes) an element's attribute holds; None without the element or the attribute."""
    return cpuset.parse(elem.get(attr, "")) if elem is not None and elem.get(attr) else None


def parse(text: str) -> DomainXml:
    root = ET.fromstring(text)
    vcpu = root.find("vcpu")
    nvcpus = int((vcpu.text or "1").strip()) if vcpu is not None else 1
    dom = DomainXml(name=root.findtext("name", ""), uuid=root.findtext("uuid", ""), nvcpus=nvcpus,
                    vcpu_cpuset=_cpus(vcpu), raw=text)
    vcpus = root.find("vcpus")
    if vcpus is not None:
        dom.online = frozenset(int(v.get("id", "0")) for v in vcpus.findall("vcpu") if v.get("enabled", "yes") == "yes")
    elif vcpu is not None and vcpu.get("current"):
        dom.online = frozenset(range(int(vcpu.get("current", "1"))))
    for pin in root.findall("cputune/vcpupin"):
        dom.vcpupins[int(pin.get("vcpu", "0"))] = cpuset.parse(pin.get("cpuset", ""))
    dom.emulatorpin = _cpus(root.find("cputune/emulatorpin"))
    for tag, key in _SCHED.items():
        if value := root.findtext(f"cputune/{tag}", "").strip():
            dom.sched[key] = int(value)
    memory = root.find("numatune/memory")
    if memory is not None:
        dom.memory_mode = memory.get("mode", "strict")
        dom.memory_nodes = _cpus(memory, "nodeset")
    elem = metadata.find(root)
    if elem is not None:
        try:
            dom.policy, dom.hint = metadata.from_element(elem)
        except PolicyError as exc:
            dom.metadata_error = str(exc)
    return dom
