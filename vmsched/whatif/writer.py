"""Writing a recording: off the request path, bounded in memory and on disk, never failing a call.

The request path only appends an item (:mod:`.format`'s :class:`~.format.CallItem` or
:class:`~.format.InputsItem`) to a bounded queue. A writer thread, every :data:`PAUSE` seconds, makes the waiting
items into lines and writes them as one gzip member (``zcat FILE | jq`` reads the files; a member cut by a crash
is the one torn record a reader skips). Files (mode 0600, in a folder of mode 0700) rotate at a quarter of
``max_bytes``; the oldest files of the folder not held by a writer are deleted while the folder holds more.

When the queue is full or a write fails (a full disk), records are dropped and counted
(``vmsched_record_dropped_total{reason}``); one log line says the recording stopped and why, another when it
resumes. A failed write is cut back from the file, so a later member follows whole ones.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import socket
import threading
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Protocol

from prometheus_client import Counter

from vmsched.config import Settings
from vmsched.metrics import REGISTRY
from vmsched.whatif.format import FileState, header

log = logging.getLogger("vmsched.record")

RECORDED = Counter("vmsched_recorded_total", "Records written to the recording folder (--record)", registry=REGISTRY)
DROPPED = Counter("vmsched_record_dropped_total", "Records not written to the recording folder, by reason "
                  "(queue_full: the writer was behind; write_error: e.g. a full disk; encode_error)",
                  ["reason"], registry=REGISTRY)
_REASONS = ("queue_full", "write_error", "encode_error")
for _reason in _REASONS:
    DROPPED.labels(_reason)  # every series at 0 from start-up (docs/deploy/monitoring.md)

#: seconds between two writes (one gzip member each)
PAUSE = 0.25
#: items waiting for the writer at most; more are dropped
QUEUE = 2000
#: after a failed write, seconds before the next try (the records meanwhile are dropped)
RETRY = 2.0
#: the smallest file before rotation, bytes
MIN_FILE = 1 << 20
SUFFIX = ".jsonl.gz"
_LEVEL = 1  # fastest: three times the speed of 6 for 1.5 times the bytes (bench/bench_replay.py --facts)


def record_writer(settings: Settings, label: str) -> RecordWriter | None:
    """The recording of a process labelled ``label`` (``--record``, ``--record-max-mb``), or None; not started."""
    if settings.record is None:
        return None
    return RecordWriter(settings.record, f"{label}-{socket.gethostname()}", settings.record_max_mb << 20)


class Item(Protocol):
    def encode(self, state: FileState) -> bytes: ...


def private_folder(folder: Path) -> Path:
    """``folder``, made if need be, mode 0700; ValueError with what to do when that is impossible."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
    except OSError as exc:
        raise ValueError(f"--record {folder}: cannot make it a private folder ({exc.strerror or exc}): "
                         "give a folder this user owns") from None
    return folder


def recording_files(folder: Path) -> list[Path]:
    """The recording files of a folder, oldest first (by modification time, then name)."""
    found = []
    with os.scandir(folder) as entries:
        for entry in entries:
            try:
                if entry.name.endswith(SUFFIX) and entry.is_file(follow_symlinks=False):
                    found.append((entry.stat().st_mtime, entry.name))
            except OSError:  # deleted meanwhile
                continue
    return [folder / name for _, name in sorted(found)]


