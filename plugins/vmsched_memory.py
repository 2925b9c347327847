"""Stock filter: enough free memory for the VM (oVirt's Memory filter, on host facts)."""

from _vmsched_util import number

from vmsched.plugin import facts


class vmsched_Memory:
    """Keep hosts whose free memory minus a reserve covers the VM's memory plus an overhead."""

    # oVirt's defaults: 321 MiB reserved for the host, 65 MiB guest overhead.
    properties_validation = r"HostReservedMemoryMiB=^[0-9]+$;GuestOverheadMiB=^[0-9]+$"

    def do_filter(self, hosts, vm, args):
        """Keep hosts whose free memory minus HostReservedMemoryMiB (321) covers the VM plus GuestOverheadMiB (65)."""
        # Free memory is oVirt's: MemFree + Cached + Buffers + SReclaimable. Hosts without fresh facts,
        # or a VM of unknown size, are kept: the engine's own memory filter still applies.
        the_vm = facts.vm()
        if the_vm is None or the_vm.memory_mib <= 0:
            return hosts
        reserve = number(args, "HostReservedMemoryMiB", 321)
        need = the_vm.memory_mib + number(args, "GuestOverheadMiB", 65)
        kept = []
        for h in hosts:
            f = facts.host(h)
            if f is None or f.stale or h == the_vm.host_id or f.memory_free_mib - reserve >= need:
                kept.append(h)
        return kept
