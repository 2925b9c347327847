"""What every plugin-running service shares: a pool, a catalog, bus routes.

A concrete service (discovery, scoring, balancer) only declares its queues
(``QUEUES``, queue -> handler method) and writes the handlers; starting the plugin workers, watching the plugins folder, running
units in parallel under their timeouts and counting plugin metrics is here.
"""

from __future__ import annotations

import logging
import pwd
import time
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from vmsched import metrics
from vmsched.facts.subscription import FactsSubscriber
from vmsched.bus.interface import Transport, Worker
from vmsched.bus.rabbitmq.journal import default_dir
from vmsched.bus.replies import Handler
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings
from vmsched.words import counted
from vmsched.engine_link import facts_cache
from vmsched.facts.cache import NO_CACHE, FactsCache, cause
from vmsched.messages import Kind, MissingFacts
from vmsched.runtime import Call, CallResult, Catalog, Limits, PluginPool
from vmsched.runtime.contract import KIND
from vmsched.runtime.types import Confinement

log = logging.getLogger("vmsched.service")

#: Time kept back from the caller's deadline to send the reply.
REPLY_MARGIN = 0.05


_UNBUILT = object()


def _items(value: str) -> tuple[str, ...]:
    return tuple(filter(None, (item.strip() for item in value.split(","))))


def default_plugin_user() -> str:
    """``vmsched-plugin`` where that user exists (deploy/systemd/vmsched.sysusers.conf), else ``nobody``."""
    try:
        pwd.getpwnam("vmsched-plugin")
    except KeyError:
        return "nobody"
    return "vmsched-plugin"


def plugin_sandbox(settings: Settings) -> tuple[Limits, Confinement]:
    """The resource limits and confinement of plugin workers, from the settings (services and ``vmsched plugin``)."""
    limits = Limits(
        memory_mb=settings.plugin_memory_mb,
        cpu_seconds=settings.plugin_cpu_seconds,
        max_output=settings.plugin_max_output,
        max_procs=settings.plugin_max_procs,
        max_files=settings.plugin_max_files,
        max_file_mb=settings.plugin_max_file_mb,
    )
    confinement = Confinement(
        user=settings.plugin_user or default_plugin_user(),
        allow_root=settings.allow_root_plugins,
        network=settings.plugin_network,
        env=_items(settings.plugin_env),
        write_dirs=_items(settings.plugin_write_dirs),
    )
    return limits, confinement


@dataclass
class UnitRun:
    """One unit of a request: its name and what happened when it ran."""

    name: str
    result: CallResult
    read_facts: bool = False  # its plugin reads host facts: the call carried them (those the service has)
    facts: Any = None  # then the call's facts (a vmsched.facts.wire.PreparedFacts; None without a facts cache)


def missing_facts(runs: list[UnitRun], hosts: list[str], vm: str = "") -> MissingFacts | None:
    """What the request's units that read host facts lacked (the call's facts know which hosts had none, and
    why), or None when they lacked nothing."""
    readers = [run for run in runs if run.read_facts]
    if not readers:
        return None
    facts = readers[0].facts  # one request's calls share its facts
    units = [run.name for run in readers]
    causes: dict[str, list[str]] = {}
    if facts is None:
        causes[NO_CACHE] = list(dict.fromkeys(hosts))
        problem = NO_CACHE if vm else None
    else:
        for host, reason in facts.missing.items():
            causes.setdefault(cause(reason), []).append(host)
        problem = facts.vm_problem if vm else None
    if not causes and problem is None:
        return None
    return MissingFacts(units=units, hosts=causes, vm=problem)