class RecordWriter:
    """The recording of one process: ``submit`` on the request path, the rest on its own thread."""

    def __init__(self, folder: Path, label: str, max_bytes: int, queue: int = QUEUE, pause: float = PAUSE) -> None:
        self.folder = private_folder(Path(folder))
        self.label = re.sub(r"[^A-Za-z0-9_.-]", "-", label)[:80] or "vmsched"
        self.max_bytes = max_bytes
        self.file_bytes = max(MIN_FILE, max_bytes // 4)
        self.pause = pause
        self.queue_size = queue
        self.stopped_why = ""  # not empty while records are dropped: why (logged once)
        self.dropped_since = 0  # records dropped since the recording stopped
        self._queue: deque[Item] = deque()
        self._writing = threading.Lock()
        self._flag = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._seq = 0
        self._state = FileState()
        self._retry_at = 0.0
        self._started = time.strftime("%Y%m%dT%H%M%S")
        self._dropped = {r: DROPPED.labels(r) for r in _REASONS}

    # --- the request path -----------------------------------------------------------------------------
    def submit(self, item: Item) -> None:
        """Queue ``item`` for the writer; when it is behind, drop it (counted). Never raises, never blocks."""
        if len(self._queue) >= self.queue_size:
            self._drop("queue_full", 1, f"{self.queue_size} records waited for the writer (the disk is too slow)")
            return
        self._queue.append(item)

    # --- the writer thread ----------------------------------------------------------------------------
    def start(self) -> RecordWriter:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"record-{self.label}", daemon=True)
            self._thread.start()
            log.info("recording the engine's calls to %s (at most %d MiB)", self.folder, self.max_bytes >> 20)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        self.flush()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _run(self) -> None:
        while not self._stop.wait(self.pause):
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the writer thread must outlive a bug, the calls never see it
                log.exception("recording: writing failed")

    def flush(self) -> None:
        """Write what waits now, as one gzip member (tests, shutdown, the writer's thread)."""
        with self._writing:
            items = [self._queue.popleft() for _ in range(len(self._queue))]
            if not items:
                return
            if self.stopped_why and time.monotonic() < self._retry_at:
                self._drop("write_error", len(items), self.stopped_why)
                return
            if self._fd is not None and self._size >= self.file_bytes:
                self._close()
            lines = [header(self.label, os.getpid(), socket.gethostname(), time.time())] if self._size == 0 else []
            encoded = 0
            for item in items:
                try:
                    lines.append(item.encode(self._state))
                    encoded += 1
                except Exception:  # noqa: BLE001 - one bad record must not stop the others
                    log.exception("recording: a record could not be made")
                    self._dropped["encode_error"].inc()
            self._write(b"".join(lines), encoded)

    def _write(self, data: bytes, count: int) -> None:
        if count == 0:
            return
        z = zlib.compressobj(_LEVEL, zlib.DEFLATED, 31)  # 31: a gzip member
        member = z.compress(data) + z.flush()
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            view = memoryview(member)
            while view:
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self._failed(exc, count)
            return
        self._size += len(member)
        RECORDED.inc(count)
        if self.stopped_why:
            self._resume()

    def _failed(self, exc: OSError, count: int) -> None:
        """Cut the member back from the file (or leave the file: the next write starts another)."""
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, self._size)
            except OSError:
                self._close()
        self._state = FileState()  # the cut member may have held host facts: write them again
        if self._size == 0 and self._fd is not None:  # nothing but the cut member: no file at all
            self._close()
            if self._path is not None:
                self._path.unlink(missing_ok=True)
        self._retry_at = time.monotonic() + RETRY
        why = errno.errorcode.get(exc.errno or 0, "")
        self._drop("write_error", count, f"writing {self._path or self.folder} failed: {exc.strerror or exc}"
                                         + (f" ({why})" if why else ""))

    def _drop(self, reason: str, count: int, why: str) -> None:
        self._dropped[reason].inc(count)
        with self._flag:
            self.dropped_since += count
            if self.stopped_why:
                return
            self.stopped_why = why
        log.warning("recording to %s stopped: %s; records are dropped (vmsched_record_dropped_total) until it "
                    "resumes", self.folder, why)

    def _resume(self) -> None:
        with self._flag:
            dropped, self.dropped_since, self.stopped_why = self.dropped_since, 0, ""
        log.warning("recording to %s resumed (%d records were dropped)", self.folder, dropped)

    # --- files --------------------------------------------------------------------------------------------
    def _open(self) -> None:
        self._seq += 1
        path = self.folder / f"{self.label}-{self._started}-{os.getpid()}-{self._seq:04d}{SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held while written: no writer deletes it
        os.fchmod(fd, 0o600)
        self._fd, self._path, self._size, self._state = fd, path, 0, FileState()
        self._trim()

    def _close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd, self._size, self._state = None, 0, FileState()

    def _trim(self) -> None:
        """Delete the folder's oldest files not being written while it holds more than ``max_bytes`` less
        the room of the new file."""
        files = recording_files(self.folder)
        sizes = {p: _size(p) for p in files}
        total = sum(sizes.values())
        for path in files:
            if total + self.file_bytes <= self.max_bytes or path == self._path:
                break
            if _in_use(path):
                continue
            try:
                path.unlink()
            except OSError:
                continue
            total -= sizes.get(path, 0)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _in_use(path: Path) -> bool:
    """Another writer holds ``path`` open (its lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
