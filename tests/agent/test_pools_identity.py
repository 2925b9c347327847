"""Dedicated pools, host identity and foreign pins on libvirt's test driver.

- a pool change that conflicts with a policy's explicit pins is refused naming every guest; the
   sweep reports any dedicated CPU shared with another guest (metric, error state).
- host state is keyed to the machine, not to the host ID: a renamed agent keeps pool and
   allocations, and a lost checkpoint is rebuilt from the hints this machine wrote.
- a second agent on the same libvirtd is refused, naming the first.
- a guest pinned by its manager (own <cputune>, no vmsched policy) is left alone.
"""

from __future__ import annotations

import json

import libvirt
import pytest

from vmsched.services.policy_agent.agent import Agent
from vmsched.services.policy_agent.state import checkpoint, durable
from vmsched.services.policy_agent.errors import AgentError, PolicyError
from vmsched.services.policy_agent.virt import metadata
from vmsched.services.policy_agent.virt.hostlock import HostLock, HostLocked
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import TEST_URI, emulator_pin, guest, live_pins, metric
from tests.support.waiting import wait_until


def pinned_guest(conn, name: str, pins: dict[int, str], emulator: str | None = None, start: bool = True):  # noqa: F811
    """A guest whose manager pinned it: its own <cputune>, no vmsched policy."""
    tune = "".join(f"<vcpupin vcpu='{i}' cpuset='{c}'/>" for i, c in sorted(pins.items()))
    if emulator:
        tune += f"<emulatorpin cpuset='{emulator}'/>"
    dom = conn.defineXML(f"<domain type='test'><name>{name}</name><memory unit='KiB'>65536</memory>"
                         f"<vcpu placement='static'>2</vcpu><cputune>{tune}</cputune>"
                         "<os><type>hvm</type></os></domain>")
    if start:
        dom.create()
    return dom


# --- 1: pools ------------------------------------------------------------------------------
def test_pool_change_conflicting_with_pins_is_refused_naming_every_guest(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool=None)
    ga = guest(conn, "t-a")
    guest(conn, "t-c")
    guest(conn, "t-ok")
    a.set_policy("t-a", {"vcpu_pins": {"0": "1"}})
    a.set_policy("t-c", {"emulator_pin": "1-2"})
    a.set_policy("t-ok", {"vcpu_pins": {"0": "5"}})
    with pytest.raises(PolicyError) as exc:
        a.set_pool("1")
    text = str(exc.value)
    assert "dedicated pool 1 refused" in text
    assert "guest 't-a': vCPU 0 pin 1: CPU 1 is in the dedicated pool 1" in text
    assert "guest 't-c': emulator pin 1-2: CPU 1 is in the dedicated pool 1" in text
    assert "t-ok" not in text
    assert a.cpus()["dedicated_pool"] == "" and live_pins(ga)[0] == "1"  # nothing changed
    # so a second guest can never be given CPU 1 as its dedicated CPU while t-a runs there
    assert a.set_pool("6-7")["dedicated_pool"] == "6-7"
    # the reverse was already refused: a policy whose pins touch the pool
    with pytest.raises(PolicyError, match="CPU 6 is in the dedicated pool"):
        a.set_policy("t-a", {"vcpu_pins": {"0": "6"}})


def test_pool_change_moving_an_allocation_away_from_its_explicit_pins_is_refused(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool="4-7")
    guest(conn, "t-d")
    a.set_policy("t-d", {"dedicated": 2, "vcpu_pins": {"0": "4"}})
    with pytest.raises(PolicyError, match="guest 't-d': vCPU 0 pin 4: CPU 4 is outside the guest's dedicated CPUs 6-7"):
        a.set_pool("6-7")
    assert a.cpus()["allocations"] == {"t-d": "4-5"}


