"""Stock score: rank hosts named in preferred_hosts first."""

from _vmsched_util import id_list

ID_LIST = r"^[0-9a-fA-F-]*(\s*,\s*[0-9a-fA-F-]+)*\s*$"


class PreferredHosts:
    """Score 0 for hosts in preferred_hosts and 100 for the others (lower is better in oVirt).

    Properties: preferred_hosts (comma-separated host UUIDs, in order of preference:
    the first gets 0, the second 1, ... so ties break in the listed order).
    """

    properties_validation = f"preferred_hosts={ID_LIST}"

    def do_score(self, hosts, vm, args):
        """Prefer the hosts listed in preferred_hosts, in the listed order."""
        preferred = id_list(args.get("preferred_hosts"))
        rank = {host: i for i, host in enumerate(preferred)}
        return [(h, rank.get(h.lower(), 100)) for h in hosts]
