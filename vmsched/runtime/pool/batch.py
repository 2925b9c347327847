"""Running a batch of requests on pool workers, from the calling thread.

The calling thread does its own I/O: it takes idle workers, writes one frame
to each, and waits on all their pipes at once with ``poll``. A job that
overruns its time budget has its worker abandoned (killed and replaced by the
pool); a job that cannot get a worker in time fails without running.
"""

from __future__ import annotations

import os
import select
import time
from collections import deque
from collections.abc import Sequence
from math import ceil, inf
from typing import Protocol

from vmsched.runtime.pool.planning import Bundle, seconds_text
from vmsched.runtime.pool.process import Worker, WorkerClosed, WorkerGone, death_message
from vmsched.runtime.types import Limits

#: Seconds a batch waits for a worker before it asks the pool to grow: a wait shorter than this is
#: a worker finishing its units (well under a millisecond for cheap ones), not a pool too small.
GROW_AFTER = 0.005


class PoolClosed(Exception):
    """The pool closed: no worker will be lent any more."""


class WorkerLender(Protocol):
    """What a batch needs from the pool that owns the workers (PluginPool implements it)."""

    limits: Limits

    @property
    def closed(self) -> bool: ...

    def checkout(self, waiter: Waiter, wanted: int) -> Worker | None:
        """An idle worker, or None after registering ``waiter`` for ``wanted`` of them (PoolClosed if closed)."""

    def want(self, waiter: Waiter, wanted: int) -> None:
        """``waiter`` now wants ``wanted`` workers; any it was granted beyond that go back."""

    def drop_waiter(self, waiter: Waiter) -> None:
        """``waiter`` is done: forget it and take back what it was granted."""

    def release(self, worker: Worker) -> None:
        """``worker`` finished its request and may serve another."""

    def grow(self) -> None:
        """A batch has waited ``GROW_AFTER`` for a worker: start one more if the pool may grow."""

    def replace(self, worker: Worker, reason: str, why: str) -> None:
        """``worker`` is retired (``reason``: timeout, crash or recycle); start its successor."""


class Waiter:
    """A batch waiting for workers; released workers are handed to it directly."""

    def __init__(self) -> None:
        self.wanted = 0
        self.granted: list[Worker] = []
        self.fd = -1  # an eventfd, readable once woken

    @property
    def registered(self) -> bool:
        return self.fd >= 0

    def open(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def wake(self) -> None:
        os.eventfd_write(self.fd, 1)  # adds to a counter: never blocks, whatever the wake-ups pending

    def drain(self) -> None:
        os.eventfd_read(self.fd)

    def close(self) -> None:
        if self.registered:
            os.close(self.fd)


class Batch:
    """Runs jobs in parallel on workers lent by a pool, from the calling thread."""

    def __init__(self, pool: WorkerLender, jobs: Sequence[Bundle], workers: Sequence[Worker] = ()) -> None:
        self._pool = pool
        self._pending = deque(jobs)
        self._spare = list(workers)  # workers reserved for this batch (warm)
        self._running: dict[int, tuple[Worker, Bundle]] = {}
        self._poller = select.poll()
        self._waiter = Waiter()
        self._waiter_polled = False
        self._grow_at = inf  # when to ask the pool for one more worker (while waiting)

    def run(self) -> None:
        try:
            while self._pending or self._running:
                self._dispatch()
                if self._pending or self._running:
                    self._wait()
        finally:
            for worker, job in list(self._running.values()):  # only after an unexpected error
                self._forget(worker)
                worker.kill()
                job.fail("internal error in the plugin pool", time.monotonic())
                self._pool.replace(worker, "crash", f"{job.blamed}: internal error in the plugin pool")
            for worker in self._spare:
                self._pool.release(worker)
            self._pool.drop_waiter(self._waiter)

    def _dispatch(self) -> None:
        while self._pending:
            try:
                worker = self._spare.pop() if self._spare else self._pool.checkout(self._waiter, len(self._pending))
            except PoolClosed:
                now = time.monotonic()
                while self._pending:
                    self._pending.popleft().fail("plugin pool is closed", now)
                return
            if worker is None:
                if not self._waiter_polled:
                    self._poller.register(self._waiter.fd, select.POLLIN)
                    self._waiter_polled = True
                    self._grow_at = time.monotonic() + GROW_AFTER
                return
            self._start(worker, self._pending.popleft())

    def _start(self, worker: Worker, job: Bundle) -> None:
        job.begin(worker, time.monotonic())
        try:
            worker.send(job.frame_for(worker))
        except OSError:  # it died while idle: the job never ran, try another worker
            job.started = 0.0
            self._pending.appendleft(job)
            self._pool.replace(worker, "crash", "died while idle")
            return
        worker.calls += len(job.units)
        self._running[worker.read_fd] = (worker, job)
        self._poller.register(worker.read_fd, select.POLLIN)

    def _wait(self) -> None:
        now = time.monotonic()
        self._expire_pending(now)
        ends = [job.end for _, job in self._running.values()] + [job.wait_until for job in self._pending]
        if not ends:
            return
        if self._pending:
            ends.append(self._grow_at)
        nearest = min(ends)
        timeout = None if nearest == inf else max(0, ceil((nearest - now) * 1000))
        for fd, _event in self._poller.poll(timeout):
            if fd == self._waiter.fd:
                self._waiter.drain()
            else:
                self._receive(*self._running[fd])
        now = time.monotonic()
        self._expire_running(now)
        if self._pending and self._grow_at <= now:
            self._grow_at = inf  # once per batch
            self._pool.grow()

    def _receive(self, worker: Worker, job: Bundle) -> None:
        try:
            reply = worker.feed()
        except (WorkerGone, OSError) as exc:
            self._forget(worker)
            eof = isinstance(exc, WorkerClosed)
            if not eof:  # it broke the protocol: nothing it says can be trusted
                worker.kill()
            code = worker.exit_code(timeout=0.5) if eof else None
            if self._pool.closed:
                error = "plugin pool closed during the call"
            else:
                error = death_message(code, self._pool.limits) if eof else f"plugin worker {exc}; it was killed"
            now = time.monotonic()
            job.died(worker, error, now)
            self._pending.extend(job.leftovers(now))
            self._pool.replace(worker, "crash", f"{job.blamed}: {error}")
            return
        if reply is None:
            return
        self._forget(worker)
        now = time.monotonic()
        if job.accept(worker, reply, now):
            self._pool.release(worker)
            return
        worker.kill()
        job.died(worker, "plugin worker sent a reply that does not match its request; it was killed", now)
        self._pending.extend(job.leftovers(now))
        self._pool.replace(worker, "crash", f"{job.blamed}: mismatched reply")

    def _expire_pending(self, now: float) -> None:
        expired = [job for job in self._pending if job.wait_until <= now]
        for job in expired:
            self._pending.remove(job)
            job.fail(f"timed out after {seconds_text(now - job.created)} s waiting for a free plugin worker", now, True)
        if expired and self._waiter.registered:
            self._pool.want(self._waiter, len(self._pending))

    def _expire_running(self, now: float) -> None:
        for worker, job in list(self._running.values()):
            if job.end <= now and job.overran(worker, now):
                self._forget(worker)
                worker.kill()
                self._pending.extend(job.leftovers(now))
                self._pool.replace(worker, "timeout", f"{job.blamed}: {job.error}")

    def _forget(self, worker: Worker) -> None:
        del self._running[worker.read_fd]
        self._poller.unregister(worker.read_fd)
