"""A pool of persistent worker processes that run plugin code.

The calling thread does its own I/O: it takes idle workers, writes one frame
to each, and waits on all their pipes at once with ``poll``. There is no
dispatcher thread and nothing is polled in a loop, so a call costs two pipe
round trips plus JSON. A worker that overruns its deadline is SIGKILLed; a
worker that dies is reaped; both are replaced in a background thread so the
pool keeps its size without making callers wait for an interpreter start.
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import signal
import site
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vmsched.metrics import PLUGIN_WORKER_RESTARTS
from vmsched.runtime.types import Analysis, AnalyzedUnit, Call, CallResult, Limits
from vmsched.runtime.worker import HEADER, encode_frame, write_all

log = logging.getLogger("vmsched.plugins")

READY_TIMEOUT = 30.0  # seconds a new worker may take to start
_REASONS = ("timeout", "crash", "recycle")
_INF = math.inf


class PoolUnavailable(RuntimeError):
    """No worker took the request: the pool is closed, or none was free in time."""


class _WorkerGone(Exception):
    """The worker closed its pipe (``eof``) or broke the protocol."""

    def __init__(self, message: str, eof: bool = False) -> None:
        super().__init__(message)
        self.eof = eof


class _PoolClosed(Exception):
    pass


class _Worker:
    """One worker process and the pool's ends of its two pipes."""

    def __init__(self, proc: subprocess.Popen[bytes], max_frame: int) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.pid = proc.pid
        self.write_fd = proc.stdin.fileno()
        self.read_fd = proc.stdout.fileno()
        self.calls = 0
        self._max_frame = max_frame
        self._buffer = bytearray()

    def send(self, frame: bytes) -> None:
        write_all(self.write_fd, frame)

    def feed(self) -> dict[str, Any] | None:
        """Read what the pipe holds; the reply once complete, else None."""
        chunk = os.read(self.read_fd, 1 << 16)
        if not chunk:
            raise _WorkerGone("closed its pipe", eof=True)
        self._buffer += chunk
        if len(self._buffer) < HEADER.size:
            return None
        (size,) = HEADER.unpack_from(self._buffer)
        if size > self._max_frame:
            raise _WorkerGone(f"sent a {size}-byte frame")
        end = HEADER.size + size
        if len(self._buffer) < end:
            return None
        payload = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        try:
            message = json.loads(payload)
        except ValueError as exc:
            raise _WorkerGone(f"sent a bad frame ({exc})") from None
        if not isinstance(message, dict):
            raise _WorkerGone("sent a frame that is not an object")
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
        """
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            self.proc.kill()  # in case the plugin left the group
        except OSError:
            pass

    def close_input(self) -> None:
        """Ask the worker to exit once idle (it reads end-of-file)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except OSError:
            pass

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
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


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


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 0.1 else f"{value:.3f}"


@dataclass(eq=False)
class _Job:
    """One request in flight: its frame, its time budget and its outcome."""

    frame: bytes
    label: str  # for log lines
    budget: float  # seconds of execution once on a worker
    wait_until: float  # monotonic time after which waiting for a worker is given up
    hard_end: float  # monotonic time the request deadline falls (inf without one)
    created: float
    started: float = 0.0
    end: float = _INF
    reply: dict[str, Any] | None = None
    error: str | None = None
    timed_out: bool = False
    duration: float = 0.0

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None

    def fail(self, error: str, now: float, timed_out: bool = False) -> None:
        self.error = error
        self.timed_out = timed_out
        self.duration = now - (self.started or self.created)


class _Waiter:
    """A batch waiting for workers; released workers are handed to it directly."""

    def __init__(self) -> None:
        self.wanted = 0
        self.granted: list[_Worker] = []
        self.read_fd = -1
        self._write_fd = -1

    @property
    def registered(self) -> bool:
        return self.read_fd >= 0

    def open(self) -> None:
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)

    def wake(self) -> None:
        try:
            os.write(self._write_fd, b"!")
        except (BlockingIOError, OSError):
            pass  # already awake

    def drain(self) -> None:
        os.read(self.read_fd, 4096)

    def close(self) -> None:
        if self.registered:
            os.close(self.read_fd)
            os.close(self._write_fd)


