"""The in-flight journal: which requests a service process was handling, read again after it died.

Each handler thread owns one fixed-size record of a small file in the service's runtime
directory (systemd ``RuntimeDirectory=`` kept across restarts, a Helm ``emptyDir``, else a
private directory under the temporary directory). A thread writes the request's ID into its
record when it starts handling it and blanks the record when the reply is out: two ``pwrite``
calls per request, no ``fsync`` (the page cache outlives a killed process; a host crash is
not a poisoned request). The process holds an exclusive ``flock`` on its file, so replicas
sharing a directory each take their own; a restarted replica takes the file its dead
predecessor left and reads it before starting: what it finds was being handled when that
process died (docs/reliability.md, "Poison requests").
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
import stat
import tempfile
from pathlib import Path

log = logging.getLogger("vmsched.bus")

RECORD = 128  # bytes per handler thread: a kind byte, the request ID, padding, a newline
_ID_MAX = RECORD - 2
_BLANK = b" " * (RECORD - 1) + b"\n"
_FILES = 64  # journal files tried per service name (replicas sharing one directory)

#: Kinds of record: a first run, or a second-chance run of a request that was in a dead process.
FIRST, SECOND = b"F", b"S"


def default_dir() -> Path:
    """systemd's ``$RUNTIME_DIRECTORY`` when set, else ``vmsched-<uid>`` in the temporary directory."""
    runtime = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return Path(runtime) if runtime else Path(tempfile.gettempdir()) / f"vmsched-{os.geteuid()}"


class Journal:
    """One process's journal file. ``blame`` tells what its predecessor was handling when it died."""

    def __init__(self, directory: Path, name: str, slots: int) -> None:
        _private_dir(directory)
        for n in range(_FILES):
            path = directory / f"{name}-{n}.journal"
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # another live replica's
            self.path, self._fd = path, fd
            # this process's journal among all replicas': host and file
            self.identity = f"{socket.gethostname()}:{path}"
            break
        else:
            raise OSError(f"all {_FILES} journal files of {name} in {directory} are taken by live processes")
        #: request ID -> (kind, alone): what the dead predecessor was handling, and whether nothing else was
        self.found: dict[str, tuple[bytes, bool]] = _parse(os.pread(self._fd, 1 << 20, 0))
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, _BLANK * slots, 0)
        if self.found:
            log.warning("%s: the previous process died handling %s (journal %s): not run here again",
                        name, ", ".join(self.found), self.path)

    def begin(self, slot: int, request_id: str, kind: bytes = FIRST) -> None:
        record = kind + request_id.encode()[:_ID_MAX]
        os.pwrite(self._fd, record + b" " * (RECORD - 1 - len(record)) + b"\n", slot * RECORD)

    def end(self, slot: int) -> None:
        os.pwrite(self._fd, _BLANK, slot * RECORD)

    def blame(self, request_id: str | None) -> tuple[bytes, bool] | None:
        """(kind, alone) when the predecessor died handling ``request_id``, else None."""
        return self.found.get(request_id) if request_id else None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock; the file stays for the next process
            self._fd = -1


def _parse(data: bytes) -> dict[str, tuple[bytes, bool]]:
    entries = []
    for i in range(0, len(data) - RECORD + 1, RECORD):
        record = data[i: i + RECORD].rstrip()
        if record[:1] in (FIRST, SECOND) and len(record) > 1:
            entries.append((record[1:].decode(errors="replace"), record[:1]))
    return {rid: (kind, len(entries) == 1) for rid, kind in entries}


def _private_dir(directory: Path) -> None:
    """Create ``directory`` (0700) or check that it is ours and not writable by others."""
    for path in (directory.parent, directory):
        path.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(f"{directory} is not a directory of this user writable only by it")
