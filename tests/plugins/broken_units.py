"""Units that misbehave in every way a plugin can."""

import os
import sys
import time


class Raises:
    """Raises an exception."""

    def do_filter(self, hosts, vm, args):
        raise ValueError("no hosts for you")


class Hangs:
    """Never returns."""

    def do_filter(self, hosts, vm, args):
        time.sleep(3600)


class Crashes:
    """Kills its interpreter."""

    def do_filter(self, hosts, vm, args):
        os._exit(3)


class Exits:
    """Calls sys.exit."""

    def do_score(self, hosts, vm, args):
        sys.exit(1)


class Garbage:
    """Prints something that is not a Python literal."""

    def do_filter(self, hosts, vm, args):
        print("this is not a list <<<")


class Floods:
    """Floods stdout."""

    def do_filter(self, hosts, vm, args):
        while True:
            sys.stdout.write("x" * 65536)


class WrongShape:
    """Returns a dict where a list is expected."""

    def do_score(self, hosts, vm, args):
        return {"a": 1}


class BalanceHangs:
    """A balancer that never answers."""

    def do_balance(self, hosts, args):
        time.sleep(3600)


class BadValidation:
    properties_validation = "{ key = ( }"

    def do_filter(self, hosts, vm, args):
        """Its validation string cannot be made valid (the regex does not compile)."""
        return hosts