class PluginService:
    name = "service"
    runs_units = True  # False: the pool only analyses plugin files
    #: The queues this service consumes, each with the name of its handler method:
    #: the one declaration that the runner, the CLI and the deploy tests read.
    QUEUES: ClassVar[dict[str, str]] = {}
    #: Keep a host facts cache and attach facts to plugin calls (docs/facts.md).
    uses_facts: ClassVar[bool] = False

    def __init__(self, settings: Settings, transport: Transport, pool_size: int | None = None,
                 pool_bounds: tuple[int, int] | None = None, log_plugins: bool = True) -> None:
        """A service on ``transport``, the process's bus (the runner's). ``pool_size`` fixes the plugin pool's size,
        ``pool_bounds`` sets (fewest, most); else the settings'. ``log_plugins``: log plugin loads and load errors
        (one service of a process does)."""
        self.settings = settings
        self.transport = transport
        limits, confinement = plugin_sandbox(settings)
        fewest, most = (pool_size, pool_size) if pool_size else pool_bounds or settings.pool_bounds()
        self.pool = PluginPool(
            settings.plugin_folders, min_size=fewest, max_size=most, idle_seconds=settings.pool_idle, limits=limits,
            name=self.name, confinement=confinement, bundle_seconds=settings.plugin_bundle_ms / 1000,
        )
        self.catalog = Catalog(settings.plugin_folders, self.pool, analyze_timeout=settings.plugin_timeout,
                               log_changes=log_plugins)
        self.worker: Worker | None = None
        metrics.init_requests(self.name, [op.value for op, queue in REQUEST_QUEUES.items() if queue in self.QUEUES],
                              worker=True)
        self.facts: FactsCache | None = facts_cache(settings, self.name) if self.uses_facts else None
        self._facts_sub: FactsSubscriber | None = None

    # --- lifecycle ---------------------------------------------------------
    def routes(self) -> dict[str, Handler]:
        """QUEUES: each request queue and the method that handles it."""
        return {queue: getattr(self, method) for queue, method in self.QUEUES.items()}

    def start(self) -> None:
        self.pool.start()
        self.catalog.refresh()
        self.catalog.start_watching(self.settings.rescan_interval)
        if self.runs_units:
            self.pool.warm(sorted({u.plugin for u in self.catalog.units()}))
        self.worker = self.transport.worker(
            self.name,
            self.routes(),
            consumers=self.settings.consumers,
            prefetch=self.settings.prefetch,
            journal_dir=(self.settings.runtime_dir or default_dir()) / "journal",
        )
        self.worker.start()
        if self.facts is not None:
            self._facts_sub = FactsSubscriber(self.transport, self.name, self.facts.ingest)
            self._facts_sub.start()
        log.info("%s: serving %s with %s", self.name, ", ".join(self.routes()),
                 counted(len(self.catalog.units()), "unit"))

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        if self._facts_sub is not None:
            self._facts_sub.stop()
        if self.facts is not None and self.facts.link is not None:
            self.facts.link.stop()
        self.catalog.stop()
        self.pool.close()

    # --- running units -----------------------------------------------------
    def run_units(
        self, kind: Kind, names: list[str], args: tuple[Any, ...], deadline: float, timeout: float | None,
        facts: Callable[[], Any] | None = None,
    ) -> list[UnitRun]:
        """Run every named unit of ``kind`` in parallel; unknown names fail alone.

        ``args`` are the method's arguments (``KIND[kind].args(...)`` builds them); ``facts``
        builds the call's host facts (:meth:`facts_for`), once, and only when a unit's plugin reads
        them: the others skip building, encoding and decoding them.
        """
        calls: list[Call] = []
        slots: list[int] = []
        built: object = _UNBUILT
        runs = [UnitRun(name, CallResult(ok=False)) for name in names]
        for i, name in enumerate(names):
            unit = self._lookup(name, kind)
            if unit is None:
                runs[i].result = CallResult(ok=False, error=self._unknown(name, kind))
                continue
            budget = min(timeout or self.settings.timeout_for(name), deadline - time.time() - REPLY_MARGIN)
            unit_facts = None
            if facts is not None and self.catalog.uses_facts(unit.plugin):
                if built is _UNBUILT:
                    built = facts()
                unit_facts = built  # type: ignore[assignment]
                runs[i].read_facts, runs[i].facts = True, built
            calls.append(Call(unit.plugin, unit.name, KIND[kind].method, args, max(budget, 0.001), unit_facts))
            slots.append(i)
        if calls:
            for i, result in zip(slots, self.pool.run(calls, deadline=deadline - REPLY_MARGIN)):
                runs[i].result = result
                self._observe(names[i], result)
        return runs

    def facts_for(self, hosts: list[str], vm: str = "", with_guests: bool = False) -> Any:
        """The host facts of one request's plugin calls (None without a cache): a vmsched.facts.wire.PreparedFacts."""
        return None if self.facts is None else self.facts.prepared(hosts, vm, with_guests)

    def _unknown(self, name: str, kind: Kind) -> str:
        """Why unit ``name`` cannot run: the load error of its file when that file failed to load."""
        failed = self.catalog.load_error_of(name)
        if failed is not None:
            return f"{kind.value} unit {name!r} is in {failed.plugin}.py, which failed to load: {failed.error}"
        return f"unknown {kind.value} unit {name!r}"

    def _lookup(self, name: str, kind: Kind):  # type: ignore[no-untyped-def]
        unit = self.catalog.unit(name, kind)
        if unit is None and self.catalog.refresh():  # a plugin may have just been added
            unit = self.catalog.unit(name, kind)
        return unit

    @staticmethod
    def _observe(unit: str, result: CallResult) -> None:
        metrics.child(metrics.PLUGIN_DURATION, unit).observe(result.duration)
        if result.ok:
            outcome = "ok"
        elif result.timed_out:
            outcome = "timeout"
            metrics.PLUGIN_TIMEOUTS.labels(unit).inc()
        else:
            outcome = "error"
            metrics.PLUGIN_ERRORS.labels(unit).inc()
        metrics.child(metrics.PLUGIN_CALLS, unit, outcome).inc()
        if result.stderr:
            log.info("plugin %s wrote to stderr: %s", unit, result.stderr.strip()[:2000])
        if not result.ok:
            log.warning("plugin %s failed: %s", unit, result.error)
