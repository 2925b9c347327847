"""Returns its own /proc/self/status fields and resource limits."""
import os
import resource


class P:
    def do_filter(self, hosts, vm, args):
        fields = {}
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        limits = {name: resource.getrlimit(getattr(resource, name))[0] for name in ("RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_NOFILE")}
        return {"status": fields, "limits": limits, "uid": os.getuid(), "cwd": os.getcwd()}
