"""The agent against libvirt's test driver: events, apply, validation, pools, checkpoint recovery.

The test driver emits lifecycle events but no REBOOT or TUNABLE events and has
no close callback; those paths are driven by handing the agent the event a
QEMU libvirtd would send (what its callbacks receive), nothing more.
"""

from __future__ import annotations

import json

import libvirt
import pytest

from vmsched.services.policy_agent.virt import metadata
from vmsched.services.policy_agent.agent import Agent
from vmsched.services.policy_agent.errors import GuestNotFound, PolicyError
from vmsched.services.policy_agent.virt.connection import DomainEvent
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import emulator_pin, guest, live_pins, metric
from tests.support.waiting import wait_until


def inject(agent: Agent, dom: libvirt.virDomain, kind: str) -> None:
    """Deliver the event a QEMU libvirtd would send (the test driver has no REBOOT/TUNABLE)."""
    agent._on_event(DomainEvent(kind, dom.UUIDString(), dom.name(), kind))


# --- start, apply ------------------------------------------------------------------
def test_start_confines_unmanaged_guests_to_the_shared_set(conn, make_agent):
    make_agent()
    test = conn.lookupByName("test")
    assert live_pins(test) == {0: "0-3", 1: "0-3"}
    assert emulator_pin(test) == "0-3"
    assert emulator_pin(test, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "0-3"


def test_set_policy_allocates_pins_and_records_everywhere(conn, make_agent, state_dir):
    a = make_agent()
    dom = guest(conn, "t-db")
    view = a.set_policy("t-db", {"dedicated": 2, "weight": 300, "emulator_pin": "1"})
    assert view["allocation"] == "4-5" and view["status"] == "partial"  # the test driver has no weight
    assert view["warnings"] == ["weight not applied: libvirt's TEST driver has no scheduler parameters"]
    assert live_pins(dom) == {0: "4", 1: "5"}
    assert emulator_pin(dom) == "1" and emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "1"
    assert a.cpus()["allocations"] == {"t-db": "4-5"} and a.cpus()["free"] == "6-7"
    # source of truth: the domain's own metadata, with the allocation hint
    meta = dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    assert 'count="2"' in meta and 'cpus="4-5"' in meta and "<weight>300</weight>" in meta
    ckpt = json.loads((state_dir / "checkpoint.json").read_text())["checkpoint"]
    assert ckpt["allocations"][dom.UUIDString()] == {"name": "t-db", "cpus": "4-5"}
    assert a.get_policy(dom.UUIDString())["policy"] == {"dedicated": 2, "weight": 300, "emulator_pin": "1"}
    assert [p["guest"] for p in a.list_policies()["policies"]] == ["t-db"]
    assert metric("vmsched_agent_dedicated_cpus", state="allocated") == 2


def test_started_event_applies_policy_of_a_stopped_guest(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-web", start=False)
    a.set_policy("t-web", {"vcpu_pins": {"0": "2", "1": "3"}})
    before = metric("vmsched_agent_event_to_applied_seconds_count", event="started")
    dom.create()
    wait_until(lambda: live_pins(dom) == {0: "2", 1: "3"})
    wait_until(lambda: metric("vmsched_agent_event_to_applied_seconds_count", event="started") > before)
    assert a.get_policy("t-web")["state"] == "running"


def test_policy_in_metadata_of_a_new_guest_is_enforced(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-meta", start=False)
    dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, "<policy><vcpupin vcpu='1' cpuset='0'/></policy>",
                    metadata.PREFIX, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    dom.create()
    wait_until(lambda: live_pins(dom) == {0: "0-3", 1: "0"})
    assert wait_until(lambda: a.inventory.get(dom.UUIDString()).policy is not None)


def test_invalid_policy_is_refused_whole(conn, make_agent):
    a = make_agent()
    guest(conn, "t-a")
    dom_b = guest(conn, "t-b")
    a.set_policy("t-a", {"dedicated": "4-5"})
    assert a.wait_idle()
    before = (live_pins(dom_b), dom_b.XMLDesc(0))
    refused = metric("vmsched_agent_policy_applications_total", outcome="refused")
    with pytest.raises(PolicyError) as exc:
        a.set_policy("t-b", {"dedicated": "5-6", "weight": 100, "vcpu_pins": {"0": "99"}})
    msgs = exc.value.errors
    assert "dedicated set 5-6: CPU 5 is already dedicated to guest 't-a'" in msgs
    assert "vCPU 0 pin 99: CPU 99 does not exist on this host (CPUs 0-15)" in msgs
    with pytest.raises(PolicyError, match="asks for 3 dedicated CPUs but only 2 are free"):
        a.set_policy("t-b", {"dedicated": 3})
    with pytest.raises(PolicyError, match="weight"):
        a.set_policy("t-b", {"weight": 1})
    assert metric("vmsched_agent_policy_applications_total", outcome="refused") == refused + 3  # each one counted
    assert (live_pins(dom_b), dom_b.XMLDesc(0)) == before  # nothing half-applied
    assert a.cpus()["allocations"] == {"t-a": "4-5"}
    with pytest.raises(GuestNotFound):
        a.set_policy("t-nothere", {})


def test_dependency_cycle_refused(conn, make_agent):
    a = make_agent()
    for n in ("t-x", "t-y", "t-z"):
        guest(conn, n, start=False)
    a.set_policy("t-x", {"requires": ["t-y"]})
    a.set_policy("t-y", {"requires": ["t-z"]})
    with pytest.raises(PolicyError, match="dependency cycle: t-z -> t-x -> t-y -> t-z"):
        a.set_policy("t-z", {"requires": ["t-x"]})


def test_dependency_cycle_through_a_guest_not_seen_yet_is_refused(conn, make_agent):
    """A guest defined a moment ago, whose define event the agent has not handled, closes a cycle too."""
    a = make_agent()
    doms = [guest(conn, n, start=False) for n in ("t-x", "t-y", "t-z")]
    a.set_policy("t-x", {"requires": ["t-y"]})
    a.set_policy("t-y", {"requires": ["t-z"]})
    assert a.wait_idle()
    a.inventory.remove(doms[2].UUIDString())  # as if t-z's define event were still on its way
    with pytest.raises(PolicyError, match="dependency cycle: t-z -> t-x -> t-y -> t-z"):
        a.set_policy("t-z", {"requires": ["t-x"]})


# --- drift, reboot, sweep ---------------------------------------------------------------
def test_tunable_drift_is_restored_and_counted(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-drift")
    a.set_policy("t-drift", {"dedicated": 2})
    assert a.wait_idle()  # our own writes' events are handled: what follows is someone else's
    drift = metric("vmsched_agent_drift_corrections_total")
    dom.pinVcpu(0, (True,) * 8)  # someone re-pins by hand
    inject(a, dom, "tunable")
    wait_until(lambda: live_pins(dom)[0] == "4")
    wait_until(lambda: metric("vmsched_agent_drift_corrections_total") == drift + 1)
    # the counter goes up just before the event is published: wait for the event too (not only the counter)
    wait_until(lambda: any(e == "drift" and b["guest"] == "t-drift" for e, b in a.events))


def test_reboot_events_are_debounced(conn, make_agent):
    a = make_agent(reconcile_interval=3600)
    dom = guest(conn, "t-boot")
    a.set_policy("t-boot", {"vcpu_pins": {"0": "1"}})
    assert a.wait_idle()
    repairs = metric("vmsched_agent_repairs_total", trigger="reboot")
    count = metric("vmsched_agent_event_to_applied_seconds_count", event="reboot")
    dom.pinVcpu(0, (True,) * 8)
    inject(a, dom, "reboot")
    inject(a, dom, "reboot")  # one reset fires two REBOOT events
    wait_until(lambda: metric("vmsched_agent_event_to_applied_seconds_count", event="reboot") > count)
    assert live_pins(dom)[0] == "1"
    assert a.jobs.pending() == 0
    assert metric("vmsched_agent_repairs_total", trigger="reboot") == repairs + 1
    assert metric("vmsched_agent_event_to_applied_seconds_count", event="reboot") == count + 1


def test_sweep_repairs_changes_made_without_an_event(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-sweep")
    a.set_policy("t-sweep", {"dedicated": 2})
    assert a.wait_idle()
    dom.pinVcpu(1, (True,) * 8)
    dom.pinEmulator((True,) * 8, libvirt.VIR_DOMAIN_AFFECT_CONFIG)
    summary = a.reconcile()
    assert summary["repaired"] == 1 and summary["errors"] == []
    assert live_pins(dom)[1] == "5"
    assert emulator_pin(dom, libvirt.VIR_DOMAIN_AFFECT_CONFIG) == "0-3"
    assert a.reconcile()["repaired"] == 0


def test_periodic_sweep_runs(conn, make_agent):
    a = make_agent(reconcile_interval=0.05)
    dom = guest(conn, "t-periodic")
    a.set_policy("t-periodic", {"vcpu_pins": {"0": "2"}})
    dom.pinVcpu(0, (True,) * 8)
    wait_until(lambda: live_pins(dom)[0] == "2")


# --- pools and allocations ----------------------------------------------------------------
def test_pool_change_repins_running_guests(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-ded")
    other = guest(conn, "t-other")
    a.set_policy("t-ded", {"dedicated": 2})
    view = a.set_pool("6-7")
    assert view["allocations"] == {"t-ded": "6-7"} and view["shared"] == "0-5,8-15"
    assert live_pins(dom) == {0: "6", 1: "7"}
    assert live_pins(other) == {0: "0-5", 1: "0-5"}  # the test driver keeps CPUs 0-7 of a pin
    assert emulator_pin(dom) == "0-5"
    a.set_policy("t-ded", {"dedicated": "6-7"})
    with pytest.raises(PolicyError, match="CPUs 6-7 are not in the host's dedicated pool 4-5"):
        a.set_pool("4-5")
    assert a.cpus()["dedicated_pool"] == "6-7" and live_pins(dom) == {0: "6", 1: "7"}
    with pytest.raises(PolicyError, match="at least one CPU must stay shared"):
        a.set_pool("0-15")
    a.set_policy("t-ded", {})
    a.set_pool("none")
    assert live_pins(other) == {0: "0-7", 1: "0-7"}


def test_undefine_releases_and_release_on_stop(conn, make_agent):
    a = make_agent(release_on_stop=True)
    dom = guest(conn, "t-rel")
    a.set_policy("t-rel", {"dedicated": 2})
    assert a.cpus()["allocations"] == {"t-rel": "4-5"}
    dom.destroy()
    wait_until(lambda: a.cpus()["allocations"] == {})
    dom.create()
    wait_until(lambda: a.cpus()["allocations"] == {"t-rel": "4-5"})
    wait_until(lambda: live_pins(dom) == {0: "4", 1: "5"})
    dom.destroy()
    dom.undefine()
    wait_until(lambda: a.inventory.get(dom.UUIDString()) is None)
    wait_until(lambda: a.cpus()["allocations"] == {})


def test_undefine_releases_allocation(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-undef")
    a.set_policy("t-undef", {"dedicated": 2})
    dom.destroy()  # stopped alone keeps the allocation (release_on_stop is off)
    wait_until(lambda: a.inventory.get(dom.UUIDString()).state_name == "shutoff")
    assert a.cpus()["allocations"] == {"t-undef": "4-5"}
    dom.undefine()
    wait_until(lambda: a.cpus()["allocations"] == {})


def test_delete_policy_releases_and_unpins(conn, make_agent):
    a = make_agent(dedicated_pool=None)
    dom = guest(conn, "t-del")
    a.set_policy("t-del", {"vcpu_pins": {"0": "1", "1": "2"}})
    assert a.delete_policy("t-del")["deleted"] is True
    assert live_pins(dom) == {0: "0-7", 1: "0-7"}
    assert dom.XMLDesc(0).find(metadata.NS) == -1
    assert a.delete_policy("t-del")["deleted"] is False


# --- checkpoint recovery -------------------------------------------------------------------
def test_corrupt_checkpoint_is_rebuilt_from_metadata(conn, make_agent, state_dir, caplog):
    a = make_agent()
    guest(conn, "t-one")
    guest(conn, "t-two")
    a.set_policy("t-two", {"dedicated": "6-7"})
    a.set_policy("t-one", {"dedicated": 2})
    expected = a.cpus()["allocations"]
    a.stop()
    (state_dir / "checkpoint.json").write_text('{"checkpoint": {"host_id": "h1", "pool": "4-7"')  # torn write
    caplog.set_level("WARNING")
    b = make_agent(dedicated_pool=None)  # the pool too comes back from the guests' records
    assert b.cpus()["allocations"] == expected and b.cpus()["dedicated_pool"] == "4-7"
    assert "unusable" in caplog.text and "rebuilding host state" in caplog.text
    assert list(state_dir.glob("checkpoint.json.corrupt-*"))
    json.loads((state_dir / "checkpoint.json").read_text())  # a fresh, valid checkpoint


def test_inconsistent_checkpoint_is_rebuilt(conn, make_agent, state_dir):
    a = make_agent()
    dom = guest(conn, "t-inc")
    a.set_policy("t-inc", {"dedicated": 2})
    a.stop()
    doc = json.loads((state_dir / "checkpoint.json").read_text())
    doc["checkpoint"]["allocations"]["someone-else"] = {"name": "ghost", "cpus": "5-6"}
    (state_dir / "checkpoint.json").write_text(json.dumps(doc))  # checksum no longer matches
    b = make_agent()
    assert b.cpus()["allocations"] == {"t-inc": "4-5"}
    assert live_pins(dom) == {0: "4", 1: "5"}


def test_checkpoint_allocation_of_vanished_guest_is_released(conn, make_agent, state_dir):
    a = make_agent()
    dom = guest(conn, "t-van")
    a.set_policy("t-van", {"dedicated": 2})
    a.stop()
    dom.destroy()
    dom.undefine()  # while the agent is down: no event
    b = make_agent()
    assert b.cpus()["allocations"] == {}


# --- reconnect ------------------------------------------------------------------------------
def test_reconnect_after_loss_reconciles(conn, make_agent):
    a = make_agent()
    dom = guest(conn, "t-rc")
    a.set_policy("t-rc", {"vcpu_pins": {"0": "3"}})
    reconnects = metric("vmsched_agent_libvirt_reconnects_total")
    assert a.wait_idle()
    dom.pinVcpu(0, (True,) * 8)  # a change the agent gets no event for (as while it is disconnected)
    a.connection.mark_lost("simulated: libvirtd went away")  # what the close callback does on EOF
    wait_until(lambda: metric("vmsched_agent_libvirt_reconnects_total") == reconnects + 1)
    wait_until(lambda: live_pins(dom)[0] == "3")
    assert a.connection.connected.is_set()
    assert metric("vmsched_agent_libvirt_connected") == 1


# --- dependencies -------------------------------------------------------------------------------
def test_start_dependencies(conn, make_agent):
    a = make_agent()
    db, app, web = (guest(conn, n, start=False) for n in ("t-db", "t-app", "t-web"))
    a.set_policy("t-app", {"requires": ["t-db"]})
    a.set_policy("t-web", {"requires": ["t-app", "t-db"]})
    ok, msg = a.check_start("t-web")
    assert not ok and "'t-app' (shutoff)" in msg and "'t-db' (shutoff)" in msg
    assert a.check_start("t-db") == (True, "guest 't-db' has no start requirements")
    result = a.start_domain("t-web", wait=5)
    assert result == {"started": ["t-db", "t-app", "t-web"], "already_running": []}
    assert all(d.isActive() for d in (db, app, web))
    assert a.check_start("t-web")[0] is True
    result = a.stop_domain("t-db", wait=5)
    assert result["stopped"] == ["t-web", "t-app", "t-db"]
    assert not any(d.isActive() for d in (db, app, web))
    # check_start answers from the cache: from the hook's domain XML when given
    xml = "<domain><name>t-app</name><metadata><vmsched:policy xmlns:vmsched='%s'><vmsched:requires>t-web</vmsched:requires></vmsched:policy></metadata></domain>" % metadata.NS
    assert a.check_start("t-app", xml=xml)[0] is False


def test_drift_repair_loop_is_bounded(conn, make_agent):
    from vmsched.services.policy_agent.enforce.enforcer import DRIFT_LOOP

    a = make_agent(tunable_debounce=0.0)
    dom = guest(conn, "t-loop")
    a.set_policy("t-loop", {"vcpu_pins": {"0": "1"}})
    assert a.wait_idle()
    for _ in range(DRIFT_LOOP[0]):  # something keeps undoing the pin: each time restored
        dom.pinVcpu(0, (True,) * 8)
        inject(a, dom, "tunable")
        wait_until(lambda: live_pins(dom)[0] == "1")
        assert a.wait_idle()
    dom.pinVcpu(0, (True,) * 8)
    inject(a, dom, "tunable")
    assert a.wait_idle()
    assert live_pins(dom)[0] == "0-7"  # event-driven repair paused
    view = a.get_policy("t-loop")
    assert view["status"] == "error" and "repair loop on 't-loop'" in view["error"]
    assert a.reconcile()["repaired"] == 1 and live_pins(dom)[0] == "1"  # the sweep still applies
