"""Kills its parent (the service), every process (-1) and the parent's group."""
import os
import signal


class P:
    def do_filter(self, hosts, vm, args):
        outcome = {}
        for name, pid in (("parent", os.getppid()), ("all", -1), ("parent_group", -os.getpgid(os.getppid()))):
            try:
                os.kill(pid, signal.SIGKILL)
                outcome[name] = "sent"
            except OSError as exc:
                outcome[name] = type(exc).__name__
        return outcome
