"""Stock filter: keep VMs on (or off) hosts named in the cluster policy's properties."""

from _vmsched_util import id_list

ID_LIST = r"^[0-9a-fA-F-]*(\s*,\s*[0-9a-fA-F-]+)*\s*$"


class HostAllowDeny:
    """Keep only the hosts in allowed_hosts (when set) and drop the hosts in denied_hosts.

    Properties (comma-separated host UUIDs): allowed_hosts, denied_hosts.
    Empty or absent properties change nothing.
    """

    properties_validation = f"allowed_hosts={ID_LIST};denied_hosts={ID_LIST}"

    def do_filter(self, hosts, vm, args):
        """Keep hosts listed in allowed_hosts (if set), drop hosts listed in denied_hosts."""
        allowed = id_list(args.get("allowed_hosts"))
        denied = id_list(args.get("denied_hosts"))
        return [h for h in hosts if (not allowed or h.lower() in allowed) and h.lower() not in denied]
