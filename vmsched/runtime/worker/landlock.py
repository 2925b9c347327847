"""Landlock for the plugin worker: a filesystem, TCP and scope sandbox, via ctypes.

Standard library only (the worker imports it). Landlock needs Linux >= 5.13
and the ``landlock`` LSM enabled; what each ABI version adds:

- 1 (5.13): file-system rights; 2 (5.19): REFER; 3 (6.2): TRUNCATE;
- 4 (6.7): TCP bind/connect; 5 (6.10): IOCTL_DEV;
- 6 (6.12): scopes: signals and abstract UNIX sockets limited to the domain.

A ruleset restricts the calling thread and everything it starts afterwards,
so :func:`restrict` must run before the worker starts any thread.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH, _RULE_NET_PORT = 1, 2

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_ALL_FS_V1 = (1 << 13) - 1  # EXECUTE .. MAKE_SYM
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the only rights a rule on a file may hold
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = READ_FILE | READ_DIR | EXECUTE


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(number: int, *args: object) -> int:
    result = _libc.syscall(ctypes.c_long(number), *args)
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return int(result)


def abi_version() -> int:
    """The kernel's Landlock ABI (0: no Landlock: kernel < 5.13, or not enabled)."""
    try:
        return _syscall(SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    except OSError:
        return 0


@dataclass(frozen=True)
class Result:
    abi: int
    network_denied: bool  # TCP bind/connect handled with no rule (ABI >= 4)
    signals_scoped: bool  # signals only within the domain (ABI >= 6)


def restrict(read: Iterable[str], write: Iterable[str], deny_tcp: bool) -> Result:
    """Confine this thread (and later threads, children) to ``read`` and ``write`` paths.

    ``read`` paths get read and execute rights, ``write`` paths every right;
    a path that does not exist is skipped. Raises OSError without Landlock.
    Requires no_new_privs (or CAP_SYS_ADMIN) to be set already.
    """
    abi = abi_version()
    if abi < 1:
        raise OSError("Landlock is not available (Linux < 5.13, or the LSM is not enabled)")
    handled = _ALL_FS_V1
    if abi >= 2:
        handled |= REFER
    if abi >= 3:
        handled |= TRUNCATE
    if abi >= 5:
        handled |= IOCTL_DEV
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4 and deny_tcp:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = _syscall(SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    try:
        for path in dict.fromkeys(read):
            _add(ruleset, path, READ & handled)
        for path in dict.fromkeys(write):
            _add(ruleset, path, handled)
        _syscall(SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0))
    finally:
        os.close(ruleset)
    return Result(abi=abi, network_denied=bool(attr.handled_access_net), signals_scoped=abi >= 6)


def _add(ruleset: int, path: str, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # absent paths grant nothing
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= FILE_RIGHTS
        rule = _PathBeneath(allowed_access=rights, parent_fd=fd)
        _syscall(SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), ctypes.c_uint32(0))
    finally:
        os.close(fd)
