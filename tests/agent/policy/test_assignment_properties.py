"""Properties of the dedicated-CPU allocator on random hosts, pools and sequences of requests and releases."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from vmsched.services.policy_agent.policy.allocation import Pools
from vmsched.services.policy_agent.errors import PolicyError
from vmsched.services.policy_agent.policy.model import GuestPolicy
from vmsched.services.policy_agent.policy.topology import Cell, Cpu, Topology


@st.composite
def hosts(draw: st.DrawFn) -> Topology:
    """1-2 sockets of 1-2 NUMA nodes of 1-6 cores of 1-2 threads (Linux numbering: thread t of every core after
    thread t-1 of all of them); a few CPUs offline."""
    sockets, nodes_per, cores_per, threads = (draw(st.integers(1, n)) for n in (2, 2, 6, 2))
    ncores = sockets * nodes_per * cores_per
    offline = draw(st.sets(st.integers(0, ncores * threads - 1), max_size=3))
    cpus: dict[int, Cpu] = {}
    for core in range(ncores):
        node, socket = core // cores_per, core // (cores_per * nodes_per)
        ids = [t * ncores + core for t in range(threads)]
        online = frozenset(i for i in ids if i not in offline)
        for i in ids:
            cpus[i] = Cpu(i, node, socket, core, online, i in online) if i in online else Cpu(i, node, online=False)
    cells = tuple(Cell(n, frozenset(c.id for c in cpus.values() if c.node == n)) for n in range(sockets * nodes_per))
    return Topology(cpus, cells)


POLICY = st.fixed_dictionaries({
    "thread_policy": st.sampled_from(["prefer", "require", "isolate"]),
    "numa": st.sampled_from(["any", "strict"]),
    "emulator": st.sampled_from(["share", "isolate"]),
    "dedicated": st.integers(1, 6),
})
STEPS = st.lists(st.tuples(st.integers(0, 4), st.one_of(st.none(), POLICY)), min_size=1, max_size=14)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[Topology, frozenset[int], list]:
    host = draw(hosts())
    online = sorted(host.online)
    pool = frozenset(draw(st.sets(st.sampled_from(online), min_size=1))) if online else frozenset()
    return host, pool, draw(STEPS)


def check_invariants(p: Pools, policies: dict[str, GuestPolicy]) -> None:
    t = p.topo
    seen: set[int] = set()
    for uuid, held in p.allocations.items():
        assert held <= p.pool and held <= t.online and not held & seen, (uuid, held)
        seen |= held
        policy = policies[uuid]
        if policy.thread_policy in ("require", "isolate"):  # never a core shared with another guest
            for cpu in held:
                assert t.core_of(cpu) <= held, (uuid, policy.thread_policy, cpu, held)
        if policy.numa == "strict":
            assert len({t.node_of(c) for c in held}) == 1, (uuid, held)
        roles = p.roles(policy, held, 1)
        assert len(roles.vcpus) == 1 and roles.vcpus[0] in held
        if policy.emulator == "isolate":
            assert roles.emulator is not None and roles.emulator not in roles.vcpus and roles.emulator in held


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_allocations_keep_their_rules_and_their_cpus(scenario) -> None:
    host, pool, steps = scenario
    p = Pools(host.online, pool, topology=host)
    policies: dict[str, GuestPolicy] = {}
    for slot, data in steps:
        uuid = f"g{slot}"
        if data is None:  # a release
            p.release(uuid)
            policies.pop(uuid, None)
            continue
        policy = GuestPolicy(**data)
        before = p.copy()
        try:
            held = p.request_for(uuid, uuid, policy, 1)
        except PolicyError:
            assert p.allocations == before.allocations  # a refusal changes nothing
            continue
        assert p.request_for(uuid, uuid, policy, 1) == held  # deterministic
        p.assign(uuid, uuid, held)
        policies[uuid] = policy
        # keeps what it holds: asked again, it gets the same CPUs
        assert p.request_for(uuid, uuid, policy, 1) == held
        want = policy.dedicated + (1 if policy.emulator == "isolate" else 0)
        if policy.thread_policy == "prefer":
            assert len(held) == want
        elif policy.thread_policy == "isolate":
            assert len({host.core_of(c) for c in held}) == want
        else:
            assert len(held) >= want and len(held) - want < host.threads_per_core()
        check_invariants(p, policies)
    # stable under release and allocate: every guest still gets what it holds
    for uuid, held in list(p.allocations.items()):
        assert p.request_for(uuid, uuid, policies[uuid], 1) == held
        p.release(uuid)
        again = p.request_for(uuid, uuid, policies[uuid], 1)
        p.assign(uuid, uuid, again)
        assert p.request_for(uuid, uuid, policies[uuid], 1) == again
        check_invariants(p, policies)