def test_sweep_reports_a_dedicated_cpu_shared_by_two_guests(conn, make_agent):  # noqa: F811
    a = make_agent(dedicated_pool="4-7")
    d = guest(conn, "t-ded")
    a.set_policy("t-ded", {"dedicated": "5-6"})
    # another tool writes a policy pinning a guest onto t-ded's CPU (the agent refuses such a policy itself)
    other = guest(conn, "t-tool", start=False)
    other.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, "<policy><vcpupin vcpu='0' cpuset='5'/></policy>",
                      metadata.PREFIX, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    other.create()
    # and a guest pinned by its manager onto it (left alone: reported, not fought)
    pinned_guest(conn, "t-mgr", {0: "6", 1: "0"}, emulator="0")
    errors_before = metric("vmsched_agent_errors_total", kind="overlap")
    summary = a.reconcile()
    # the policy written behind the agent's back is not enforced: kept on the shared set, error
    assert live_pins(other) == {0: "0-3", 1: "0-3"}
    tool = a.get_policy("t-tool")
    assert tool["status"] == "error" and "CPU 5 is in the dedicated pool" in tool["error"]
    # the manager's pin onto a dedicated CPU: reported on both guests, a metric, the sweep's errors
    msg = "dedicated CPUs 6 of guest 't-ded' are shared with guest 't-mgr' (vcpu0 on 6)"
    assert msg in summary["errors"]
    assert metric("vmsched_agent_dedicated_overlaps") == 1
    assert metric("vmsched_agent_errors_total", kind="overlap") == errors_before + 2  # one per guest involved
    ded = [p for p in a.list_policies()["policies"] if p["guest"] == "t-ded"][0]
    assert ded["status"] == "error" and msg in ded["error"]
    # an event between sweeps (its metadata rewritten as it is) does not hide the overlap
    synced = metric("vmsched_agent_event_to_applied_seconds_count", event="metadata")
    same = d.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    d.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, same, metadata.PREFIX, metadata.NS,
                  libvirt.VIR_DOMAIN_AFFECT_LIVE)
    assert wait_until(lambda: metric("vmsched_agent_event_to_applied_seconds_count", event="metadata") > synced)
    assert a.wait_idle()
    ded = a.get_policy("t-ded")
    assert ded["status"] == "error" and msg in ded["error"]
    assert live_pins(d) == {0: "5", 1: "6"}
    assert live_pins(conn.lookupByName("t-mgr"))[0] == "6"
    # reported once, not on every sweep; gone when the overlap is gone
    a.reconcile()
    assert metric("vmsched_agent_errors_total", kind="overlap") == errors_before + 2  # one per guest involved
    a.set_policy("t-mgr", {})  # an admin gives it a vmsched policy: the agent places it now
    summary = a.reconcile()
    assert msg not in summary["errors"] and metric("vmsched_agent_dedicated_overlaps") == 0
    assert live_pins(conn.lookupByName("t-mgr")) == {0: "0-3", 1: "0-3"}


# --- 7: a manager's own pinning -----------------------------------------------------------------
def test_guest_pinned_by_its_manager_keeps_its_pins(conn, make_agent):  # noqa: F811
    dom = pinned_guest(conn, "t-vdsm", {0: "1", 1: "2"}, emulator="0")
    stopped = pinned_guest(conn, "t-vdsm-off", {0: "3", 1: "2"}, start=False)
    a = make_agent(dedicated_pool="4-7")  # start: every other unmanaged guest is confined to 0-3
    assert live_pins(dom) == {0: "1", 1: "2"} and emulator_pin(dom) == "0"
    assert live_pins(conn.lookupByName("test")) == {0: "0-3", 1: "0-3"}  # the agent's confinement goes on
    assert a.reconcile()["repaired"] == 0
    stopped.create()
    assert a.wait_idle()
    assert live_pins(stopped) == {0: "3", 1: "2"}
    a.set_pool("5-7")
    assert live_pins(dom) == {0: "1", 1: "2"} and emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "0"
    assert live_pins(conn.lookupByName("test")) == {0: "0-4", 1: "0-4"}
    view = a.get_policy("t-vdsm")
    assert view["policy"] is None and view["status"] == "unmanaged" and view["desired"]["vcpus"] is None
    assert "<vcpupin vcpu='0' cpuset='1'/>" in dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE)
    # an admin gives it a policy: the agent manages it from then on
    a.set_policy("t-vdsm", {"weight": 500})
    assert live_pins(dom) == {0: "0-4", 1: "0-4"}


def test_manager_pins_into_the_pool_are_reported_not_fought(conn, make_agent, caplog):  # noqa: F811
    caplog.set_level("WARNING")
    dom = pinned_guest(conn, "t-vdsm", {0: "7", 1: "1"})
    a = make_agent(dedicated_pool="4-7")
    assert live_pins(dom) == {0: "7", 1: "1"}
    assert metric("vmsched_agent_foreign_pins_in_pool") == 1
    assert "pinned by their manager (no vmsched policy) into the dedicated pool 4-7: t-vdsm" in caplog.text
    a.reconcile()
    assert live_pins(dom) == {0: "7", 1: "1"}