class _Batch:
    """Runs jobs in parallel on pool workers, from the calling thread."""

    def __init__(self, pool: PluginPool, jobs: Sequence[_Job], workers: Sequence[_Worker] = ()) -> None:
        self._pool = pool
        self._pending = deque(job for job in jobs if not job.done)
        self._spare = list(workers)  # workers reserved for this batch (warm)
        self._running: dict[int, tuple[_Worker, _Job]] = {}
        self._poller = select.poll()
        self._waiter = _Waiter()
        self._waiter_polled = False

    def run(self) -> None:
        try:
            while self._pending or self._running:
                self._dispatch()
                if self._pending or self._running:
                    self._wait()
        finally:
            for worker, job in list(self._running.values()):  # only after an unexpected error
                self._abandon(worker, job, "crash", "internal error in the plugin pool", timed_out=False)
            for worker in self._spare:
                self._pool._release(worker)
            self._pool._drop_waiter(self._waiter)

    def _dispatch(self) -> None:
        while self._pending:
            try:
                worker = self._next_worker()
            except _PoolClosed:
                now = time.monotonic()
                while self._pending:
                    self._pending.popleft().fail("plugin pool is closed", now)
                return
            if worker is None:
                if not self._waiter_polled:
                    self._poller.register(self._waiter.read_fd, select.POLLIN)
                    self._waiter_polled = True
                return
            self._start(worker, self._pending.popleft())

    def _next_worker(self) -> _Worker | None:
        if self._spare:
            return self._spare.pop()
        return self._pool._checkout(self._waiter, len(self._pending))

    def _start(self, worker: _Worker, job: _Job) -> None:
        now = time.monotonic()
        job.started = now
        job.end = min(now + job.budget, job.hard_end)
        try:
            worker.send(job.frame)
        except OSError:  # it died while idle: the job never ran, try another worker
            job.started = 0.0
            self._pending.appendleft(job)
            self._pool._replace(worker, "crash", "died while idle")
            return
        worker.calls += 1
        self._running[worker.read_fd] = (worker, job)
        self._poller.register(worker.read_fd, select.POLLIN)

    def _wait(self) -> None:
        now = time.monotonic()
        self._expire_pending(now)
        ends = [job.end for _, job in self._running.values()] + [job.wait_until for job in self._pending]
        if not ends:
            return
        nearest = min(ends)
        timeout = None if nearest == _INF else max(0, math.ceil((nearest - now) * 1000))
        for fd, _event in self._poller.poll(timeout):
            if fd == self._waiter.read_fd:
                self._waiter.drain()
            else:
                self._receive(*self._running[fd])
        self._expire_running(time.monotonic())

    def _receive(self, worker: _Worker, job: _Job) -> None:
        try:
            reply = worker.feed()
        except (_WorkerGone, OSError) as exc:
            self._forget(worker)
            if getattr(exc, "eof", False):
                code = worker.exit_code(timeout=0.5)
            else:  # it broke the protocol: nothing it says can be trusted
                worker.kill()
                code = None
            if self._pool.closed:
                error = "plugin pool closed during the call"
            elif not getattr(exc, "eof", False):
                error = f"plugin worker {exc}; it was killed"
            else:
                error = death_message(code, self._pool.limits)
            job.fail(error, time.monotonic())
            self._pool._replace(worker, "crash", f"{job.label}: {error}")
            return
        if reply is not None:
            job.reply = reply
            job.duration = time.monotonic() - job.started
            self._forget(worker)
            self._pool._release(worker)

    def _expire_pending(self, now: float) -> None:
        expired = [job for job in self._pending if job.wait_until <= now]
        for job in expired:
            self._pending.remove(job)
            job.fail(f"timed out after {_seconds(now - job.created)} s waiting for a free plugin worker", now, True)
        if expired and self._waiter.registered:
            self._pool._want(self._waiter, len(self._pending))

    def _expire_running(self, now: float) -> None:
        for worker, job in list(self._running.values()):
            if job.end <= now:
                error = f"timed out after {_seconds(job.end - job.started)} s"
                if job.hard_end < job.started + job.budget:
                    error += " (request deadline)"
                self._abandon(worker, job, "timeout", error, timed_out=True)

    def _abandon(self, worker: _Worker, job: _Job, reason: str, error: str, timed_out: bool) -> None:
        self._forget(worker)
        worker.kill()
        job.fail(error, time.monotonic(), timed_out)
        self._pool._replace(worker, reason, f"{job.label}: {error}")

    def _forget(self, worker: _Worker) -> None:
        del self._running[worker.read_fd]
        self._poller.unregister(worker.read_fd)


