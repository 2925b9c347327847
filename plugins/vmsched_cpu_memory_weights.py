"""Stock weights from oVirt: CPU and memory, even distribution and power saving (lower is better)."""

from _vmsched_util import fresh, number

from vmsched.plugin import facts


def _cpu(f, args):
    """Mean CPU % over the last CpuOverCommitDurationMinutes (2); the last interval's without history."""
    return f.cpu_avg(60 * number(args, "CpuOverCommitDurationMinutes", 2))


class vmsched_CpuEvenDistribution:
    """Prefer the hosts with the lowest CPU load."""

    properties_validation = r"CpuOverCommitDurationMinutes=^([1-9][0-9]*)$"

    def do_score(self, hosts, vm, args):
        """Weight = recent CPU use %; the least loaded host is best."""
        return [(h, _cpu(f, args)) for h, f in fresh(facts, hosts).items()]


class vmsched_CpuPowerSaving:
    """Pack VMs on the busiest hosts that stay under HighUtilization."""

    properties_validation = r"HighUtilization=^([5-9][0-9])$;CpuOverCommitDurationMinutes=^([1-9][0-9]*)$"

    def do_score(self, hosts, vm, args):
        """Weight = HighUtilization (80) - CPU use %: busiest host under it is best; over it, worst."""
        high = number(args, "HighUtilization", 80)
        out = []
        for h, f in fresh(facts, hosts).items():
            cpu = _cpu(f, args)
            out.append((h, high - cpu if cpu < high else 1000 + cpu))
        return out


class vmsched_MemoryEvenDistribution:
    """Prefer the hosts with the most free memory."""

    def do_score(self, hosts, vm, args):
        """Weight = -free memory (MiB): the host with the most free memory is best."""
        return [(h, -f.memory_free_mib) for h, f in fresh(facts, hosts).items()]


class vmsched_MemoryPowerSaving:
    """Pack VMs on the hosts with the least free memory that keep MaxFreeMemoryForOverUtilized free."""

    properties_validation = r"MaxFreeMemoryForOverUtilized=^[0-9]+$"

    def do_score(self, hosts, vm, args):
        """Weight = free memory (MiB): the fullest host is best; under MaxFreeMemoryForOverUtilized, worst."""
        floor = number(args, "MaxFreeMemoryForOverUtilized", 0)
        out = []
        for h, f in fresh(facts, hosts).items():
            free = f.memory_free_mib
            out.append((h, free if free >= floor else 10**9 - free))
        return out
