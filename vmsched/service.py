"""What every plugin-running service shares: a pool, a catalog, bus routes.

A concrete service (discovery, scoring, balancer) only declares its queues
(``QUEUES``, queue -> handler method) and writes the handlers; starting the plugin workers, watching the plugins folder, running
units in parallel under their timeouts and counting plugin metrics is here.
"""

from __future__ import annotations

import logging
import pwd
from dataclasses import replace
from typing import Any, Callable, ClassVar

from vmsched import metrics
from vmsched.facts.subscription import FactsSubscriber
from vmsched.bus.interface import Transport, Worker
from vmsched.bus.rabbitmq.journal import default_dir
from vmsched.bus.replies import Handler
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.config import Settings, parse_factors
from vmsched.words import counted
from vmsched.engine_link import facts_cache
from vmsched.facts.cache import NO_CACHE, FactsCache, cause
from vmsched.messages import Envelope, Kind, MissingFacts
from vmsched.runtime import Catalog, PluginPool
from vmsched.runtime.types import CallResult, Confinement, Limits
from vmsched.runtime.units import UnitRun, UnitRunner
from vmsched.whatif.format import InputsItem
from vmsched.whatif.replay import Change, Policy
from vmsched.whatif.shadow import Shadow, ShadowCall
from vmsched.whatif.writer import RecordWriter, record_writer

log = logging.getLogger("vmsched.service")

#: Niceness added to a shadow candidate's plugin workers: they run on what CPU the live calls leave.
SHADOW_NICE = 10

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


def shadow_for(settings: Settings, service: str, transport: Transport) -> Shadow | None:
    """With ``--shadow``: the service's shadow candidate (its folder, then the stock plugins as the live policy
    has them), in the services' sandbox; not started."""
    if settings.shadow is None:
        return None
    limits, confinement = plugin_sandbox(settings)
    limits = replace(limits, nice=SHADOW_NICE)  # the candidate's workers yield the CPU to the live ones
    also = settings.model_copy(update={"plugins_dir": settings.shadow}).plugin_folders[1:]  # stock plugins too?
    policy = Policy(settings.shadow, limits, confinement, settings.shadow_workers, settings.timeout_for,
                    name=f"{service}-shadow", bundle_seconds=settings.plugin_bundle_ms / 1000, also=also)
    change = Change(parse_factors(settings.shadow_factors), drop=frozenset(_items(settings.shadow_drop)))
    return Shadow(policy, service, transport.events(service), change, rate=settings.shadow_rate,
                  depth=settings.shadow_queue, threads=settings.shadow_workers, rescan=settings.rescan_interval)


def missing_facts(runs: list[UnitRun], hosts: list[str], vm: str = "") -> MissingFacts | None:
    """What the request's units that read host facts lacked (the call's facts know which hosts had none, and
    why), or None when they lacked nothing."""
    readers = [run for run in runs if run.read_facts]
    if not readers:
        return None
    facts = readers[0].facts  # one request's calls share its facts
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
    return MissingFacts(units=[run.name for run in readers], hosts=causes, vm=problem)


class PluginService:
    name = "service"
    runs_units = True  # False: the pool only analyses plugin files
    #: The queues this service consumes, each with the name of its handler method:
    #: the one declaration that the runner, the CLI and the deploy tests read.
    QUEUES: ClassVar[dict[str, str]] = {}
    #: Keep a host facts cache and attach facts to plugin calls (docs/facts.md).
    uses_facts: ClassVar[bool] = False

    def __init__(self, settings: Settings, transport: Transport, pool_size: int | None = None,
                 pool_bounds: tuple[int, int] | None = None, log_plugins: bool = True,
                 recording: RecordWriter | None = None) -> None:
        """A service on ``transport``, the process's bus (the runner's). ``pool_size`` fixes the plugin pool's size,
        ``pool_bounds`` sets (fewest, most); else the settings'. ``log_plugins``: log plugin loads and load errors
        (one service of a process does). ``recording``: the process's recording (the runner's); else, with
        ``--record``, one of its own."""
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
        self.runner = UnitRunner(self.catalog, self.pool, settings.timeout_for, self._observe)
        #: with --record: the process's recording (the runner's, shared), else one of its own
        self.recording = recording or (record_writer(settings, self.name) if self.runs_units else None)
        self._own_recording = recording is None and self.recording is not None
        #: with --shadow: a candidate policy run beside the live one (vmsched.whatif.shadow)
        self.shadow = shadow_for(settings, self.name, transport) if self.runs_units else None
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
        if self._own_recording:
            self.recording.start()  # type: ignore[union-attr]
        if self.shadow is not None:
            self.shadow.start()
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
        if self.shadow is not None:
            self.shadow.stop()
        if self._own_recording:
            self.recording.stop()  # type: ignore[union-attr]

    # --- running units -----------------------------------------------------
    def call_facts(self, env: Envelope, facts: Callable[[], Any] | None) -> tuple[Callable[[], Any] | None, bool]:
        """The builder of a call's facts, and whether the shadow takes the call. A call that is recorded
        (``Envelope.record``, with ``--record``) or shadowed has its facts built now, once: the recording and the
        candidate get what the live units could read, whether or not they read it (vmsched.whatif)."""
        shadowed = self.shadow is not None and self.shadow.sampled()
        recorded = env.record and self.recording is not None
        if facts is None or not (shadowed or recorded):
            return facts, shadowed
        built = facts()
        if recorded:
            self.recording.submit(InputsItem(env.call, self.name, built))  # type: ignore[union-attr]
        return (lambda: built), shadowed

    def run_units(
        self, kind: Kind, names: list[str], args: tuple[Any, ...], deadline: float, timeout: float | None,
        facts: Callable[[], Any] | None = None,
    ) -> list[UnitRun]:
        """Run every named unit of ``kind`` in parallel (:meth:`UnitRunner.run`)."""
        return self.runner.run(kind, names, args, deadline, timeout, facts)

    def shadowed(self, env: Envelope, kind: Kind, hosts: list[str], vm: str, properties: dict[str, str],
                 units: list[tuple[str, int]], facts: Callable[[], Any] | None, live: list[Any]) -> None:
        """Give an answered call to the shadow candidate (:meth:`call_facts` said it takes it); returns at once."""
        self.shadow.offer(ShadowCall(  # type: ignore[union-attr]
            env.call, kind.value, hosts, vm, properties, units, facts() if facts is not None else None,
            [o.model_copy() for o in live]))

    def facts_for(self, hosts: list[str], vm: str = "", with_guests: bool = False) -> Any:
        """The host facts of one request's plugin calls (None without a cache): a vmsched.facts.wire.PreparedFacts."""
        return None if self.facts is None else self.facts.prepared(hosts, vm, with_guests)

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
