"""Writes a new plugin file into its plugins folder (its working directory)."""


class P:
    def do_filter(self, hosts, vm, args):
        with open("planted.py", "w") as f:
            f.write("class Planted:\n    def do_filter(self, hosts, vm, args):\n        return hosts\n")
        return hosts