# --- 2: host identity ------------------------------------------------------------------------
def test_renamed_agent_keeps_pool_and_allocations(conn, make_agent, state_dir, caplog):  # noqa: F811
    a = make_agent(host_id="node-a")
    dom = guest(conn, "t-ren")
    a.set_policy("t-ren", {"dedicated": 2})
    a.stop()
    caplog.set_level("INFO")
    b = make_agent(host_id="node-b", dedicated_pool=None)
    assert b.cpus()["allocations"] == {"t-ren": "4-5"} and b.cpus()["dedicated_pool"] == "4-7"
    assert b.cpus()["host_id"] == "node-b"
    assert "host ID changed from 'node-a' to 'node-b'" in caplog.text
    assert not list(state_dir.glob("checkpoint.json.corrupt-*"))
    assert live_pins(dom) == {0: "4", 1: "5"}


def test_lost_checkpoint_is_rebuilt_from_this_machines_hints_only(conn, make_agent, state_dir):  # noqa: F811
    a = make_agent(host_id="node-a")
    dom = guest(conn, "t-hint")
    a.set_policy("t-hint", {"dedicated": 2})
    machine = a.machine
    a.stop()
    (state_dir / checkpoint.FILENAME).unlink()
    other = guest(conn, "t-elsewhere")  # an allocation recorded by another machine's agent
    other.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                      "<policy><weight>500</weight><allocation host='node-x' cpus='0-1' pool='0-3'/></policy>",
                      metadata.PREFIX, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_AFFECT_LIVE)
    meta = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert f'host="{machine}"' in meta and 'cpus="4-5"' in meta
    b = make_agent(host_id="node-b", dedicated_pool=None)  # no checkpoint: from the guests' records
    assert b.cpus()["dedicated_pool"] == "4-7"  # this machine's records only, not node-x's 0-3
    assert b.cpus()["allocations"]["t-hint"] == "4-5"


# --- 6: one agent per libvirtd ----------------------------------------------------------------
def test_second_agent_on_the_same_libvirtd_is_refused(conn, make_agent, state_dir, tmp_path):  # noqa: F811
    first = make_agent(host_id="one")
    second = Agent(TEST_URI, "two", tmp_path / "other-state", None, lock_dir=state_dir / "lock", dedicated_pool="4-7")
    with pytest.raises(HostLocked) as exc:
        second.start()
    text = str(exc.value)
    assert "another vmsched agent already manages the libvirtd of this machine" in text
    assert "pid " in text and "host_id one" in text and f"state_dir {state_dir.resolve()}" in text
    assert "started 2" in text and "stop the other agent first" in text
    assert first.reconcile()["checked"] >= 1  # the first one is untouched
    first.stop()
    assert second.start().started  # free again once the first has stopped
    second.stop()


@pytest.mark.parametrize("content", [b"x" * (8 << 20), b"[" * 100_000, b"[1, 2]", b"\xff\xfe"])
def test_a_lock_file_that_is_no_description_is_read_bounded(tmp_path, content: bytes):
    """The refused agent reads the holder's description from the lock file: whatever is there, at most
    HOLDER_BYTES of it, and a refusal in one line either way."""
    first = HostLock(tmp_path, "m1")
    first.acquire({"host_id": "one"})
    try:
        first.path.write_bytes(content)
        with pytest.raises(HostLocked) as exc:
            HostLock(tmp_path, "m1").acquire({"host_id": "two"})
        text = str(exc.value)
        assert "holder unknown" in text and "\n" not in text and len(text) < 400, text
    finally:
        first.release()


def test_unusable_lock_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    agent = Agent(TEST_URI, "h", tmp_path / "state", None, lock_dir=blocker / "sub")
    with pytest.raises(AgentError, match="cannot open the host lock .*--lock-dir or VMSCHED_AGENT_LOCK_DIR"):
        agent.start()


def test_duplicated_elements_are_detected():
    from vmsched.services.policy_agent.virt.apply import duplicated

    ok = ("<domain><cputune><vcpupin vcpu='0' cpuset='1'/><vcpupin vcpu='1' cpuset='1'/><emulatorpin cpuset='0'/>"
          "</cputune><metadata><a:p xmlns:a='urn:a'/><b:p xmlns:b='urn:b'/></metadata></domain>")
    assert duplicated(ok) == []
    bad = ("<domain><cputune><vcpupin vcpu='0' cpuset='1'/><vcpupin vcpu='0' cpuset='0'/><shares>5</shares>"
           "<shares>6</shares></cputune><metadata><a:p xmlns:a='urn:a'/><a:p xmlns:a='urn:a'/></metadata></domain>")
    assert duplicated(bad) == ["<shares>", "<vcpupin vcpu='0'>", "metadata {urn:a}p"]
