"""A pool of persistent worker processes that run plugin code.

The calling thread does its own I/O: it takes idle workers, writes one frame
to each, and waits on all their pipes at once with ``poll``. There is no
dispatcher thread and nothing is polled in a loop. A worker that overruns its
deadline is SIGKILLed; a worker that dies is reaped; both are replaced in a
background thread, so callers never wait for an interpreter start.

Its size adapts between ``min_size`` and ``max_size``: a caller that waits
for a worker (a few ms) starts one more in the background; a worker above the
minimum that stays idle for ``idle_seconds`` is stopped (``size=N``: a fixed
pool of N). How a request's units are laid out on workers is
:mod:`vmsched.runtime.pool.planning`; a worker process, as seen from here, is
:mod:`vmsched.runtime.pool.process`, which starts it too; a batch
of requests is run by :mod:`vmsched.runtime.pool.batch`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from math import inf
from typing import Any
from pathlib import Path

from vmsched.metrics import PLUGIN_CONFINEMENT, PLUGIN_WORKER_RESTARTS, PLUGIN_WORKERS
from vmsched.runtime.pool.batch import Batch, PoolClosed, Waiter
from vmsched.runtime.pool.drain import OutputDrain
from vmsched.facts.wire import FactsWire
from vmsched.runtime.pool.planning import BUNDLE_SECONDS, Bundle, Planner, Unit
from vmsched.runtime.pool.process import Worker, spawn
from vmsched.runtime.protocol import ENCODER
from vmsched.runtime.worker.sandbox import FEATURES, make_non_dumpable
from vmsched.runtime.types import Analysis, AnalyzedUnit, Call, CallResult, Confinement, Limits

log = logging.getLogger("vmsched.plugins")

READY_TIMEOUT = 30.0  # seconds a new worker may take to start
IDLE_SECONDS = 60.0  # a worker above the minimum that stays idle this long is stopped
_REASONS = ("timeout", "crash", "recycle")


class PoolUnavailable(RuntimeError):
    """No worker took the request: the pool is closed, or none was free in time."""


class PluginPool:
    """Persistent plugin worker processes shared by the threads of a service."""

    def __init__(self, plugins_dir: Path | Sequence[Path], size: int = 4, limits: Limits = Limits(), name: str = "pool",
                 max_calls: int = 10000, confinement: Confinement = Confinement(),
                 bundle_seconds: float = BUNDLE_SECONDS, min_size: int | None = None,
                 max_size: int | None = None, idle_seconds: float = IDLE_SECONDS) -> None:
        """``size`` N: a fixed pool of N workers; ``min_size``/``max_size``: an adaptive one. ``plugins_dir``:
        a folder, or several (on the workers' ``sys.path`` in this order; the first is their working directory)."""
        self.max_size = size if max_size is None else max_size
        self.min_size = self.max_size if min_size is None else min_size
        if not 1 <= self.min_size <= self.max_size:
            raise ValueError(f"need 1 <= minimum ({self.min_size}) <= maximum ({self.max_size}) workers")
        self.folders = tuple(Path(d).absolute() for d in ([plugins_dir] if isinstance(plugins_dir, (str, Path))
                                                           else plugins_dir))
        self.idle_seconds = idle_seconds
        #: units of a request share a worker while their mean run time together stays under this (seconds)
        self.bundle_seconds = bundle_seconds
        #: score calls may answer with their numbers alone (CallResult.scores; planning, contract)
        self.aligned_scores = False
        self.limits = limits
        self.name = name
        self.max_calls = max_calls
        self.confinement = confinement
        #: feature -> "on (...)" / "off: why", as the last worker that started reported it
        self.sandbox: dict[str, str] = {}
        self._drain: OutputDrain | None = None
        self._max_frame = 2 * limits.max_output + (1 << 20)
        self._lock = threading.Lock()
        self._idle: list[Worker] = []
        self._workers: set[Worker] = set()
        self._waiters: deque[Waiter] = deque()
        self._growing = 0  # workers being started (growth or successors), not yet in _workers
        self._warm_plugins: list[str] = []  # what a new worker imports before it serves (warm())
        self._started = False
        self._closed = threading.Event()
        self._wire = FactsWire()  # which host facts each worker holds
        self._plan = Planner(self._wire, self._max_frame)
        self._restarts = {reason: PLUGIN_WORKER_RESTARTS.labels(pool=name, reason=reason) for reason in _REASONS}

    # -- lifecycle
    def start(self) -> None:
        """Spawn ``min_size`` workers and wait until each is ready."""
        for folder in self.folders:
            if not folder.is_dir():
                raise FileNotFoundError(f"plugins folder {folder} does not exist")
        with self._lock:
            if self._started or self.closed:
                raise RuntimeError(f"plugin pool {self.name} already started")
            self._started = True
        make_non_dumpable()  # a same-uid worker cannot read our environment or memory
        PLUGIN_WORKERS.labels(pool=self.name).set_function(lambda: self.workers)  # read at scrape time
        self._drain = OutputDrain(self.name)
        workers: list[Worker] = []
        try:
            for _ in range(self.min_size):
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
        if self.min_size < self.max_size:
            threading.Thread(target=self._shrink_loop, name=f"{self.name}-shrink", daemon=True).start()

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

    @property
    def workers(self) -> int:
        """Worker processes running or starting right now (a snapshot)."""
        with self._lock:
            return len(self._workers) + self._growing

    # -- requests
    def run(self, calls: Sequence[Call], deadline: float | None = None) -> list[CallResult]:
        """Run ``calls`` (the units of one request); results in input order. Thread-safe.

        Cheap units travel together: one frame to one worker and one frame back (``bundles``).
        """
        self._check_started()
        now = time.monotonic()
        hard_end = inf if deadline is None else now + (deadline - time.time())
        units = self._plan.units(calls, now, hard_end, self.aligned_scores)
        Batch(self, self._plan.bundles([u for u in units if not u.done], now, self.bundle_seconds)).run()
        return [self._plan.result(unit) for unit in units]

    def analyze(self, path: Path, timeout: float = 10.0) -> Analysis:
        """List the units of a plugin file, importing it fresh in a worker.

        Raises :class:`PoolUnavailable` when no worker took the request (pool
        closed, or all busy for ``timeout``): that says nothing of the file.
        """
        self._check_started()
        path = Path(path).absolute()
        job = self._request({"op": "analyze", "path": str(path)}, f"analyze {path.name}", timeout)
        Batch(self, [job]).run()
        done, reply = job.units[0], job.units[0].reply
        if reply is None:
            if not job.started:
                raise PoolUnavailable(done.error)
            error = f"{done.error} while importing the module" if done.timed_out else done.error
            return Analysis(plugin=path.stem, error=error)
        if reply.get("stderr"):
            log.debug("analysis of %s wrote: %s", path.name, reply["stderr"].rstrip())
        if not reply.get("ok"):
            return Analysis(plugin=path.stem, error=reply.get("error") or "unknown error")
        units = [AnalyzedUnit(**unit) for unit in reply["units"]]
        return Analysis(plugin=path.stem, units=units, uses_facts=bool(reply.get("uses_facts")))

    def warm(self, plugins: Iterable[str], timeout: float = 10.0) -> None:
        """Import ``plugins`` in the workers idle right now (best effort)."""
        self._check_started()
        names = list(plugins)
        with self._lock:
            self._warm_plugins = names
            workers, self._idle = self._idle, []
        self._warm(names, workers, timeout)

    def _warm(self, names: list[str], workers: list[Worker], timeout: float) -> None:
        """``workers`` import ``names``, then serve (without names: they serve at once)."""
        jobs = [self._request({"op": "warm", "plugins": names}, "warm", timeout) for _ in workers] if names else []
        Batch(self, jobs, workers).run()  # it releases the workers

    def _request(self, message: dict[str, Any], label: str, timeout: float) -> Bundle:
        """A request to a worker that is not a unit call (analyze, warm): ``timeout`` to get a worker, as
        much to run."""
        now = time.monotonic()
        unit = Unit(ENCODER.encode(message)[:-1], label, timeout, now + timeout, inf)  # the closing brace comes later
        return Bundle([unit], self._wire, now, self._max_frame)

    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError(f"plugin pool {self.name} is not started")

    # -- the WorkerLender protocol (vmsched.runtime.pool.batch): lending workers to a Batch
    def checkout(self, waiter: Waiter, wanted: int) -> Worker | None:
        """An idle worker, or None after registering ``waiter`` for ``wanted`` of them."""
        with self._lock:
            if self.closed:
                raise PoolClosed()
            if waiter.granted:
                return waiter.granted.pop()
            if self._idle:
                return self._idle.pop()  # the most recently used: the longest idle stay idle and go
            waiter.wanted = wanted
            if not waiter.registered:
                waiter.open()
                self._waiters.append(waiter)
            return None

    def grow(self) -> None:
        """One more worker (up to ``max_size``), started in the background: a caller has waited
        (batch.GROW_AFTER) and takes whichever worker is free first."""
        with self._lock:
            if self.closed or len(self._workers) + self._growing >= self.max_size:
                return
            self._growing += 1
        threading.Thread(target=self._respawn, args=(None,), name=f"{self.name}-grow", daemon=True).start()

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
                worker.idle_since = time.monotonic()
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
        with self._lock:
            self._growing += 1  # its successor counts from now: grow() must not start one more meanwhile
        threading.Thread(target=self._respawn, args=(worker,), name=f"{self.name}-respawn", daemon=True).start()

    def _respawn(self, old: Worker | None) -> None:
        """Start a worker in the background (counted in ``_growing`` until spawned): the successor of
        ``old``, or (None) one that grows the pool."""
        if old is not None:
            self._reap(old)
        delay = 0.5
        while not self.closed:
            worker = None
            try:
                worker = self._spawn(growing=True)
                self._await_ready(worker)
            except Exception as exc:
                if worker is not None:
                    worker.kill()
                    self._reap(worker)
                if old is None or self.closed:  # a worker to grow the pool: it stays smaller (the next wait retries)
                    if not self.closed:
                        log.error("plugin pool %s: cannot start a worker (%s)", self.name, exc)
                    return
                log.error("plugin pool %s: cannot start a worker (%s); retrying in %.1f s", self.name, exc, delay)
                with self._lock:
                    self._growing += 1  # the successor counts again while it is retried
                if self._closed.wait(delay):
                    return
                delay = min(delay * 2, 30.0)
                continue
            self._warm(self._warm_plugins, [worker], READY_TIMEOUT)  # it imports what warm() named before it serves
            return

    def _shrink_loop(self) -> None:
        while not self._closed.wait(max(0.05, min(self.idle_seconds / 4, 10.0))):
            self.shrink(time.monotonic())

    def shrink(self, now: float) -> int:
        """Stop workers idle for ``idle_seconds`` while more than ``min_size`` run; how many stopped."""
        retired: list[Worker] = []
        with self._lock:
            while (self._idle and len(self._workers) > self.min_size and not self.closed
                   and self._idle[0].idle_since <= now - self.idle_seconds):
                worker = self._idle.pop(0)
                self._workers.discard(worker)
                retired.append(worker)
        for worker in retired:
            log.info("plugin pool %s: stopping worker %d, idle for %.0f s", self.name, worker.pid,
                     now - worker.idle_since)
            worker.close_input()
            self._reap(worker, timeout=1.0)
        return len(retired)

    # -- processes
    def _spawn(self, growing: bool = False) -> Worker:
        """Start a worker process (``growing``: one counted in ``_growing`` until it is in ``_workers``)."""
        try:
            worker = spawn(self.folders, self.limits, self.confinement, self._max_frame)
        except BaseException:
            with self._lock:
                self._growing -= growing
            raise
        assert worker.proc.stderr is not None and self._drain is not None
        self._drain.add(worker.proc.stderr.fileno())
        with self._lock:
            self._workers.add(worker)
            self._growing -= growing
        if self.closed:  # close() may have missed it
            worker.kill()
        return worker

    def _await_ready(self, worker: Worker) -> None:
        features = worker.ready(READY_TIMEOUT)
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
