"""Transient guests (createXML, no persistent definition) keep their policy in the agent's store
(libvirt's test driver; the same on real QEMU: tests/e2e/libvirt/test_transient.py)."""

from __future__ import annotations

import json

import libvirt
import pytest

from vmsched.services.policy_agent.state import durable, store as store_mod
from vmsched.services.policy_agent.errors import GuestNotFound
from vmsched.services.policy_agent.policy.model import parse_policy
from vmsched.services.policy_agent.state.store import PolicyStore
from vmsched.services.policy_agent.virt import metadata
from tests.support.agent_driver import domain_xml, live_pins
from tests.support.waiting import wait_until
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures

UUID = "5c1e2f6a-1b2c-4d3e-8f90-0123456789ab"


@pytest.fixture(autouse=True)
def _no_transient_left(conn):  # noqa: F811 - before conn's own cleanup, which expects persistent guests
    yield
    for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_TRANSIENT):
        if dom.name().startswith("t-"):
            dom.destroy()


def create(conn, name: str = "t-tr", vcpus: int = 2) -> libvirt.virDomain:  # noqa: F811
    xml = domain_xml(name, vcpus).replace("<name>", f"<uuid>{UUID}</uuid><name>", 1)
    dom = conn.createXML(xml, 0)
    assert not dom.isPersistent()
    return dom


def live_meta(dom) -> str | None:
    try:
        return dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata.NS, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError:
        return None


# --- the store alone ---------------------------------------------------------------
def test_store_round_trip_and_atomic_file(tmp_path):
    s = PolicyStore(tmp_path / store_mod.FILENAME).load()
    s.put(UUID.upper(), "vm1", parse_policy({"vcpu_pins": {"0": "2"}, "weight": 300}))
    again = PolicyStore(tmp_path / store_mod.FILENAME).load()
    assert again.get(UUID).policy == parse_policy({"vcpu_pins": {"0": "2"}, "weight": 300})
    assert again.find("vm1").uuid == UUID and again.find(UUID.upper()).name == "vm1"
    assert again.problem is None
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"
    assert again.remove(UUID) and not again.remove(UUID)
    assert PolicyStore(tmp_path / store_mod.FILENAME).load().all() == []


def sealed_store(path, policy: dict) -> None:
    """A store with a valid checksum holding ``policy`` unchecked: written by a bug or by hand, not torn."""
    payload = {"version": store_mod.VERSION, "guests": {UUID: {"name": "vm1", "policy": policy, "saved_at": 0.0}}}
    path.write_text(json.dumps({"checksum": durable.digest(payload), "store": payload}))


