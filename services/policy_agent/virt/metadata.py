"""The policy in the guest's own definition: libvirt domain metadata.

Stored as ``<vmsched:policy>`` in the namespace :data:`NS`; it persists with
the domain and travels with it. The agent adds an ``<allocation>`` hint (the
dedicated CPUs this host gave the guest, and the pool at the time) so host
state can be rebuilt from the guests when the checkpoint is lost.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import libvirt

from vmsched import cpuset
from vmsched.agent_contract import AdaptiveDocument

from ..errors import PolicyError
from ..policy.allocation import AllocationHint
from ..policy.model import GuestPolicy, parse_policy

NS = "https://vmsched.dev/xmlns/policy/1"
PREFIX = "vmsched"
KEY = "policy"
_Q = "{%s}" % NS


def to_xml(policy: GuestPolicy, hint: AllocationHint | None = None) -> str:
    root = ET.Element(KEY)
    for vcpu, cpus in sorted(policy.vcpu_pins.items()):
        ET.SubElement(root, "vcpupin", vcpu=str(vcpu), cpuset=cpus)
    if policy.emulator_pin:
        ET.SubElement(root, "emulatorpin", cpuset=policy.emulator_pin)
    if policy.dedicated is not None:
        attrs = {"count": str(policy.dedicated)} if isinstance(policy.dedicated, int) else {"cpuset": policy.dedicated}
        attrs.update({k: v for k, v, default in (("threads", policy.thread_policy, "prefer"), ("numa", policy.numa, "any"),
                                                  ("emulator", policy.emulator, "share")) if v != default})
        ET.SubElement(root, "dedicated", attrs)
    if policy.weight is not None:
        ET.SubElement(root, "weight").text = str(policy.weight)
    if policy.cap_percent is not None or policy.quota is not None:
        cap = policy.cap_percent
        attrs = {"percent": _num(cap)} if cap is not None else {"quota": str(policy.quota)}
        if policy.period is not None:
            attrs["period"] = str(policy.period)
        ET.SubElement(root, "cap", attrs)
    for req in policy.requires:
        ET.SubElement(root, "requires").text = req
    if policy.adaptive is not None:
        ET.SubElement(root, "adaptive", adaptive_attrs(policy.adaptive))
    if hint is not None:
        ET.SubElement(root, "allocation", host=hint.host, cpus=cpuset.fmt(hint.cpus), pool=cpuset.fmt(hint.pool))
    return ET.tostring(root, encoding="unicode")


def adaptive_attrs(a: AdaptiveDocument) -> dict[str, str]:
    attrs: dict[str, str] = {}
    if a.weight is not None:
        attrs.update(weight_min=str(a.weight[0]), weight_max=str(a.weight[1]))
    if a.cap_percent is not None:
        attrs.update(cap_min=_num(a.cap_percent[0]), cap_max=_num(a.cap_percent[1]))
    if a.may_move:
        attrs["may_move"] = "yes"
    if a.target_wait_percent is not None:
        attrs["target_wait"] = _num(a.target_wait_percent)
    if a.keep_on_restart:
        attrs["keep_on_restart"] = "yes"
    return attrs


def adaptive_data(a: dict[str, str]) -> dict[str, Any]:
    data: dict[str, Any] = {"may_move": a.get("may_move") == "yes",
                            "keep_on_restart": a.get("keep_on_restart") == "yes"}
    if "weight_min" in a:
        data["weight"] = (int(a["weight_min"]), int(a["weight_max"]))
    if "cap_min" in a:
        data["cap_percent"] = (float(a["cap_min"]), float(a["cap_max"]))
    if "target_wait" in a:
        data["target_wait_percent"] = float(a["target_wait"])
    return data


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def from_element(root: ET.Element) -> tuple[GuestPolicy, AllocationHint | None]:
    """Parse ``<vmsched:policy>``; raises PolicyError when it is malformed."""
    data: dict[str, Any] = {}
    hint = None
    try:
        for child in root:
            tag, a = child.tag.removeprefix(_Q), child.attrib
            if tag == "vcpupin":
                data.setdefault("vcpu_pins", {})[int(a["vcpu"])] = a["cpuset"]
            elif tag == "emulatorpin":
                data["emulator_pin"] = a["cpuset"]
            elif tag == "dedicated":
                data["dedicated"] = int(a["count"]) if "count" in a else a["cpuset"]
                for attr, key in (("threads", "thread_policy"), ("numa", "numa"), ("emulator", "emulator")):
                    if attr in a:
                        data[key] = a[attr]
            elif tag == "weight":
                data["weight"] = int((child.text or "").strip())
            elif tag == "cap":
                for attr, key, kind in (("percent", "cap_percent", float), ("quota", "quota", int),
                                        ("period", "period", int)):
                    if attr in a:
                        data[key] = kind(a[attr])
            elif tag == "requires":
                data.setdefault("requires", []).append((child.text or "").strip())
            elif tag == "adaptive":
                data["adaptive"] = adaptive_data(a)
            elif tag == "allocation":
                hint = AllocationHint(a["host"], cpuset.parse(a["cpus"]), cpuset.parse(a["pool"]))
            else:
                raise PolicyError(f"unknown element <{tag}> in the vmsched policy metadata")
    except (KeyError, ValueError) as exc:
        if isinstance(exc, PolicyError):
            raise
        raise PolicyError(f"malformed vmsched policy metadata: {exc!r}") from None
    return parse_policy(data), hint


def find(domain_root: ET.Element) -> ET.Element | None:
    """The ``<vmsched:policy>`` element of a parsed domain XML, if any."""
    return domain_root.find(f"metadata/{_Q}{KEY}")


def write(dom: "libvirt.virDomain", policy: GuestPolicy, hint: AllocationHint | None) -> None:
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, to_xml(policy, hint), PREFIX, NS, _flags(dom))


def clear(dom: "libvirt.virDomain") -> None:
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, None, None, NS, _flags(dom))


def _flags(dom: "libvirt.virDomain") -> int:
    """Where the metadata goes: the persistent definition and the running guest, whichever there is."""
    return ((libvirt.VIR_DOMAIN_AFFECT_CONFIG if dom.isPersistent() else 0)
            | (libvirt.VIR_DOMAIN_AFFECT_LIVE if dom.isActive() else 0))
