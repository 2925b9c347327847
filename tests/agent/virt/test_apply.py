"""The apply layer as the QEMU driver sees it: config first, then live; one
scheduler call per scope; only what differs is written; offline vCPUs are not
pinned live. A recording stand-in for virDomain serves the XML a QEMU
libvirtd returns (the test driver cannot take config pins or scheduler
parameters, so this is where those calls are checked)."""

from __future__ import annotations

import libvirt
import pytest

from vmsched import cpuset
from vmsched.services.policy_agent.virt import domxml
from vmsched.services.policy_agent.virt.apply import CONFIG, LIVE, Applier, Caps, sched_equal
from vmsched.services.policy_agent.errors import ApplyError
from vmsched.services.policy_agent.policy.validation import Desired
from tests.support.agent_driver import cpus_of

S = cpuset.parse
HOST = S("0-7")

CONFIG_XML = """<domain type='kvm'><name>g</name><uuid>11111111-2222-3333-4444-555555555555</uuid>
<vcpu placement='static' current='2'>4</vcpu>
<cputune><shares>1024</shares><vcpupin vcpu='0' cpuset='4'/><emulatorpin cpuset='0-3'/></cputune></domain>"""
LIVE_XML = """<domain type='kvm' id='3'><name>g</name><uuid>11111111-2222-3333-4444-555555555555</uuid>
<vcpu placement='static' current='2'>4</vcpu>
<vcpus><vcpu id='0' enabled='yes'/><vcpu id='1' enabled='yes'/><vcpu id='2' enabled='no'/><vcpu id='3' enabled='no'/></vcpus>
<cputune><shares>512</shares><quota>-1</quota><vcpupin vcpu='0' cpuset='0-7'/></cputune></domain>"""


class RecordingDomain:
    def __init__(self, fail_on: str | None = None):
        self.calls: list[tuple] = []
        self.fail_on = fail_on

    def XMLDesc(self, flags: int) -> str:
        return CONFIG_XML if flags & libvirt.VIR_DOMAIN_XML_INACTIVE else LIVE_XML

    def _record(self, *call):
        if self.fail_on and call[0] == self.fail_on:
            raise libvirt.libvirtError("invalid argument: simulated refusal")
        self.calls.append(call)

    def pinVcpuFlags(self, vcpu, cpumap, flags):
        self._record("vcpu", vcpu, cpus_of(cpumap), flags)

    def pinEmulator(self, cpumap, flags):
        self._record("emulator", cpus_of(cpumap), flags)

    def setSchedulerParametersFlags(self, params, flags):
        self._record("sched", params, flags)


DESIRED = Desired({0: S("4"), 1: S("5"), 2: S("6"), 3: S("7")}, S("0-3"),
                  {"cpu_shares": 1024, "vcpu_quota": 50000, "vcpu_period": 100000})


def test_config_then_live_only_differences_and_one_sched_call_per_scope():
    dom = RecordingDomain()
    result = Applier(Caps("QEMU"), 8, HOST).verify_and_repair(dom, DESIRED, active=True, persistent=True)
    config = [c for c in dom.calls if c[-1] == CONFIG]
    live = [c for c in dom.calls if c[-1] == LIVE]
    assert dom.calls == config + live  # every config write before any live write
    # config: shares already 1024, period absent = the default 100000: only the quota is written
    assert config == [("vcpu", 1, "5", CONFIG), ("vcpu", 2, "6", CONFIG), ("vcpu", 3, "7", CONFIG),
                      ("sched", {"vcpu_quota": 50000}, CONFIG)]
    # live: offline vCPUs 2-3 are not pinned; emulator and shares differ there
    assert live == [("vcpu", 0, "4", LIVE), ("vcpu", 1, "5", LIVE), ("emulator", "0-3", LIVE),
                    ("sched", {"cpu_shares": 1024, "vcpu_quota": 50000}, LIVE)]
    assert not any(c[-1] == CONFIG | LIVE for c in dom.calls)
    assert "config vcpu1 0-7 -> 5" in result.all() and "live emulator 0-7 -> 0-3" in result.all()


def test_inactive_guest_gets_config_only_and_errors_are_precise():
    dom = RecordingDomain()
    Applier(Caps("QEMU"), 8, HOST).verify_and_repair(dom, DESIRED, active=False, persistent=True)
    assert dom.calls and all(c[-1] == CONFIG for c in dom.calls)
    with pytest.raises(ApplyError, match=r"libvirt refused the config vCPU 1 pin \(5\): .*simulated refusal"):
        Applier(Caps("QEMU"), 8, HOST).verify_and_repair(RecordingDomain("vcpu"), DESIRED, False, True)


def test_test_driver_caps_skip_config_vcpu_pins_and_scheduler():
    dom = RecordingDomain()
    caps = Caps("TEST", vcpu_pin_flags=False, scheduler=False)
    Applier(caps, 8, HOST).verify_and_repair(dom, DESIRED, active=True, persistent=True)
    assert dom.calls == [("vcpu", 0, "4", 0), ("vcpu", 1, "5", 0), ("emulator", "0-3", LIVE)]


def test_domxml_reads_effective_state():
    live = domxml.parse(LIVE_XML)
    assert live.nvcpus == 4 and live.online == {0, 1}
    assert live.effective_vcpus(HOST) == {0: HOST, 1: HOST, 2: HOST, 3: HOST}
    assert live.sched == {"cpu_shares": 512, "vcpu_quota": -1}
    cfg = domxml.parse(CONFIG_XML.replace("placement='static'", "cpuset='1-2'"))
    assert cfg.effective_vcpus(HOST)[1] == S("1-2") and cfg.effective_emulator(HOST) == S("0-3")


@pytest.mark.parametrize("key,want,have,equal", [
    ("vcpu_quota", -1, None, True), ("vcpu_quota", -1, 0, True), ("vcpu_quota", 5000, None, False),
    ("vcpu_quota", -1, 17592186044415, False), ("cpu_shares", 1024, None, True), ("cpu_shares", 2048, None, False),
    ("vcpu_period", 100000, None, True), ("vcpu_period", 50000, 50000, True),
])
def test_sched_defaults(key, want, have, equal):
    assert sched_equal(key, want, have) is equal
