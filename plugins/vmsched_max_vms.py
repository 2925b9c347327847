"""Stock filter: a cap on running guests per host (the old proxy's max_vm_filter sample)."""

from _vmsched_util import number

from vmsched.plugin import facts


class vmsched_MaxVms:
    """Drop hosts that run MaxVmCount guests or more."""

    properties_validation = r"MaxVmCount=^[0-9]+$"

    def do_filter(self, hosts, vm, args):
        """Drop hosts that run MaxVmCount (100) guests or more."""
        # Hosts without fresh facts are kept.
        cap = number(args, "MaxVmCount", 100)
        return [h for h in hosts if (f := facts.host(h)) is None or f.stale or f.guests_running < cap]