class PluginPool:
    """Persistent plugin worker processes shared by the threads of a service."""

    def __init__(
        self,
        plugins_dir: Path,
        size: int = 4,
        limits: Limits = Limits(),
        name: str = "pool",
        max_calls: int = 10000,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.plugins_dir = Path(plugins_dir).absolute()
        self.size = size
        self.limits = limits
        self.name = name
        self.max_calls = max_calls
        self._max_frame = 2 * limits.max_output + (1 << 20)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._workers: set[_Worker] = set()
        self._waiters: deque[_Waiter] = deque()
        self._started = False
        self._closed = threading.Event()
        self._restarts = {reason: PLUGIN_WORKER_RESTARTS.labels(pool=name, reason=reason) for reason in _REASONS}

    # -- lifecycle
    def start(self) -> None:
        """Spawn ``size`` workers and wait until each is ready."""
        if not self.plugins_dir.is_dir():
            raise FileNotFoundError(f"plugins folder {self.plugins_dir} does not exist")
        with self._lock:
            if self._started or self.closed:
                raise RuntimeError(f"plugin pool {self.name} already started")
            self._started = True
        workers: list[_Worker] = []
        try:
            for _ in range(self.size):
                workers.append(self._spawn())
            for worker in workers:
                self._await_ready(worker)
        except BaseException:
            for worker in workers:
                worker.kill()
                self._reap(worker)
            raise
        for worker in workers:
            self._release(worker)

    def close(self) -> None:
        """Stop every worker (idempotent); calls in flight fail."""
        with self._lock:
            if self.closed:
                return
            self._closed.set()
            idle, self._idle = self._idle, []
            busy = [worker for worker in self._workers if worker not in idle]
            for waiter in self._waiters:
                waiter.wake()
        for worker in idle:
            worker.close_input()
        for worker in busy:  # their callers see EOF, report it and reap them
            worker.kill()
        for worker in idle:
            self._reap(worker, timeout=1.0)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __enter__(self) -> PluginPool:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests
    def run(self, calls: Sequence[Call], deadline: float | None = None) -> list[CallResult]:
        """Run ``calls`` in parallel; results in input order. Thread-safe."""
        self._check_started()
        now = time.monotonic()
        hard_end = _INF if deadline is None else now + (deadline - time.time())
        jobs = [self._call_job(call, now, hard_end) for call in calls]
        _Batch(self, jobs).run()
        return [self._call_result(job) for job in jobs]

    def analyze(self, path: Path, timeout: float = 10.0) -> Analysis:
        """List the units of a plugin file, importing it fresh in a worker.

        Raises :class:`PoolUnavailable` when no worker took the request (pool
        closed, or all busy for ``timeout``): that says nothing of the file.
        """
        self._check_started()
        path = Path(path).absolute()
        now = time.monotonic()
        frame = encode_frame({"op": "analyze", "path": str(path)})
        job = _Job(frame, f"analyze {path.name}", timeout, now + timeout, _INF, now)
        _Batch(self, [job]).run()
        if job.reply is None:
            if not job.started:
                raise PoolUnavailable(job.error)
            error = f"{job.error} while importing the module" if job.timed_out else job.error
            return Analysis(plugin=path.stem, error=error)
        if job.reply.get("stderr"):
            log.debug("analysis of %s wrote: %s", path.name, job.reply["stderr"].rstrip())
        if not job.reply.get("ok"):
            return Analysis(plugin=path.stem, error=job.reply.get("error") or "unknown error")
        units = [AnalyzedUnit(**unit) for unit in job.reply["units"]]
        return Analysis(plugin=path.stem, units=units)

    def warm(self, plugins: Iterable[str], timeout: float = 10.0) -> None:
        """Import ``plugins`` in the workers idle right now (best effort)."""
        self._check_started()
        names = list(plugins)
        with self._lock:
            workers, self._idle = self._idle, []
        if not names or not workers:
            for worker in workers:
                self._release(worker)
            return
        now = time.monotonic()
        frame = encode_frame({"op": "warm", "plugins": names})
        jobs = [_Job(frame, "warm", timeout, now + timeout, _INF, now) for _ in workers]
        _Batch(self, jobs, workers).run()

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError(f"plugin pool {self.name} is not started")

    def _call_job(self, call: Call, now: float, hard_end: float) -> _Job:
        label = f"{call.plugin}.{call.cls}.{call.method}"
        wait_until = hard_end if hard_end < _INF else now + call.timeout
        job = _Job(b"", label, call.timeout, wait_until, hard_end, now)
        message = {"op": "call", "plugin": call.plugin, "cls": call.cls, "method": call.method, "args": list(call.args)}
        try:
            job.frame = encode_frame(message)
        except (TypeError, ValueError, RecursionError) as exc:
            job.fail(f"arguments are not JSON-serializable: {exc}", now)
        if not job.done and wait_until <= now:
            job.fail("the request deadline passed before the call could start", now, timed_out=True)
        return job

    @staticmethod
    def _call_result(job: _Job) -> CallResult:
        reply = job.reply
        if reply is None:
            return CallResult(ok=False, error=job.error, timed_out=job.timed_out, duration=job.duration)
        stderr = reply.get("stderr") or ""
        if reply.get("ok"):
            return CallResult(ok=True, value=reply.get("value"), duration=job.duration, stderr=stderr)
        error = reply.get("error") or "unknown error"
        return CallResult(ok=False, error=error, duration=job.duration, stderr=stderr)

    # -- worker bookkeeping (called by _Batch)
    def _checkout(self, waiter: _Waiter, wanted: int) -> _Worker | None:
        """An idle worker, or None after registering ``waiter`` for ``wanted`` of them."""
        with self._lock:
            if self.closed:
                raise _PoolClosed()
            if waiter.granted:
                return waiter.granted.pop()
            if self._idle:
                return self._idle.pop()
            waiter.wanted = wanted
            if not waiter.registered:
                waiter.open()
                self._waiters.append(waiter)
            return None

    def _want(self, waiter: _Waiter, wanted: int) -> None:
        with self._lock:
            waiter.wanted = wanted
            surplus = waiter.granted[wanted:]
            del waiter.granted[wanted:]
        for worker in surplus:
            self._release(worker)

    def _drop_waiter(self, waiter: _Waiter) -> None:
        if not waiter.registered:
            return
        with self._lock:
            self._waiters.remove(waiter)
            granted, waiter.granted = waiter.granted, []
        waiter.close()
        for worker in granted:
            self._release(worker)

    def _release(self, worker: _Worker) -> None:
        """Give a worker that finished its request to a waiter or the idle list."""
        if worker.calls >= self.max_calls:
            self._replace(worker, "recycle", f"{worker.calls} calls served")
            return
        with self._lock:
            if not self.closed:
                for waiter in self._waiters:
                    if len(waiter.granted) < waiter.wanted:
                        waiter.granted.append(worker)
                        waiter.wake()
                        return
                self._idle.append(worker)
                return
        worker.close_input()
        self._reap(worker, timeout=1.0)

    def _replace(self, worker: _Worker, reason: str, why: str) -> None:
        """Retire ``worker`` and start its successor in the background."""
        if reason == "recycle":
            worker.close_input()
        else:
            worker.kill()
        if self.closed:
            self._reap(worker)
            return
        self._restarts[reason].inc()
        level = logging.INFO if reason == "recycle" else logging.WARNING
        log.log(level, "plugin pool %s: replacing worker %d (%s): %s", self.name, worker.pid, reason, why)
        threading.Thread(target=self._respawn, args=(worker,), name=f"{self.name}-respawn", daemon=True).start()

    def _respawn(self, old: _Worker) -> None:
        self._reap(old)
        delay = 0.5
        while not self.closed:
            worker = None
            try:
                worker = self._spawn()
                self._await_ready(worker)
            except Exception as exc:
                if worker is not None:
                    worker.kill()
                    self._reap(worker)
                if self.closed:
                    return
                log.error("plugin pool %s: cannot start a worker (%s); retrying in %.1f s", self.name, exc, delay)
                if self._closed.wait(delay):
                    return
                delay = min(delay * 2, 30.0)
                continue
            self._release(worker)
            return

    # -- processes
    def _spawn(self) -> _Worker:
        proc = subprocess.Popen(
            self._command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=self.plugins_dir,
            env=self._environment(),
            bufsize=0,
            close_fds=True,
            process_group=0,  # so a kill also reaches what the plugin spawned
        )
        worker = _Worker(proc, self._max_frame)
        with self._lock:
            self._workers.add(worker)
        if self.closed:  # close() may have missed it
            worker.kill()
        return worker

    def _await_ready(self, worker: _Worker) -> None:
        try:
            reply = worker.receive(READY_TIMEOUT)
        except (_WorkerGone, OSError, TimeoutError) as exc:
            code = worker.exit_code(timeout=1.0)
            raise RuntimeError(f"plugin worker {worker.pid} did not start ({exc}; exit status {code})") from None
        if not reply.get("ready"):
            raise RuntimeError(f"plugin worker {worker.pid} sent {reply!r} instead of its ready message")

    def _reap(self, worker: _Worker, timeout: float = 5.0) -> None:
        worker.reap(timeout)
        with self._lock:
            self._workers.discard(worker)

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-P",  # keep the plugins folder (cwd) from shadowing the worker's own imports
            "-m",
            "vmsched.runtime.worker",
            "--plugins-dir",
            str(self.plugins_dir),
            "--memory-mb",
            str(self.limits.memory_mb),
            "--cpu-seconds",
            str(self.limits.cpu_seconds),
            "--max-output",
            str(self.limits.max_output),
        ]

    @staticmethod
    def _environment() -> dict[str, str]:
        """The service's environment, with vmsched importable by the worker.

        A source checkout found through the current directory (not installed,
        not on PYTHONPATH) is added to PYTHONPATH; an installed vmsched is not,
        so site-packages never moves ahead of the standard library.
        """
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        on_path = {os.path.abspath(entry or os.curdir) for entry in sys.path}
        if root in on_path and root not in site.getsitepackages():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return env
