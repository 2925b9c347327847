"""This plugin file cannot be imported."""

import module_that_does_not_exist  # noqa: F401


class NeverSeen:
    def do_filter(self, hosts, vm, args):
        return hosts
