"""Returns what it can see of credentials: its environment, its parent's environ and cmdline."""
import os


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError as exc:
        return f"refused: {type(exc).__name__}"


class P:
    def do_filter(self, hosts, vm, args):
        ppid = os.getppid()
        return {"environ": dict(os.environ), "parent_environ": _read(f"/proc/{ppid}/environ"),
                "parent_cmdline": _read(f"/proc/{ppid}/cmdline")}
