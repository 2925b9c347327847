"""Stock filter and weight: room in the agent's dedicated CPU pool for a VM that needs dedicated CPUs.

A VM's need is what an agent knows of its vmsched policy (dedicated CPUs, thread_policy, numa), else what the
engine's CPU pinning policy asks (facts.pinning_needs: dedicated, isolate_threads). A host's room is what its
agent reports per NUMA node: free CPUs (prefer), CPUs on free whole cores (require), free whole cores (isolate);
numa strict needs it in one node.
"""

from vmsched.plugin import facts

#: where a thread policy finds its room in a node's facts
_ROOM = {"prefer": "free_cpus", "require": "free_core_cpus", "isolate": "free_cores"}
#: a weight above any single node's leftover: the VM fits only across NUMA nodes there
_ACROSS_NODES = 100000


class vmsched_DedicatedCpus:
    """Keep hosts whose dedicated CPU pool can take the VM; weigh them by how tightly it fits."""

    def do_filter(self, hosts, vm, args):
        """Keep hosts whose dedicated CPU pool has room for the VM's need; a VM of unknown need drops no host."""
        # The room per thread policy and NUMA policy: the module's docstring. A VM of unknown need is an error.
        # Hosts without fresh facts are kept; the VM's own CPUs on a host count as free there.
        found = {h: f for h in hosts if (f := facts.host(h)) is not None}
        need = _need(vm, found, facts.vm())
        return [h for h in hosts if (f := found.get(h)) is None or f.stale or f.dedicated_free_cpus is None
                or need[0] == 0 or _fit(f, vm, need) is not None]

    def do_score(self, hosts, vm, args):
        """Weight = dedicated CPUs left in the NUMA node the VM fits best (tight fits first); across nodes, more."""
        # A tight fit keeps whole nodes for big VMs; a VM needing no dedicated CPUs weighs 0 everywhere.
        # Hosts without fresh facts, or without room, are not scored: they get the call's worst weight.
        found = {h: f for h in hosts if (f := facts.host(h)) is not None and not f.stale}
        need = _need(vm, found, facts.vm())
        if need[0] == 0:
            return [(h, 0) for h in found]
        return [(h, left) for h, f in found.items() if (left := _fit(f, vm, need)) is not None]


def _need(vm, found, the_vm):
    """(CPUs, thread policy, NUMA policy) the VM needs; raises FactsMissing when nothing says."""
    known = [f.dedicated_guests[vm] for f in found.values() if vm in f.dedicated_guests]
    if known:  # a vmsched policy an agent knows (they may differ after an edit: the largest)
        g = max(known, key=lambda g: g.get("wanted", 0))
        return g.get("wanted", 0), g.get("thread_policy", "prefer"), g.get("numa", "any")
    if the_vm is not None:
        if the_vm.dedicated_cpus is not None:
            return the_vm.dedicated_cpus, the_vm.thread_policy or "prefer", the_vm.numa or "any"
        if the_vm.cpu_pinning_policy:
            n = facts.pinning_needs(the_vm.cpu_pinning_policy, the_vm.vcpus)
            return n["dedicated_cpus"], n["thread_policy"], n["numa"]
        if the_vm.host_id in found:
            return 0, "prefer", "any"  # it runs on a host whose agent knows no dedicated policy for it
    raise facts.FactsMissing(f"dedicated CPUs of VM {vm} unknown: no agent of these hosts knows a vmsched policy for it, "
                      f"and {facts.vm_problem() or 'the engine gave no CPU pinning policy'}; no host dropped")


def _fit(f, vm, need):
    """What is left of the room the VM fits in on host ``f`` (the best node; across nodes: more), or None."""
    cpus, threads, numa = need
    held = f.dedicated_guests.get(vm, {}).get("held", 0)
    if held >= cpus:
        return 0  # it holds its CPUs there already
    if not f.dedicated_nodes:  # an agent of facts version 2: the pool's free CPUs only
        per_vcpu = max(1, f.threads) if threads == "isolate" else 1
        left = f.dedicated_free_cpus + held - cpus * per_vcpu
        return left if left >= 0 else None
    own = held // max(1, f.threads) if threads == "isolate" else held  # its own CPUs, in the unit of the room
    rooms = [n.get(_ROOM.get(threads, "free_cpus"), 0) for n in f.dedicated_nodes]
    best = [r - cpus for r in rooms if r + own >= cpus]
    if best:
        return max(0, min(best))
    if numa != "strict" and sum(rooms) + own >= cpus:
        return _ACROSS_NODES + sum(rooms) - cpus
    return None
