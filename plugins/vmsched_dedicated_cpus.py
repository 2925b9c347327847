"""Stock filter: room in the agent's dedicated CPU pool for a VM that needs dedicated CPUs."""

from vmsched.plugin import facts

# oVirt's CPU pinning policies that give each vCPU a pCPU of its own (engine link: VM.cpu_pinning_policy)
_PER_VCPU = "dedicated"
_PER_CORE = "isolate_threads"  # each vCPU takes a whole core: all its threads


class vmsched_DedicatedCpus:
    """Keep hosts whose dedicated CPU pool has the CPUs the VM needs free."""

    def do_filter(self, hosts, vm, args):
        """Keep hosts whose agent has as many free dedicated CPUs as the VM needs (its vmsched policy, or the
        engine's dedicated pinning policy); a VM of unknown need is an error and drops no host."""
        # Hosts without fresh facts are kept; the VM's own CPUs on a host count as free there.
        the_vm = facts.vm()
        found = {h: f for h in hosts if (f := facts.host(h)) is not None}
        need = _need(vm, found, the_vm)
        if need is None:
            raise facts.FactsMissing(f"dedicated CPUs of VM {vm} unknown: no agent of these hosts knows a vmsched "
                              f"policy for it, and {facts.vm_problem() or 'the engine gave no CPU pinning policy'}"
                              "; no host dropped")
        kept = []
        for h in hosts:
            f = found.get(h)
            wanted = need(f) if callable(need) else need
            if f is None or f.stale or f.dedicated_free_cpus is None or wanted == 0:
                kept.append(h)
                continue
            held = f.dedicated_guests.get(vm, {}).get("held", 0)
            if f.dedicated_free_cpus + held >= wanted:
                kept.append(h)
        return kept


def _need(vm, found, the_vm):
    """The CPUs the VM needs (an int, or a function of the host), or None when unknown."""
    wanted = [f.dedicated_guests[vm].get("wanted", 0) for f in found.values() if vm in f.dedicated_guests]
    if wanted:
        return max(wanted)  # a vmsched policy an agent knows (they may differ after an edit: the larger)
    if the_vm is None:
        return None
    known = getattr(the_vm, "dedicated_cpus", None)
    if known is not None:
        return known
    pinning = getattr(the_vm, "cpu_pinning_policy", "") or ""
    if pinning == _PER_VCPU:
        return the_vm.vcpus
    if pinning == _PER_CORE:
        return lambda f: the_vm.vcpus * max(1, f.threads if f is not None else 1)
    if pinning:
        return 0  # none, manual, resize_and_pin_numa: no CPUs from the pool
    if the_vm.host_id in found:
        return 0  # it runs on a host whose agent knows no dedicated policy for it
    return None
