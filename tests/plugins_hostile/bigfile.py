"""Writes a file larger than RLIMIT_FSIZE into its private temporary directory."""
import os
import tempfile


class P:
    def do_filter(self, hosts, vm, args):
        path = os.path.join(tempfile.gettempdir(), "big")
        try:
            with open(path, "wb") as f:
                for _ in range(args["mb"] + 1):
                    f.write(b"x" * (1 << 20))
        except OSError as exc:
            return {"error": type(exc).__name__, "errno": exc.errno, "size": os.path.getsize(path)}
        return {"error": None, "size": os.path.getsize(path)}
