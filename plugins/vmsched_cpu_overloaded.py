"""Stock filter: no host whose CPU has been overloaded for a while (oVirt's CPU-overload rule)."""

from _vmsched_util import number

from vmsched.plugin import facts


class vmsched_CpuOverloaded:
    """Drop hosts whose CPU load has been above HighUtilization for CpuOverCommitDurationMinutes."""

    properties_validation = r"HighUtilization=^([5-9][0-9])$;CpuOverCommitDurationMinutes=^([1-9][0-9]*)$"

    def do_filter(self, hosts, vm, args):
        """Drop hosts above HighUtilization % CPU (80) for CpuOverCommitDurationMinutes (2) or longer."""
        # From the facts' CPU history; hosts without fresh facts are kept.
        high = number(args, "HighUtilization", 80)
        seconds = 60 * number(args, "CpuOverCommitDurationMinutes", 2)
        return [h for h in hosts if (f := facts.host(h)) is None or f.stale or f.cpu_above_for(high) < seconds]
