"""One plugin worker process, as the pool sees it: the process and its pipes (service side only).

Also how a worker's death is explained to the caller whose call it killed.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import time
from contextlib import suppress
from typing import Any

import orjson

from vmsched.runtime.progress import Progress
from vmsched.runtime.worker import children
from vmsched.runtime.protocol import HEADER, LONG_NUMBERS, write_all
from vmsched.runtime.types import Limits


def loads(payload: bytes) -> Any:
    """A reply frame's JSON: orjson, or the standard library where orjson would read it otherwise.

    The worker writes with the standard library (it imports nothing else), which may write what orjson
    refuses (NaN, Infinity, 1e400, lone surrogates) or reads as a float (an integer past 64 bits, which
    the worker marks: protocol.LONG_NUMBERS). Those frames are read by ``json`` as before, so every
    reply decodes to what it did. (A worker that omits the mark only changes its own unit's answer.)
    """
    if not payload.endswith(LONG_NUMBERS):
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            pass
    return json.loads(payload)


class WorkerGone(Exception):
    """The worker broke the protocol, or closed its pipe (:class:`WorkerClosed`)."""


class WorkerClosed(WorkerGone):
    """The worker closed its pipe: it exited or died."""


class Worker:
    """One worker process and the pool's ends of its two pipes."""

    def __init__(self, proc: subprocess.Popen[bytes], max_frame: int, progress: Progress) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.pid = proc.pid
        self.write_fd = proc.stdin.fileno()
        self.read_fd = proc.stdout.fileno()
        self.calls = 0
        self.tmp_dir = ""  # its private temporary directory (from its ready message)
        self.max_frame = max_frame  # largest reply frame accepted (a batch of units raises it)
        self.progress = progress  # the progress page it shares with the pool (vmsched.runtime.progress)
        self.idle_since = 0.0  # monotonic time it last went idle (the pool shrinks the longest idle)
        self._buffer = bytearray()

    def send(self, frame: bytes) -> None:
        write_all(self.write_fd, frame)

    def feed(self) -> dict[str, Any] | None:
        """Read what the pipe holds; the reply once complete, else None."""
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            raise WorkerClosed("closed its pipe")
        self._buffer += chunk
        if len(self._buffer) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self._buffer)
        if size > self.max_frame:
            raise WorkerGone(f"sent a {size}-byte frame")
        end = HEADER.size + size
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        try:
            message = loads(payload)
        except ValueError as exc:
            raise WorkerGone(f"sent a bad frame ({exc})") from None
        if not isinstance(message, dict):
            raise WorkerGone("sent a frame that is not an object")
        return message

    def receive(self, timeout: float) -> dict[str, Any]:
        """Block for one reply (start-up handshake only)."""
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        end = time.monotonic() + timeout
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no answer within {timeout:g} s")
            if poller.poll(math.ceil(remaining * 1000)):
                message = self.feed()
                if message is not None:
                    return message

    def kill(self) -> None:
        """SIGKILL the worker and whatever the plugin started in its process group.

        Also right after the worker was reaped: Linux does not reuse the id of
        a process group that still has members, and an empty group is ESRCH.
        Descendants that left the group (``setsid``) are found under /proc first.
        """
        for pid in descendants(self.pid):
            with suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with suppress(OSError):
            os.killpg(self.pid, signal.SIGKILL)
        with suppress(OSError):
            self.proc.kill()  # in case the plugin left the group

    def close_input(self) -> None:
        """Ask the worker to exit once idle (it reads end-of-file)."""
        assert self.proc.stdin is not None
        with suppress(OSError):
            self.proc.stdin.close()

    def exit_code(self, timeout: float) -> int | None:
        """The exit status, killing the worker if it does not exit in time."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def reap(self, timeout: float = 5.0) -> None:
        if self.exit_code(timeout) is None:
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.progress.close()


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc; empty if it is gone)."""
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 100000:
        kids = children.of(todo.pop())
        found += kids
        todo += kids
    return found


def death_message(returncode: int | None, limits: Limits) -> str:
    """Why a worker died under a call, for CallResult.error."""
    if returncode is None:
        return "plugin worker closed its protocol channel and was killed"
    if returncode < 0:
        number = -returncode
        if number == signal.SIGXCPU:
            return f"CPU time limit exceeded ({limits.cpu_seconds} s)"
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"plugin worker killed by {name} during the call"
    return f"plugin worker exited with code {returncode} during the call (os._exit() or a fatal error)"
