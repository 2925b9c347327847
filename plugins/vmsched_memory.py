"""Stock filter: enough free memory for the VM (oVirt's Memory filter, on host facts)."""

from _vmsched_util import number

from vmsched.plugin import facts


class vmsched_Memory:
    """Keep hosts whose free memory minus a reserve covers the VM's memory plus an overhead."""

    # oVirt's defaults: 321 MiB reserved for the host, 65 MiB guest overhead.
    properties_validation = r"HostReservedMemoryMiB=^[0-9]+$;GuestOverheadMiB=^[0-9]+$"

    def do_filter(self, hosts, vm, args):
        """Keep hosts whose free memory, less HostReservedMemoryMiB and fresh placements, fits VM + GuestOverheadMiB."""
        # The description the engine shows: one line. Fresh placements: the VMs vmsched placed there moments ago
        # that the facts do not show yet; defaults 321 and 65 MiB.
        # Free memory is oVirt's: MemFree + Cached + Buffers + SReclaimable. Hosts without fresh facts,
        # or a VM of unknown size, are kept: the engine's own memory filter still applies. Pending
        # placements: docs/stock-units.md ("Pending placements").
        the_vm = facts.vm()
        if the_vm is None or the_vm.memory_mib <= 0:
            return hosts
        reserve = number(args, "HostReservedMemoryMiB", 321)
        overhead = number(args, "GuestOverheadMiB", 65)
        need = the_vm.memory_mib + overhead
        dropped = {}  # {host: reason} for the hosts dropped: the others are kept (docs/plugins.md)
        for h in hosts:
            f = facts.host(h)
            if f is None or f.stale or h == the_vm.host_id:
                continue
            free = f.memory_free_mib - _taken(h, reserve, overhead)
            if free < need:
                dropped[h] = "free %s < %s needed" % _sizes(free, need)
        return dropped


def _sizes(free, need):
    """Both in GiB with one decimal, or in MiB when that would read "4.1 GiB < 4.1 GiB"."""
    free_gib, need_gib = f"{free / 1024:.1f} GiB", f"{need / 1024:.1f} GiB"
    if free_gib == need_gib or abs(free) < 1024:
        return f"{free:.0f} MiB", f"{need:.0f} MiB"
    return free_gib, need_gib


def _taken(host, reserve, overhead):
    """The host's reserve plus the VMs vmsched placed there moments ago, with their overhead (pending memory)."""
    return reserve + sum(mib + overhead for mib in facts.pending(host))
