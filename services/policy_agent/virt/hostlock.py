"""One agent per libvirtd: a lock keyed by the machine, visible to every agent on the host.

Two agents on one libvirtd both manage every guest and re-pin each other's
guests. The lock is a file ``agent-<machine>.lock`` in a fixed host folder
beside libvirt's runtime directory (``/run/libvirt/vmsched``), whatever the
agent's state directory, user or container, taken with ``flock`` (released by
the kernel when the holder dies, so a stale file never blocks). It holds a
JSON description of its holder, which the refused agent prints.

A driver that lives inside the agent's process (libvirt's test driver,
``test:///default`` or ``test:///PATH``: every process has its own) has no
shared libvirtd to guard: its lock is keyed to the process too, so agents in
separate processes never refuse each other, while two agents in one process
(which share that driver) still do.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import time
from pathlib import Path

from ..errors import AgentError

DEFAULT_LOCK_DIR = Path("/run/libvirt/vmsched")
ENV = "VMSCHED_AGENT_LOCK_DIR"
HOLDER_BYTES = 4096  # the largest holder description read from a lock file (one line of JSON, well under 1 KiB)


class HostLocked(AgentError):
    """Another agent already manages this libvirtd (code internal, as every AgentError)."""


class HostLock:
    def __init__(self, lock_dir: Path, machine: str, uri: str = ""):
        # a driver inside the calling process (the test driver): keyed to this process, removed again on release
        self.private = uri.partition(":")[0].lower() == "test"
        key = f"{machine}-pid{os.getpid()}" if self.private else machine
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:200] or "unknown"
        self.path = Path(lock_dir) / f"agent-{safe}.lock"
        self.machine = machine
        self._fd: int | None = None

    def acquire(self, holder: dict) -> None:
        """Take the lock or raise HostLocked naming the agent that holds it (or AgentError when impossible)."""
        try:
            self.path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except PermissionError:  # created by an agent running as another user: flock needs no write access
                fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise AgentError(f"cannot open the host lock {self.path}: {exc.strerror} (the folder is set with"
                             f" --lock-dir or {ENV}; every agent on this host must use the same one)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise AgentError(f"cannot lock {self.path}: {exc.strerror}") from None
            raise HostLocked(self._refusal()) from None
        self._fd = fd
        info = {**holder, "pid": os.getpid(), "hostname": socket.gethostname(), "machine": self.machine,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "started_at": time.time()}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)
        except OSError:
            pass  # opened read-only (another user's file): the lock still holds, the description is stale

    def _refusal(self) -> str:
        info = self._holder()
        who = ", ".join(f"{k} {info[k]}" for k in ("pid", "host_id", "state_dir", "uri", "started") if info.get(k))
        return (f"another vmsched agent already manages the libvirtd of this machine ({self.machine}):"
                f" {who or 'holder unknown'} (lock {self.path}). Two agents on one libvirtd would re-pin each"
                " other's guests; stop the other agent first")

    def _holder(self) -> dict:
        """The holder's description in the lock file; {} when it is not one. At most HOLDER_BYTES are read,
        without blocking, whatever is at the path."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                raw = os.read(fd, HOLDER_BYTES + 1)
            finally:
                os.close(fd)
            info = json.loads(raw) if len(raw) <= HOLDER_BYTES else None
        except (OSError, ValueError, RecursionError):
            info = None
        return info if isinstance(info, dict) else {}

    def release(self) -> None:
        if self._fd is not None:
            try:
                if self.private:
                    self.path.unlink(missing_ok=True)  # nobody else opens this process's lock
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None
