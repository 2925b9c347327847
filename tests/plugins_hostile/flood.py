"""Writes 8 MiB straight to fd 1 and fd 2, past sys.stdout."""
import os


class P:
    def do_filter(self, hosts, vm, args):
        chunk = b"FLOOD-MARKER " * 8192
        for fd in (1, 2):
            left = 8 << 20
            while left > 0:
                left -= os.write(fd, chunk[:left])
        return hosts
