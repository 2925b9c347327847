"""Stock filter: no host that swaps too much (oVirt's Swap filter)."""

from _vmsched_util import number

from vmsched.plugin import facts


class vmsched_Swap:
    """Drop hosts whose swap use is over MaximumAllowedSwapUsage % of their memory."""

    properties_validation = r"MaximumAllowedSwapUsage=^([0-9]|[1-9][0-9]|100)$"

    def do_filter(self, hosts, vm, args):
        """Drop hosts whose used swap is over MaximumAllowedSwapUsage % (20) of their physical memory."""
        # Hosts without fresh facts are kept.
        limit = number(args, "MaximumAllowedSwapUsage", 20)
        return [h for h in hosts if (f := facts.host(h)) is None or f.stale or f.memory_total_mib <= 0
                or f.swap_used_mib * 100 <= limit * f.memory_total_mib]
