"""The agent placing dedicated guests on a recorded two-socket server (test driver guests, recorded capabilities)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import libvirt
import pytest

from tests.agent.recorded_host import opener
from tests.support.agent_driver import conn, make_agent, state_dir  # noqa: F401 - fixtures
from tests.support.agent_driver import domain_xml, emulator_pin, live_pins
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.virt import metadata

TWO = "intel-2s-24c-smt2-2numa"
POOL = "1-23,25-47,49-71,73-95"  # core 0 of each socket stays shared


def guest(conn, name: str, vcpus: int = 2) -> libvirt.virDomain:  # noqa: F811
    dom = conn.defineXML(domain_xml(name, vcpus))
    dom.create()
    return dom


def numatune(dom: libvirt.virDomain, flags: int = 0) -> tuple[str | None, str | None]:
    memory = ET.fromstring(dom.XMLDesc(flags)).find("numatune/memory")
    return (None, None) if memory is None else (memory.get("mode"), memory.get("nodeset"))


def test_isolated_strict_guest_on_a_two_socket_server(conn, make_agent) -> None:  # noqa: F811
    a = make_agent(opener=opener(TWO), dedicated_pool=POOL)
    dom = guest(conn, "t-iso")
    view = a.set_policy("t-iso", {"dedicated": 2, "thread_policy": "isolate", "numa": "strict", "emulator": "isolate"})
    assert view["allocation"] == "1-3,49-51"  # three whole cores of node 0; the sibling threads held
    assert view["desired"]["vcpus"] == {"0": "1", "1": "2"} and view["desired"]["emulator"] == "3"
    assert view["desired"]["memory_nodes"] == "0"
    assert live_pins(dom) == {0: "1", 1: "2"} and emulator_pin(dom) == "3"
    assert numatune(dom) == ("strict", "0") and numatune(dom, libvirt.VIR_DOMAIN_XML_INACTIVE) == ("strict", "0")
    stored = ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, metadata.NS, 0)).find("dedicated")
    assert stored.attrib == {"count": "2", "threads": "isolate", "numa": "strict", "emulator": "isolate"}
    assert a.get_policy("t-iso")["policy"] == {"dedicated": 2, "thread_policy": "isolate", "numa": "strict",
                                                "emulator": "isolate"}
    assert a.reconcile()["repaired"] == 0  # what was applied is what it wants
    guest(conn, "t-other", 1)
    assert a.set_policy("t-other", {"dedicated": 1})["allocation"] == "4"  # never 49-51


def test_a_strict_request_no_node_can_take_is_refused_whole(conn, make_agent) -> None:  # noqa: F811
    a = make_agent(opener=opener(TWO), dedicated_pool=POOL)
    guest(conn, "t-big", 1)
    with pytest.raises(PolicyError) as exc:
        a.set_policy("t-big", {"dedicated": 50, "thread_policy": "require", "numa": "strict"})
    assert exc.value.errors == ["guest 't-big' needs 25 whole cores (50 CPUs, thread_policy require) in one NUMA"
                                " node (numa strict); free CPUs on whole cores: node 0 has 46, node 1 has 46"]
    assert a.get_policy("t-big")["policy"] is None and a.cpus()["allocations"] == {}


def test_policy_cpus_draws_sockets_cores_threads_and_holders(conn, make_agent, capsys) -> None:  # noqa: F811
    import argparse
    import json

    from vmsched.services.policy_agent.serve import serve
    from vmsched.services.policy_agent.surfaces.cli import register

    a = make_agent(opener=opener(TWO), dedicated_pool=POOL)
    guest(conn, "t-db")
    a.set_policy("t-db", {"dedicated": 2, "thread_policy": "isolate", "emulator": "isolate"})
    parser = argparse.ArgumentParser(prog="vmsched")
    register(parser.add_subparsers(dest="command", required=True), serve)

    def run(*argv: str) -> str:
        args = parser.parse_args(["policy", "cpus", *argv, "--socket", str(a.socket_path)])
        assert args.func(args) == 0
        return capsys.readouterr().out

    drawing = run()
    lines = drawing.splitlines()
    assert lines[0].startswith(f"host h1: CPUs 0-95; dedicated pool {POOL}")
    words = [line.split() for line in lines]
    assert ["socket", "0"] in words and ["socket", "1"] in words and words.count(["node", "1", "(189", "GiB)"]) == 1
    core1 = next(line for line in lines if line.split()[:2] == ["core", "1"])
    assert core1.split() == ["core", "1", "[1", "t-db", "vcpu0]", "[49", "t-db", "idle]"]  # its sibling held idle
    assert "[3 t-db emulator]" in drawing and "[0 shared]" in drawing and "[4 free]" in drawing
    assert sum(line.strip().startswith("core ") for line in lines) == 48
    reply = json.loads(run("--json"))
    threads = [t for s in reply["topology"]["sockets"] for n in s["nodes"] for c in n["cores"] for t in c["threads"]]
    assert len(threads) == 96 and {t["use"] for t in threads if t.get("guest") == "t-db"} == {"vcpu0", "vcpu1",
                                                                                             "emulator", "idle"}
