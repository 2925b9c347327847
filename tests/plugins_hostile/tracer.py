"""Tries ptrace, mount, keyctl and init_module through raw system calls."""
import ctypes
import os

libc = ctypes.CDLL(None, use_errno=True)
CALLS = {"ptrace": (101, 16, os.getppid(), 0, 0), "mount": (165, 0, 0, 0, 0), "keyctl": (250, 0, 0, 0, 0),
         "init_module": (175, 0, 0, 0, 0), "kexec_load": (246, 0, 0, 0, 0)}


class P:
    def do_filter(self, hosts, vm, args):
        out = {}
        for name, (nr, *a) in CALLS.items():
            result = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(x) for x in a])
            out[name] = "ok" if result >= 0 else os.strerror(ctypes.get_errno())
        return out
