"""Stock weights and balancers from oVirt: CPU and memory, even distribution and power saving."""

from _vmsched_util import free_with_pending, fresh, movable, number

from vmsched.plugin import facts


def _cpu(f, args):
    """Mean CPU % over the last CpuOverCommitDurationMinutes (2); the last interval's without history."""
    return f.cpu_avg(60 * number(args, "CpuOverCommitDurationMinutes", 2))


def _memory_move(found, args):
    """(guest, destinations) off the host with the least free memory under MaxFreeMemoryForOverUtilized, or None."""
    if not (args.get("MaxFreeMemoryForOverUtilized") or "").strip():
        return None  # as in oVirt: memory balancing only with the threshold set
    over = number(args, "MaxFreeMemoryForOverUtilized", 0)
    under = number(args, "MinFreeMemoryForUnderUtilized", over)
    tight = [h for h, f in found.items() if f.memory_free_mib < over and movable(f)]
    if not tight:
        return None
    source = min(tight, key=lambda h: found[h].memory_free_mib)
    guest = min(movable(found[source]), key=lambda g: (g.memory_mib, g.uuid))
    # destinations: under-utilized hosts that keep MaxFreeMemoryForOverUtilized free after the move
    targets = sorted((h for h, f in found.items() if h != source and f.memory_free_mib >= under
                      and f.memory_free_mib - guest.memory_mib >= over), key=lambda h: -found[h].memory_free_mib)
    return (guest, targets) if targets else None


def _added(guest, f):
    """The guest's CPU load on host ``f``, in host % (100 when the host's CPUs are not known)."""
    return guest.cpu_pct * guest.vcpus / f.cpus if f.cpus else 100.0


def _answer(move):
    return (move[0].uuid, move[1]) if move else ("", [])


class vmsched_CpuEvenDistribution:
    """Prefer the hosts with the lowest CPU load; move guests off overloaded hosts."""

    properties_validation = (r"HighUtilization=^([5-9][0-9])$;CpuOverCommitDurationMinutes=^([1-9][0-9]*)$;"
                             r"MaxFreeMemoryForOverUtilized=^[0-9]+$;MinFreeMemoryForUnderUtilized=^[0-9]+$")

    def do_score(self, hosts, vm, args):
        """Weight = recent CPU use %; the least loaded host is best."""
        return [(h, _cpu(f, args)) for h, f in fresh(facts, hosts).items()]

    def do_balance(self, hosts, args):
        """Move the busiest guest off a host above HighUtilization (80) for CpuOverCommitDurationMinutes (2)."""
        # Destinations stay at or under HighUtilization after the move; with no CPU-overloaded host, the
        # memory rule of vmsched_MemoryEvenDistribution applies when its thresholds are set (fallback).
        high = number(args, "HighUtilization", 80)
        seconds = 60 * number(args, "CpuOverCommitDurationMinutes", 2)
        found = fresh(facts, hosts)
        hot = [h for h, f in found.items() if f.cpu_above_for(high) >= seconds and movable(f)]
        if hot:
            source = max(hot, key=lambda h: _cpu(found[h], args))
            guest = max(movable(found[source]), key=lambda g: (g.cpu_pct * g.vcpus, g.uuid))
            targets = [h for h, f in found.items() if h != source and _cpu(f, args) + _added(guest, f) <= high]
            if targets:
                return guest.uuid, sorted(targets, key=lambda h: _cpu(found[h], args))
        return _answer(_memory_move(found, args))


class vmsched_CpuPowerSaving:
    """Pack VMs on the busiest hosts that stay under HighUtilization; empty the idle ones."""

    properties_validation = (r"HighUtilization=^([5-9][0-9])$;LowUtilization=^([0-9]|[1-4][0-9])$;"
                             r"CpuOverCommitDurationMinutes=^([1-9][0-9]*)$")

    def do_balance(self, hosts, args):
        """Move a guest off a host below LowUtilization (20) for CpuOverCommitDurationMinutes (2) to busier ones."""
        # The idle host with the fewest guests is emptied first (no host power management: the admin or the
        # engine may then switch it off); destinations are not idle themselves, stay at or under
        # HighUtilization (80) after the move and keep the guest's memory free.
        high, low = number(args, "HighUtilization", 80), number(args, "LowUtilization", 20)
        seconds = 60 * number(args, "CpuOverCommitDurationMinutes", 2)
        found = fresh(facts, hosts)
        idle = [h for h, f in found.items() if f.cpu_below_for(low) >= seconds and movable(f)]
        for source in sorted(idle, key=lambda h: (len(movable(found[h])), h)):
            guest = min(movable(found[source]), key=lambda g: (g.memory_mib, g.uuid))
            targets = [h for h, f in found.items() if h not in idle and f.memory_free_mib >= guest.memory_mib
                       and _cpu(f, args) + _added(guest, f) <= high]
            if targets:
                return guest.uuid, sorted(targets, key=lambda h: -_cpu(found[h], args))  # busiest first
        return "", []

    def do_score(self, hosts, vm, args):
        """Weight = HighUtilization (80) - CPU use %: busiest host under it is best; over it, worst."""
        high = number(args, "HighUtilization", 80)
        out = []
        for h, f in fresh(facts, hosts).items():
            cpu = _cpu(f, args)
            out.append((h, high - cpu if cpu < high else 1000 + cpu))
        return out


class vmsched_MemoryEvenDistribution:
    """Prefer the hosts with the most free memory; move guests off hosts short of it."""

    properties_validation = r"MaxFreeMemoryForOverUtilized=^[0-9]+$;MinFreeMemoryForUnderUtilized=^[0-9]+$"

    def do_score(self, hosts, vm, args):
        """Weight = -free memory (MiB, less the VMs placed there moments ago): the most free memory is best."""
        return [(h, -free_with_pending(facts, h, f)) for h, f in fresh(facts, hosts).items()]

    def do_balance(self, hosts, args):
        """Move the smallest guest off the host with least free memory under MaxFreeMemoryForOverUtilized."""
        # Destinations have MinFreeMemoryForUnderUtilized free and keep MaxFreeMemoryForOverUtilized free after
        # the move. Without MaxFreeMemoryForOverUtilized set, no migration (as in oVirt).
        return _answer(_memory_move(fresh(facts, hosts), args))


class vmsched_MemoryPowerSaving:
    """Pack VMs on the hosts with the least free memory that keep MaxFreeMemoryForOverUtilized free."""

    properties_validation = r"MaxFreeMemoryForOverUtilized=^[0-9]+$"

    def do_score(self, hosts, vm, args):
        """Weight = free memory (MiB): the fullest host is best; under MaxFreeMemoryForOverUtilized, worst."""
        floor = number(args, "MaxFreeMemoryForOverUtilized", 0)
        out = []
        for h, f in fresh(facts, hosts).items():
            free = free_with_pending(facts, h, f)
            out.append((h, free if free >= floor else 10**9 - free))
        return out