@pytest.mark.parametrize("damage", ["truncate", "edit", "oversize", "huge_cpu_set"])
def test_corrupt_store_is_moved_aside_not_fatal(tmp_path, damage, caplog):
    path = tmp_path / store_mod.FILENAME
    PolicyStore(path).load().put(UUID, "vm1", parse_policy({"weight": 300}))
    raw = path.read_text()
    if damage == "oversize":
        path.write_text(raw + " " * durable.MAX_BYTES)
    elif damage == "huge_cpu_set":
        sealed_store(path, {"vcpu_pins": {"0": ",".join(["0-16383"] * 125000)}})
    else:
        path.write_text(raw[: len(raw) // 2] if damage == "truncate" else raw.replace("300", "301"))
    caplog.set_level("WARNING")
    s = PolicyStore(path).load()
    assert s.all() == [] and s.problem
    assert list(tmp_path.glob(f"{store_mod.FILENAME}.corrupt-*")), "the unusable file is kept for inspection"
    [line] = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert s.problem in line and "\n" not in line and len(line.replace(str(tmp_path), "")) < 400, line


# --- through the agent ----------------------------------------------------------------
def test_transient_guest_gets_its_stored_policy_when_created_again(conn, make_agent, state_dir):  # noqa: F811
    a = make_agent()
    dom = create(conn)
    view = a.set_policy("t-tr", {"vcpu_pins": {"0": "2", "1": "3"}, "weight": 300})
    assert view["status"] == "partial" and live_pins(dom) == {0: "2", 1: "3"}  # partial: no weight here
    doc = json.loads((state_dir / store_mod.FILENAME).read_text())
    assert doc["store"]["guests"][UUID]["policy"] == {"vcpu_pins": {"0": "2", "1": "3"}, "weight": 300}
    assert "<weight>300</weight>" in live_meta(dom)

    dom.destroy()  # a transient guest is gone for good: its live metadata too
    wait_until(lambda: a.wait_idle() and a.inventory.get(UUID) is None)
    listed = {p["uuid"]: p for p in a.list_policies()["policies"]}
    assert listed[UUID]["state"] == "absent" and listed[UUID]["policy"]["weight"] == 300

    dom = create(conn)  # the same UUID again, without any policy in its XML
    wait_until(lambda: live_pins(dom) == {0: "2", 1: "3"})
    wait_until(lambda: live_meta(dom) is not None and "<weight>300</weight>" in live_meta(dom))
    assert a.get_policy(UUID)["status"] == "partial"  # applied, but for the weight (test driver)


def test_stored_policy_survives_an_agent_restart(conn, make_agent):  # noqa: F811
    a = make_agent()
    dom = create(conn)
    a.set_policy(UUID, {"vcpu_pins": {"0": "1", "1": "1"}})
    a.stop()
    dom.destroy()
    dom = create(conn)  # started while no agent runs: unpinned
    assert live_pins(dom) != {0: "1", 1: "1"}
    make_agent()  # the start-up sweep applies the stored policy
    assert live_pins(dom) == {0: "1", 1: "1"}
    assert "<vcpupin" in (live_meta(dom) or "")


def test_delete_removes_the_stored_policy_of_an_absent_guest(conn, make_agent, state_dir):  # noqa: F811
    a = make_agent()
    dom = create(conn)
    a.set_policy("t-tr", {"vcpu_pins": {"0": "2"}})
    dom.destroy()
    wait_until(lambda: a.wait_idle() and a.inventory.get(UUID) is None)
    assert a.delete_policy(UUID) == {"guest": "t-tr", "uuid": UUID, "deleted": True}
    assert a.list_policies()["policies"] == []
    with pytest.raises(GuestNotFound):
        a.delete_policy(UUID)
    dom = create(conn)
    a.wait_idle()
    a.reconcile()
    assert live_pins(dom) == {0: "0-3", 1: "0-3"}, "a deleted policy must not come back"
    assert live_meta(dom) is None


def test_delete_of_a_running_transient_guest_removes_it_from_the_store(conn, make_agent):  # noqa: F811
    a = make_agent()
    dom = create(conn)
    a.set_policy("t-tr", {"vcpu_pins": {"0": "2"}})
    assert a.delete_policy("t-tr")["deleted"] is True
    dom.destroy()
    dom = create(conn)
    a.wait_idle()
    a.reconcile()
    assert live_pins(dom)[0] == "0-3" and a.get_policy(UUID)["policy"] is None


def test_policy_in_live_metadata_of_a_transient_guest_is_stored(conn, make_agent):  # noqa: F811
    """A tool that writes the policy into the live metadata itself (or an agent without a store did)."""
    a = make_agent()
    dom = create(conn)
    metadata.write(dom, parse_policy({"vcpu_pins": {"0": "3"}}), None)
    a.reconcile()
    assert live_pins(dom)[0] == "3"
    dom.destroy()
    dom = create(conn)
    a.wait_idle()
    wait_until(lambda: live_pins(dom)[0] == "3")


def test_persistent_guests_do_not_use_the_store(conn, make_agent, state_dir):  # noqa: F811
    a = make_agent()
    dom = conn.defineXML(domain_xml("t-pers"))
    dom.create()
    a.set_policy("t-pers", {"vcpu_pins": {"0": "2"}})
    assert not (state_dir / store_mod.FILENAME).exists()
