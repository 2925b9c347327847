"""A coalescing, delayed work queue keyed by guest.

Several events for one guest before the worker gets to it become one job
(with the earliest event time, for latency, and every trigger). A delay
debounces bursts: two REBOOT events ~30 ms apart, or the TUNABLE events the
agent's own writes cause, are verified once.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


SIGNIFICANCE = ("undefined", "started", "reboot", "defined", "stopped", "metadata", "tunable")  # most first


@dataclass
class Job:
    key: str
    due: float
    first_event: float  # monotonic time the first coalesced event was received
    triggers: list[str] = field(default_factory=list)
    name: str = ""

    @property
    def trigger(self) -> str:
        """The most significant trigger, for metrics."""
        ranked = [t for t in SIGNIFICANCE if t in self.triggers]
        return (ranked or self.triggers or ["event"])[0]


class JobQueue:
    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}
        self._cond = threading.Condition()
        self._closed = False
        self._busy = 0

    def put(self, key: str, trigger: str, received: float, delay: float = 0.0, name: str = "") -> None:
        due = time.monotonic() + delay
        with self._cond:
            job = self._jobs.setdefault(key, Job(key, due, received, [], name))
            job.due = min(job.due, due)
            job.first_event = min(job.first_event, received)
            if trigger not in job.triggers:
                job.triggers.append(trigger)
            job.name = name or job.name
            self._cond.notify_all()  # the worker, and whoever waits for the queue to be idle

    def get(self, timeout: float) -> Job | None:
        """The next due job, waiting up to ``timeout`` seconds (None on timeout or close)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                job = min(self._jobs.values(), key=lambda j: j.due, default=None)
                if job is not None and job.due <= now:
                    del self._jobs[job.key]
                    self._busy += 1
                    return job
                wait = min(job.due if job is not None else deadline, deadline) - now
                if wait <= 0:
                    return None
                self._cond.wait(wait)
            return None

    def done(self) -> None:
        """The job returned by :meth:`get` is finished."""
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no job is queued or running (tests, benchmarks)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._jobs and not self._busy, timeout)

    def pending(self) -> int:
        with self._cond:
            return len(self._jobs)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
