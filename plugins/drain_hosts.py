"""Stock balancer: move one VM away from hosts being drained."""

from _vmsched_util import id_list

UUID = r"^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})?$"
ID_LIST = r"^[0-9a-fA-F-]*(\s*,\s*[0-9a-fA-F-]+)*\s*$"


class DrainHosts:
    """Propose migrating drain_vm to any host of the cluster not listed in drain_hosts.

    Properties: drain_vm (a VM UUID; empty means nothing to do) and drain_hosts
    (comma-separated host UUIDs the VM must leave). With no destination left,
    no migration is proposed.
    """

    properties_validation = f"drain_vm={UUID};drain_hosts={ID_LIST}"

    def do_balance(self, hosts, args):
        """Move drain_vm off the hosts listed in drain_hosts."""
        vm = (args.get("drain_vm") or "").strip()
        draining = id_list(args.get("drain_hosts"))
        targets = [h for h in hosts if h.lower() not in draining]
        if not vm or not targets:
            return ("", [])
        return (vm, targets)
