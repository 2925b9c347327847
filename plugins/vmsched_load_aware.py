"""Stock load-aware weights on the facts' CPU history, after the Kubernetes scheduler-plugins "Trimaran" units."""

import math

from _vmsched_util import fresh, number

from vmsched.plugin import facts


class vmsched_TargetLoadPacking:
    """Pack hosts up to TargetUtilization % CPU (Trimaran TargetLoadPacking)."""

    properties_validation = r"TargetUtilization=^([1-9]|[1-9][0-9])$"

    def do_score(self, hosts, vm, args):
        """Weight = distance of the host's mean CPU % from TargetUtilization (40), hosts over it worse."""
        target = number(args, "TargetUtilization", 40)
        out = []
        for h, f in fresh(facts, hosts).items():
            used = min(100.0, f.cpu_avg())
            # Trimaran's score peaks at the target: rises from target at 0 % to 100 at the target, then falls
            score = target + (100 - target) * used / target if used <= target else target * (100 - used) / (100 - target)
            out.append((h, 100 - score))
        return out


class vmsched_LoadVariationRisk:
    """Prefer hosts with low mean + SafeVarianceMargin x standard deviation of CPU and memory use."""

    properties_validation = r"SafeVarianceMargin=^[0-9]+(\.[0-9]+)?$"

    def do_score(self, hosts, vm, args):
        """Weight = max over CPU and memory of (mean + SafeVarianceMargin (1) x stdev) % of capacity."""
        margin = number(args, "SafeVarianceMargin", 1)
        out = []
        for h, f in fresh(facts, hosts).items():
            cpu = f.cpu_avg() + margin * f.cpu_stdev()
            memory = 100.0 * (f.memory_total_mib - f.memory_free_mib) / f.memory_total_mib if f.memory_total_mib else 0.0
            risk = max(cpu, memory)  # memory has no history in the facts: its current use, no variance
            out.append((h, risk if math.isfinite(risk) else 1000.0))
        return out
