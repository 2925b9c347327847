"""The host topology from libvirt's capabilities: the parser on servers' documents, and the one reader of the agent."""

from __future__ import annotations

from pathlib import Path

import libvirt
import pytest

from tests.agent.recorded_host import RecordedHost, capabilities, opener
from tests.support.agent_driver import make_agent, state_dir  # noqa: F401 - fixtures
from vmsched.cpuset import parse as S
from vmsched.services.policy_agent.facts.arithmetic import topology_facts
from vmsched.services.policy_agent.policy.topology import TopologyError, from_counts, parse_capabilities
from vmsched.services.policy_agent.virt.host import read_topology


def topo(name: str):
    t = parse_capabilities(capabilities(name))
    assert t is not None
    return t


def test_one_socket_eight_cores_smt2() -> None:
    t = topo("intel-1s-8c-smt2")
    assert t.online == S("0-15") and t.offline == frozenset() and t.cpumap_length == 16
    assert t.cores() == [frozenset({c, c + 8}) for c in range(8)]
    assert t.core_of(11) == S("3,11") and t.threads_per_core() == 2
    assert t.nodes() == [0] and t.node_cpus(0) == S("0-15") and t.cells[0].memory_kib == 65602472
    assert topology_facts(t) == {"sockets": 1, "cores": 8, "threads": 2}


def test_two_sockets_two_numa_nodes() -> None:
    t = topo("intel-2s-24c-smt2-2numa")
    assert len(t.online) == 96 and len(t.cores()) == 48
    assert t.node_cpus(0) == S("0-23,48-71") and t.node_cpus(1) == S("24-47,72-95")
    assert t.socket_cpus() == {0: S("0-23,48-71"), 1: S("24-47,72-95")}
    assert t.core_of(30) == S("30,78") and t.node_of(78) == 1
    # core IDs repeat across sockets and have gaps: cores are told apart by their threads
    assert t.cpus[6].core == 8 and t.cpus[30].core == 8 and t.core_of(6) != t.core_of(30)
    # libvirt's host/cpu/topology counts sockets per NUMA node; the facts count the host's
    assert topology_facts(t) == {"sockets": 2, "cores": 24, "threads": 2}


def test_epyc_four_numa_nodes_on_one_socket() -> None:
    t = topo("amd-epyc-7452-nps4")
    assert t.nodes() == [0, 1, 2, 3] and len(t.online) == 64
    assert t.node_cpus(1) == S("8-15,40-47") and len(t.socket_cpus()) == 1
    assert all(len(t.node_cpus(n)) == 16 for n in t.nodes())
    assert topology_facts(t) == {"sockets": 1, "cores": 32, "threads": 2}


def test_offline_cpus() -> None:
    t = topo("intel-1s-8c-smt2-offline")
    assert t.offline == S("7,9,15") and t.online == S("0-6,8,10-14")
    assert t.cpumap_length == 16  # a cpumap still spans the offline CPUs
    assert t.core_of(1) == S("1")  # its sibling 9 is offline
    assert len(t.cores()) == 7 and S("7,15") not in t.cores()
    assert t.cells[0].cpus == S("0-15")  # the cell lists every CPU, online or not
    assert "3 offline CPUs: 7,9,15" in t.describe()


def test_the_ci_machine_as_recorded() -> None:
    t = topo("ci-qemu-2cpu")
    assert t.online == S("0-1") and t.cores() == [S("0"), S("1")] and t.nodes() == [0]


def test_unreadable_documents() -> None:
    with pytest.raises(TopologyError, match="unreadable"):
        parse_capabilities("<capabilities><host>")
    with pytest.raises(TopologyError, match="no <host>"):
        parse_capabilities("<capabilities/>")
    with pytest.raises(TopologyError, match="socket_id 'x' is not a number"):
        parse_capabilities("<capabilities><host><topology><cells><cell id='0'><cpus>"
                           "<cpu id='0' socket_id='x' siblings='0'/></cpus></cell></cells></topology></host>"
                           "</capabilities>")
    assert parse_capabilities("<capabilities><host><topology><cells num='0'/></topology></host></capabilities>") is None


def test_node_info_counts_when_the_capabilities_list_no_cell() -> None:
    t = from_counts(16, 2, 1, 4, 2)
    assert t.nodes() == [0, 1] and t.node_cpus(1) == S("8-15") and t.core_of(9) == S("8-9")
    assert topology_facts(t) == {"sockets": 2, "cores": 4, "threads": 2}


# --- the agent's reader on the test URIs ------------------------------------------------------------
def test_test_default_gives_sixteen_cpus_in_two_nodes() -> None:
    conn = libvirt.open("test:///default")
    try:
        t = read_topology(conn)
        assert t.online == S("0-15") and t.node_cpus(1) == S("8-15") and t.threads_per_core() == 1
        assert conn.getCPUMap()[0] == 8  # the driver's fixed CPU map: not where the agent's CPUs come from
    finally:
        conn.close()


def test_test_driver_node_file_gives_its_counts(tmp_path: Path) -> None:
    node = tmp_path / "node.xml"
    node.write_text("<node><cpu><mhz>2000</mhz><model>i686</model><active>16</active><nodes>2</nodes>"
                    "<sockets>1</sockets><cores>4</cores><threads>2</threads></cpu><memory>8192000</memory></node>")
    conn = libvirt.open(f"test://{node}")
    try:
        t = read_topology(conn)
        assert t.online == S("0-15") and t.nodes() == [0, 1] and t.core_of(0) == S("0-1")
    finally:
        conn.close()


def test_a_recorded_host_answers_with_its_capabilities() -> None:
    host = RecordedHost("test:///default", capabilities("intel-2s-24c-smt2-2numa"))
    try:
        assert len(read_topology(host).online) == 96
        assert host.getType() == "TEST"  # the rest is the test driver
    finally:
        host.conn.close()


def test_the_agent_counts_the_recorded_hosts_cpus(make_agent) -> None:  # noqa: F811
    a = make_agent(opener=opener("intel-1s-8c-smt2-offline"), dedicated_pool="4-6,12-14")
    view = a.cpus()
    assert view["host_cpus"] == "0-6,8,10-14"  # offline CPUs 7, 9 and 15 are not the host's
    assert view["shared"] == "0-3,8,10-11"
