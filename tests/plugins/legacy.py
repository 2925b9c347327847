"""Units written for ovirt-scheduler-proxy: they PRINT their result."""

import sys


class LegacyFilter:
    """Old contract: print the list of kept hosts."""

    properties_validation = "{ legacy_key = ^[a-z]+$ , other : [0-9]{1,3} }"

    def do_filter(self, hosts, vm, args):
        print("debug output goes to stderr", file=sys.stderr)
        print(hosts[1:])


class LegacyScore:
    """Old contract: print (host, score) tuples."""

    def do_score(self, hosts, vm, args):
        print([(h, 5) for h in hosts])


class LegacyBalance:
    """Old contract: print (vm, hosts)."""

    def do_balance(self, hosts, args):
        print(("33333333-3333-3333-3333-333333333333", hosts))
