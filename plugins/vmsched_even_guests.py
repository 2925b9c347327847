"""Stock weight and balancer: the same number of guests on every host (oVirt's even guest distribution)."""

from _vmsched_util import fresh, guests_with_pending, movable, number

from vmsched.plugin import facts


class vmsched_EvenGuestDistribution:
    """Spread guests evenly: fewer running guests is better."""

    properties_validation = r"HighVmCount=^([0-9]|[1-9][0-9]+)$;MigrationThreshold=^([2-9]|[1-9][0-9]+)$"

    def do_score(self, hosts, vm, args):
        """Weight = running guests on the host, with the VMs placed there moments ago; fewer is better."""
        # Hosts without fresh facts are not scored, so they get the call's worst weight (docs/plugins.md).
        return [(h, guests_with_pending(facts, h, f)) for h, f in fresh(facts, hosts).items()]

    def do_balance(self, hosts, args):
        """Move a guest off a host with over HighVmCount (10) guests to hosts MigrationThreshold (5) emptier."""
        # Destinations stay at or under HighVmCount after the move. Never a guest with dedicated CPUs or a
        # vmsched CPU policy; hosts without fresh facts are neither sources nor destinations.
        high = number(args, "HighVmCount", 10)
        threshold = number(args, "MigrationThreshold", 5)
        counts = {h: f.guests_running for h, f in fresh(facts, hosts).items()}
        if not counts:
            return "", []
        source = max(counts, key=lambda h: counts[h])
        if counts[source] <= high:
            return "", []
        targets = sorted((h for h in counts if h != source and counts[h] + 1 <= high
                          and counts[source] - counts[h] >= threshold), key=lambda h: counts[h])
        guests = movable(facts.host(source))
        if not targets or not guests:
            return "", []
        guest = min(guests, key=lambda g: (g.memory_mib, g.uuid))  # the cheapest to migrate
        return guest.uuid, targets
