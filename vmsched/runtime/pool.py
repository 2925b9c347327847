"""A pool of persistent worker processes that run plugin code.

The calling thread does its own I/O: it takes idle workers, writes one frame
to each, and waits on all their pipes at once with ``poll``. There is no
dispatcher thread and nothing is polled in a loop, so a call costs two pipe
round trips plus JSON. A worker that overruns its deadline is SIGKILLed; a
worker that dies is reaped; both are replaced in a background thread so the
pool keeps its size without making callers wait for an interpreter start.

A worker process, as seen from here, is in :mod:`vmsched.runtime.process`; a
batch of requests is run by :mod:`vmsched.runtime.batch`; the frames they
exchange are defined in :mod:`vmsched.runtime.protocol`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import site
import subprocess
import tempfile
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path

from vmsched.metrics import PLUGIN_CONFINEMENT, PLUGIN_WORKER_RESTARTS
from vmsched.runtime.batch import Batch, Job, PoolClosed, Waiter
from vmsched.runtime.drain import OutputDrain
from vmsched.runtime.bundle import Bundle, Unit
from vmsched.runtime.facts_wire import CallFacts, FactsWire
from vmsched.runtime.process import Worker, WorkerGone
from vmsched.runtime.progress import Progress
from vmsched.runtime.protocol import _ENCODER, encode_frame
from vmsched.runtime.sandbox import FEATURES, make_non_dumpable
from vmsched.runtime.types import Analysis, AnalyzedUnit, Call, CallResult, Confinement, Limits

log = logging.getLogger("vmsched.plugins")

READY_TIMEOUT = 30.0  # seconds a new worker may take to start
#: The only environment variables a worker inherits (plus Confinement.env): never a credential.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONIOENCODING", "PYTHONUTF8")
_REASONS = ("timeout", "crash", "recycle")
#: The units of a request share one worker while their expected run time together stays under this
#: (seconds); a slower unit gets a worker of its own, so slow units still run in parallel. 0: every unit alone.
BUNDLE_SECONDS = 0.002
_INF = math.inf


class PoolUnavailable(RuntimeError):
    """No worker took the request: the pool is closed, or none was free in time."""


class PluginPool:
    """Persistent plugin worker processes shared by the threads of a service."""

    def __init__(
        self,
        plugins_dir: Path,
        size: int = 4,
        limits: Limits = Limits(),
        name: str = "pool",
        max_calls: int = 10000,
        confinement: Confinement = Confinement(),
        bundle_seconds: float = BUNDLE_SECONDS,
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self.plugins_dir = Path(plugins_dir).absolute()
        self.size = size
        self.limits = limits
        self.name = name
        self.max_calls = max_calls
        self.confinement = confinement
        self.bundle_seconds = bundle_seconds
        self._cost: dict[str, float] = {}  # unit label -> mean run time (s), for bundling
        #: feature -> "on (...)" / "off: why", as the last worker that started reported it
        self.sandbox: dict[str, str] = {}
        self._drain: OutputDrain | None = None
        self._max_frame = 2 * limits.max_output + (1 << 20)
        self._lock = threading.Lock()
        self._idle: list[Worker] = []
        self._workers: set[Worker] = set()
        self._waiters: deque[Waiter] = deque()
        self._started = False
        self._closed = threading.Event()
        self._wire = FactsWire()  # which host facts each worker holds
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
        make_non_dumpable()  # a same-uid worker cannot read our environment or memory
        self._drain = OutputDrain(self.name)
        workers: list[Worker] = []
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
            self.release(worker)
        shown = "; ".join(f"{k} {v}" for k, v in self.sandbox.items())
        log.info("plugin pool %s: confinement: %s", self.name, shown)

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
        if self._drain is not None:
            self._drain.close()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    @property
    def idle(self) -> int:
        """Workers idle right now (a snapshot, for tests and diagnostics)."""
        with self._lock:
            return len(self._idle)

    def __enter__(self) -> PluginPool:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests
    def run(self, calls: Sequence[Call], deadline: float | None = None) -> list[CallResult]:
        """Run ``calls`` (the units of one request); results in input order. Thread-safe.

        Cheap units travel together: one frame to one worker and one frame back (``bundles``).
        """
        self._check_started()
        now = time.monotonic()
        hard_end = _INF if deadline is None else now + (deadline - time.time())
        units = self._units(calls, now, hard_end)
        Batch(self, self._bundles([u for u in units if not u.done], now)).run()
        return [self._unit_result(unit) for unit in units]

    def analyze(self, path: Path, timeout: float = 10.0) -> Analysis:
        """List the units of a plugin file, importing it fresh in a worker.

        Raises :class:`PoolUnavailable` when no worker took the request (pool
        closed, or all busy for ``timeout``): that says nothing of the file.
        """
        self._check_started()
        path = Path(path).absolute()
        now = time.monotonic()
        frame = encode_frame({"op": "analyze", "path": str(path)})
        job = Job(frame, f"analyze {path.name}", timeout, now + timeout, _INF, now)
        Batch(self, [job]).run()
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
        return Analysis(plugin=path.stem, units=units, uses_facts=bool(job.reply.get("uses_facts")))

    def warm(self, plugins: Iterable[str], timeout: float = 10.0) -> None:
        """Import ``plugins`` in the workers idle right now (best effort)."""
        self._check_started()
        names = list(plugins)
        with self._lock:
            workers, self._idle = self._idle, []
        if not names or not workers:
            for worker in workers:
                self.release(worker)
            return
        now = time.monotonic()
        frame = encode_frame({"op": "warm", "plugins": names})
        jobs = [Job(frame, "warm", timeout, now + timeout, _INF, now) for _ in workers]
        Batch(self, jobs, workers).run()

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError(f"plugin pool {self.name} is not started")

    def _units(self, calls: Sequence[Call], now: float, hard_end: float) -> list[Unit]:
        units: list[Unit] = []
        args_json: dict[int, str] = {}  # the units of a request share their arguments: encoded once
        for call in calls:
            label = f"{call.plugin}.{call.cls}.{call.method}"
            wait_until = hard_end if hard_end < _INF else now + call.timeout
            held = isinstance(call.facts, CallFacts)  # each worker gets the facts it lacks (runtime.facts_wire)
            unit = Unit("", label, call.timeout, wait_until, hard_end, call.facts if held else None)
            units.append(unit)
            try:
                args = args_json.get(id(call.args))
                if args is None:
                    args = args_json[id(call.args)] = _ENCODER.encode(list(call.args))
                head = _ENCODER.encode({"plugin": call.plugin, "cls": call.cls, "method": call.method})[:-1]
                unit.head = f'{head},"args":{args}'
                if call.facts is not None and not held:  # host facts in full (vmsched.plugin.facts)
                    unit.head += ',"facts":' + _ENCODER.encode(call.facts)
            except (TypeError, ValueError, RecursionError) as exc:
                unit.fail(f"arguments are not JSON-serializable: {exc}", now)
                continue
            if wait_until <= now:
                unit.fail("the request deadline passed before the call could start", now, timed_out=True)
        return units

    def _bundles(self, units: list[Unit], now: float) -> list[Bundle]:
        """Units grouped for workers: together while their expected run time stays under ``bundle_seconds``."""
        bundles: list[Bundle] = []
        group: list[Unit] = []
        load = 0.0
        for unit in units:
            cost = self._cost.get(unit.label, 0.0)
            facts = next((u.facts for u in group if u.facts is not None), None)
            clash = facts is not None and unit.facts is not None and unit.facts is not facts
            if group and (load + cost > self.bundle_seconds or clash or self.bundle_seconds <= 0):
                bundles.append(Bundle(group, self._wire, now, self._max_frame))
                group, load = [], 0.0
            group.append(unit)
            load += cost
        if group:
            bundles.append(Bundle(group, self._wire, now, self._max_frame))
        return bundles

    def _unit_result(self, unit: Unit) -> CallResult:
        reply = unit.reply
        if reply is None:
            return CallResult(ok=False, error=unit.error, timed_out=unit.timed_out, duration=unit.duration)
        previous = self._cost.get(unit.label)  # a rough mean of its run time (races only blur it)
        self._cost[unit.label] = unit.duration if previous is None else previous + (unit.duration - previous) / 8
        stderr = reply.get("stderr") or ""
        if reply.get("ok"):
            return CallResult(ok=True, value=reply.get("value"), duration=unit.duration, stderr=stderr)
        error = reply.get("error") or "unknown error"
        return CallResult(ok=False, error=error, duration=unit.duration, stderr=stderr)

    # -- the WorkerLender protocol (vmsched.runtime.batch): lending workers to a Batch
    def checkout(self, waiter: Waiter, wanted: int) -> Worker | None:
        """An idle worker, or None after registering ``waiter`` for ``wanted`` of them."""
        with self._lock:
            if self.closed:
                raise PoolClosed()
            if waiter.granted:
                return waiter.granted.pop()
            if self._idle:
                return self._idle.pop()
            waiter.wanted = wanted
            if not waiter.registered:
                waiter.open()
                self._waiters.append(waiter)
            return None

    def want(self, waiter: Waiter, wanted: int) -> None:
        with self._lock:
            waiter.wanted = wanted
            surplus = waiter.granted[wanted:]
            del waiter.granted[wanted:]
        for worker in surplus:
            self.release(worker)

    def drop_waiter(self, waiter: Waiter) -> None:
        if not waiter.registered:
            return
        with self._lock:
            self._waiters.remove(waiter)
            granted, waiter.granted = waiter.granted, []
        waiter.close()
        for worker in granted:
            self.release(worker)

    def release(self, worker: Worker) -> None:
        """Give a worker that finished its request to a waiter or the idle list."""
        if worker.calls >= self.max_calls:
            self.replace(worker, "recycle", f"{worker.calls} calls served")
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

    def replace(self, worker: Worker, reason: str, why: str) -> None:
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
        if reason == "crash" and self._drain is not None and worker.proc.stderr is not None:
            tail = self._drain.tail(worker.proc.stderr.fileno())
            why += f"; its last output (escaped): {tail}" if tail else ""
        log.log(level, "plugin pool %s: replacing worker %d (%s): %s", self.name, worker.pid, reason, why)
        threading.Thread(target=self._respawn, args=(worker,), name=f"{self.name}-respawn", daemon=True).start()

    def _respawn(self, old: Worker) -> None:
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
            self.release(worker)
            return

    # -- processes
    def _spawn(self) -> Worker:
        progress = Progress.create()
        try:
            proc = self._popen(progress.fd)
        except BaseException:
            progress.close()
            raise
        worker = Worker(proc, self._max_frame, progress)
        assert proc.stderr is not None and self._drain is not None
        self._drain.add(proc.stderr.fileno())
        with self._lock:
            self._workers.add(worker)
        if self.closed:  # close() may have missed it
            worker.kill()
        return worker

    def _popen(self, progress_fd: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self._command() + ["--progress-fd", str(progress_fd)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # fd 1 and 2 of the worker: drained, never our log
            cwd=self.plugins_dir,
            env=self._environment(),
            bufsize=0,
            close_fds=True,
            process_group=0,  # so a kill also reaches what the plugin spawned
            pass_fds=(progress_fd,),
        )

    def _await_ready(self, worker: Worker) -> None:
        try:
            reply = worker.receive(READY_TIMEOUT)
        except (WorkerGone, OSError, TimeoutError) as exc:
            code = worker.exit_code(timeout=1.0)
            raise RuntimeError(f"plugin worker {worker.pid} did not start ({exc}; exit status {code})") from None
        if not reply.get("ready"):
            if reply.get("ok") is False and isinstance(reply.get("error"), str):
                raise RuntimeError(f"plugin worker {worker.pid} refused to start: {reply['error']}")
            raise RuntimeError(f"plugin worker {worker.pid} sent {reply!r} instead of its ready message")
        report = reply.get("sandbox") or {}
        worker.tmp_dir = str(report.get("tmp_dir") or "")
        features = {str(k): str(v) for k, v in (report.get("features") or {}).items()}
        if features != self.sandbox:
            self.sandbox = features
            for feature in FEATURES:
                active = features.get(feature, "off").startswith("on")
                PLUGIN_CONFINEMENT.labels(pool=self.name, feature=feature).set(1 if active else 0)

    def _reap(self, worker: Worker, timeout: float = 5.0) -> None:
        if self._drain is not None and worker.proc.stderr is not None:
            self._drain.forget(worker.proc.stderr.fileno())
        worker.reap(timeout)
        if worker.tmp_dir.startswith(tempfile.gettempdir()):
            shutil.rmtree(worker.tmp_dir, ignore_errors=True)
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
            "--sandbox",
            json.dumps(
                {
                    "user": self.confinement.user,
                    "allow_root": self.confinement.allow_root,
                    "network": self.confinement.network,
                    "extra_write": [str(Path(d).absolute()) for d in self.confinement.write_dirs],
                    "max_procs": self.limits.max_procs,
                    "max_files": self.limits.max_files,
                    "max_file_mb": self.limits.max_file_mb,
                    "tmp_parent": tempfile.gettempdir(),
                }
            ),
        ]

    def _environment(self) -> dict[str, str]:
        """An allow-list of the service's environment, with vmsched importable by the worker.

        No credential reaches a plugin: only ENV_ALLOWED, LC_* and the names in
        Confinement.env are passed. A source checkout found through the current directory (not installed,
        not on PYTHONPATH) is added to PYTHONPATH; an installed vmsched is not,
        so site-packages never moves ahead of the standard library.
        """
        allowed = set(ENV_ALLOWED) | set(self.confinement.env)
        env = {k: v for k, v in os.environ.items() if k in allowed or k.startswith("LC_")}
        root = str(Path(__file__).resolve().parents[2])
        on_path = {os.path.abspath(entry or os.curdir) for entry in sys.path}
        if root in on_path and root not in site.getsitepackages():
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        return env
