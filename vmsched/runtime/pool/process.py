"""One plugin worker process, as the pool sees it: how it starts, the process and its pipes (service side only).

Also how a worker's death is explained to the caller whose call it killed.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import site
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import orjson

from vmsched.runtime.worker import children
from vmsched.runtime.protocol import HEADER, LONG_NUMBERS, Progress, write_all
from vmsched.runtime.types import Confinement, Limits


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
        self.progress = progress  # the progress page it shares with the pool (vmsched.runtime.protocol.Progress)
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

    def ready(self, timeout: float) -> dict[str, str]:
        """Wait for the worker's ready message; its sandbox features (feature -> "on (...)" / "off: why")."""
        poller = select.poll()
        poller.register(self.read_fd, select.POLLIN)
        end = time.monotonic() + timeout
        reply = None
        try:
            while reply is None:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no answer within {timeout:g} s")
                if poller.poll(math.ceil(remaining * 1000)):
                    reply = self.feed()
        except (WorkerGone, OSError, TimeoutError) as exc:
            code = self.exit_code(timeout=1.0)
            raise RuntimeError(f"plugin worker {self.pid} did not start ({exc}; exit status {code})") from None
        if not reply.get("ready"):
            if reply.get("ok") is False and isinstance(reply.get("error"), str):
                raise RuntimeError(f"plugin worker {self.pid} refused to start: {reply['error']}")
            raise RuntimeError(f"plugin worker {self.pid} sent {reply!r} instead of its ready message")
        report = reply.get("sandbox") or {}
        self.tmp_dir = str(report.get("tmp_dir") or "")
        return {str(k): str(v) for k, v in (report.get("features") or {}).items()}

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


#: The only environment variables a worker inherits (plus Confinement.env): never a credential.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONIOENCODING", "PYTHONUTF8")


def spawn(plugins_dirs: Sequence[Path], limits: Limits, confinement: Confinement, max_frame: int) -> Worker:
    """Start one worker process with its progress page (it answers with its ready message: :meth:`Worker.ready`).

    Nothing of the service's environment reaches a plugin but an allow-list (no credential); the worker
    gets its protocol pipes, its stderr (drained by the pool, never the service's log) and its progress
    page (:class:`vmsched.runtime.protocol.Progress`).
    """
    progress = Progress.create()
    try:
        proc = subprocess.Popen(
            command(plugins_dirs, limits, confinement) + ["--progress-fd", str(progress)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # fd 1 and 2 of the worker: drained, never our log
            cwd=plugins_dirs[0],
            env=environment(confinement),
            bufsize=0,
            close_fds=True,
            process_group=0,  # so a kill also reaches what the plugin spawned
            pass_fds=(progress,),
        )
    except BaseException:
        os.close(progress)
        raise
    return Worker(proc, max_frame, Progress(progress))


def command(plugins_dirs: Sequence[Path], limits: Limits, confinement: Confinement) -> list[str]:
    """The worker's command line (its options: no secret)."""
    write_dirs = tuple(str(Path(d).absolute()) for d in confinement.write_dirs)  # the worker's cwd is elsewhere
    return [
        sys.executable,
        "-P",  # keep the plugins folder (cwd) from shadowing the worker's own imports
        "-m",
        "vmsched.runtime.worker.main",
        *(item for folder in plugins_dirs for item in ("--plugins-dir", str(folder))),
        "--limits",
        json.dumps(asdict(limits)),
        "--confinement",
        json.dumps(asdict(replace(confinement, write_dirs=write_dirs))),
        "--tmp-parent",
        tempfile.gettempdir(),
    ]


def environment(confinement: Confinement) -> dict[str, str]:
    """An allow-list of the service's environment, with vmsched importable by the worker.

    No credential reaches a plugin: only ENV_ALLOWED, LC_* and the names in
    Confinement.env are passed. A source checkout found through the current directory (not installed,
    not on PYTHONPATH) is added to PYTHONPATH; an installed vmsched is not,
    so site-packages never moves ahead of the standard library.
    """
    allowed = set(ENV_ALLOWED) | set(confinement.env)
    env = {k: v for k, v in os.environ.items() if k in allowed or k.startswith("LC_")}
    root = str(Path(__file__).resolve().parents[3])  # vmsched/runtime/pool/process.py
    on_path = {os.path.abspath(entry or os.curdir) for entry in sys.path}
    if root in on_path and root not in site.getsitepackages():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


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
