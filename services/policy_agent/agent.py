"""The policy agent: one per hypervisor.

Wires the libvirt connection (events, reconnect), the enforcer (pools, pins), a
worker that turns events into verify/repair jobs, a periodic sweep, the
checkpoint, the local socket and (optionally) the bus.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import libvirt

from vmsched import cpuset
from vmsched.facts.subscription import SnapshotListener
from vmsched.bus.interface import Transport

from . import metrics
from .adaptive.loop import TunerLoop, explain
from .enforce.enforcer import Enforcer
from .enforce.jobs import JobQueue
from .enforce.transient import TransientPolicies
from .errors import AgentError, ApplyError, PolicyError
from .facts.reporter import FactsReporter
from .guests.inventory import Inventory
from .plural import plural
from .policy import deps
from .policy.allocation import Pools, plan_pool
from .policy.model import GuestPolicy, parse_policy_partial
from .state import checkpoint, store
from .surfaces.bus import AgentBus
from .surfaces.socket import SocketServer
from .tuners.config import TunerConfig
from .virt import hostlock, metadata
from .virt.apply import Applier, Caps
from .virt.collector import Collector
from .virt.connection import DomainEvent, LibvirtConnection
from .virt.host import host_uuid, read_topology
from .virt.lifecycle import start_in_order, stop_in_order

log = logging.getLogger("vmsched.agent")

#: lifecycle events that need the guest verified, and their debounce (s)
LIFECYCLE_JOBS = {"started": 0.0, "defined": 0.0, "undefined": 0.0, "stopped": 0.0}
LATENCY_TRIGGERS = {"started", "reboot", "tunable", "defined", "metadata"}


def _libvirt_errors(fn: Callable[..., dict]) -> Callable[..., dict]:
    """An operation's libvirt error becomes an ApplyError: the surfaces never see libvirt types."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> dict:
        try:
            return fn(*args, **kwargs)
        except libvirt.libvirtError as exc:
            raise ApplyError(f"libvirt: {exc.get_error_message()}") from exc

    return wrapper


class Agent:
    def __init__(
        self,
        uri: str,
        host_id: str | None,
        state_dir: Path,
        transport: Transport | None,
        dedicated_pool: str | None = None,
        socket_path: Path | None = None,
        reconcile_interval: float = 10.0,
        release_on_stop: bool = False,
        connect_timeout: float = 30.0,
        reboot_debounce: float = 0.1,
        tunable_debounce: float = 0.05,
        lock_dir: Path | None = None,
        facts_interval: float = 5.0,
        tuner: TunerConfig | None = None,
        opener: Callable[[str], "libvirt.virConnect"] = libvirt.open,
    ):
        self.uri = uri
        self.host_id = host_id
        self.state_dir = Path(state_dir)
        self.requested_pool = dedicated_pool
        self.socket_path = Path(socket_path) if socket_path else self.state_dir / "agent.sock"
        self.reconcile_interval = reconcile_interval
        self.release_on_stop = release_on_stop
        self.connect_timeout = connect_timeout
        self.reboot_debounce = reboot_debounce
        self.tunable_debounce = tunable_debounce
        self.lock_dir = Path(lock_dir or os.environ.get(hostlock.ENV) or hostlock.DEFAULT_LOCK_DIR)
        self.machine: str | None = None  # libvirt's host UUID: what host state and the host lock are keyed to
        self._lock: hostlock.HostLock | None = None
        self.checkpoint_path = self.state_dir / checkpoint.FILENAME
        self.inventory = Inventory()
        self.jobs = JobQueue()
        self.events: collections.deque[tuple[str, dict]] = collections.deque(maxlen=2000)
        # opener: how the connection is opened (tests: a recorded host's capabilities)
        self.connection = LibvirtConnection(uri, self._on_event, self._on_connect, opener=opener)
        self.enforcer: Enforcer = None  # type: ignore[assignment]  # made by start(), before any request is served
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server = SocketServer(self.socket_path)
        self._bus: AgentBus | None = None
        self._transport = transport  # the bus (None: the local socket only); its opener owns it
        self.facts_interval = facts_interval  # seconds between host facts (0: off); published on the bus only
        self._facts: FactsReporter | None = None
        self._snapshots: SnapshotListener | None = None
        self.started = False
        self.tuner_config, self._tuner = tuner or TunerConfig(), None  # type: TunerConfig, TunerLoop | None

    # --- lifecycle ---------------------------------------------------------------
    def start(self) -> "Agent":
        """Connect, rebuild or load host state, reconcile every guest, then serve. Cleans up if it fails."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "Agent":
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._server.start()  # bound first: the QEMU hook tells "starting" from "none"
        conn = self.connection.connect(self.connect_timeout)
        self.machine = host_uuid(conn) or conn.getHostname()  # libvirt's host UUID, else its hostname
        self.host_id = self.host_id or self.machine
        self._lock = hostlock.HostLock(self.lock_dir, self.machine, conn.getURI())
        self._lock.acquire({"host_id": self.host_id, "state_dir": str(self.state_dir.resolve()), "uri": self.uri,
                            "socket": str(self.socket_path)})
        caps = Caps.detect(conn)
        topology = read_topology(conn)
        cpus = topology.online
        log.info("host CPUs %s: %s", cpuset.fmt(cpus), topology.describe())
        found = checkpoint.load_or_rebuild(self.checkpoint_path, self.machine, cpus)
        pools = found.pools
        pools.topology = topology
        if found.previous_host_id is not None and found.previous_host_id != self.host_id:
            log.warning("host ID changed from %r to %r: keeping this machine's (%s) pool and allocations; the bus"
                        " queue is now vmsched.agent.%s", found.previous_host_id, self.host_id, self.machine,
                        self.host_id)
        if found.quarantined is not None:
            log.warning("checkpoint %s unusable (%s); moved to %s; rebuilding host state from the guests'"
                        " metadata and live pins", self.checkpoint_path, found.reason, found.quarantined)
            metrics.ERRORS.labels("checkpoint").inc()
        elif found.rebuild:
            log.info("no checkpoint at %s; building host state from the guests", self.checkpoint_path)
        stored = store.PolicyStore(self.state_dir / store.FILENAME).load()
        if stored.problem is not None:
            metrics.ERRORS.labels("store").inc()
        self.enforcer = Enforcer(self.machine, pools, self.inventory, Applier(caps, topology.cpumap_length, cpus),
                                 self._publish, self._save, TransientPolicies(stored), self.release_on_stop)
        snaps = self.enforcer.scan(conn)
        for snap in snaps:
            self.enforcer.observe(snap)
        if self.requested_pool is not None:
            wanted = _parse_pool(self.requested_pool, cpus)
            if found.rebuild:
                if errors := pools.check_pool(wanted):
                    raise PolicyError(errors)
                pools.pool = wanted
            elif wanted != pools.pool:
                log.info("dedicated pool changes from %r to %r", cpuset.fmt(pools.pool), cpuset.fmt(wanted))
                self.enforcer.adopt_pools(plan_pool(pools, wanted, self.inventory.all(), self.release_on_stop))
        elif found.rebuild:
            pools.pool = checkpoint.pool_from_hints((g.hint for g in self.inventory.all()), self.machine, pools)
        summary = self.enforcer.sweep(conn, trigger="start", snaps=snaps, confine=True)
        self._save()
        log.info("agent for host %s on %s: %s, %d managed, pool %r, %d repaired at start", self.host_id,
                 self.uri, plural(summary["checked"], "guest"), self.inventory.managed(), cpuset.fmt(pools.pool),
                 summary["repaired"])
        self._spawn(self._work_loop, "agent-worker")
        self._spawn(self._sweep_loop, "agent-sweeper")
        self._tuner = TunerLoop(self.tuner_config, self.enforcer, lambda: self.conn, self._publish).start()
        self._server.serve(self)
        if self._transport is not None:
            self._bus = AgentBus(self._transport, self.host_id, self)
            self._bus.start()
            if self.facts_interval > 0:  # host facts every interval, on lifecycle events, at once when asked
                self._facts = FactsReporter(self.host_id, Collector(), lambda: self.conn, self._layout,
                                            self._bus.publish, self.facts_interval)
                self._facts.start()
                self._snapshots = SnapshotListener(self._transport, self.host_id,
                                                   functools.partial(self._facts.trigger, "snapshot"))
                self._snapshots.start()
        self.started = True
        return self

    def _layout(self) -> tuple[frozenset[int], frozenset[int], dict[str, frozenset[int]], dict[str, Any]]:
        with self.enforcer.lock:
            pools = self.enforcer.pools
            stored = self.enforcer.transient.store.all()
            policies = {**{e.uuid: e.policy for e in stored}, **{g.uuid: g.policy for g in self.inventory.all()
                                                                  if g.policy is not None}}
            return frozenset(pools.pool), frozenset(pools.shared), dict(pools.allocations), policies

    def stop(self) -> None:
        self._stop.set()
        self.jobs.close()
        for part in (self._tuner, self._snapshots, self._facts, self._bus, self._server):
            if part is not None:
                part.stop()
        for t in self._threads:
            t.join(5)
        self.connection.close()
        if self.started:
            self._save()
        if self._lock is not None:
            self._lock.release()
        self.started = False

    def _spawn(self, target: Any, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    # --- state -------------------------------------------------------------------
    @property
    def conn(self) -> "libvirt.virConnect":
        return self.connection.conn

    @property
    def pools(self) -> Pools:
        return self.enforcer.pools

    def _save(self) -> None:
        assert self.host_id and self.machine
        try:
            ckpt = checkpoint.Checkpoint.of(self.machine, self.host_id, self.enforcer.pools)
            checkpoint.save(self.checkpoint_path, ckpt)
        except OSError as exc:
            metrics.ERRORS.labels("checkpoint").inc()
            log.error("cannot write checkpoint %s: %s", self.checkpoint_path, exc)

    def _publish(self, event: str, body: dict) -> None:
        body = {"host_id": self.host_id, **body}
        self.events.append((event, body))
        if self._bus is not None:
            self._bus.publish(event, body)

    # --- events ------------------------------------------------------------------
    def _on_event(self, ev: DomainEvent) -> None:
        """libvirt event thread: update cached state at once, queue the verification."""
        if ev.kind == "lifecycle":
            self.inventory.on_event(ev.uuid, ev.name, ev.event)
            self._publish("lifecycle", {"guest": ev.name, "uuid": ev.uuid, "event": ev.event,
                                        "detail": ev.detail, "time": time.time()})
            if self._facts is not None:
                self._facts.trigger("event")  # guest count and memory change now, not at the next interval
            if ev.event in LIFECYCLE_JOBS:
                self.jobs.put(ev.uuid, ev.event, ev.received, LIFECYCLE_JOBS[ev.event], ev.name)
        elif ev.kind == "reboot":
            self.jobs.put(ev.uuid, "reboot", ev.received, self.reboot_debounce, ev.name)
        elif ev.kind == "tunable" or (ev.kind == "metadata" and ev.params.get("nsuri") in (metadata.NS, None)):
            self.jobs.put(ev.uuid, ev.kind, ev.received, self.tunable_debounce, ev.name)

    def _on_connect(self, conn: "libvirt.virConnect", reconnected: bool) -> None:
        if self.enforcer is not None and reconnected:
            self.enforcer.sweep(conn, trigger="reconnect")

    def _work_loop(self) -> None:
        while not self._stop.is_set():
            if (job := self.jobs.get(timeout=1.0)) is None:
                continue
            try:
                received = job.first_event if job.trigger in LATENCY_TRIGGERS else None
                self.enforcer.process(self.conn, job.key, job.trigger, received, drift="tunable" in job.triggers)
            except AgentError as exc:
                log.warning("%s event for %s not handled: %s (the next sweep covers it)", job.trigger, job.name, exc)
            except libvirt.libvirtError as exc:
                metrics.ERRORS.labels("libvirt").inc()
                log.warning("%s event for %s: libvirt error %s", job.trigger, job.name, exc.get_error_message())
                self.connection.check_alive()
            except Exception:  # noqa: BLE001 - the worker must survive
                log.exception("handling %s of %s failed", job.trigger, job.name)
            finally:
                self.jobs.done()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.reconcile_interval):
            if not self.connection.connected.is_set() or not self.connection.check_alive():
                continue
            try:
                self.reconcile()
            except (AgentError, libvirt.libvirtError) as exc:
                log.warning("reconcile sweep failed: %s", exc)
                self.connection.check_alive()
            except Exception:  # noqa: BLE001
                log.exception("reconcile sweep failed")

    # --- API ---------------------------------------------------------------------
    @_libvirt_errors
    def set_policy(self, guest: str, policy: GuestPolicy | dict) -> dict:
        policy, problems = parse_policy_partial(policy)
        return self.enforcer.set_policy(self.conn, guest, policy, problems)

    @_libvirt_errors
    def get_policy(self, guest: str) -> dict:
        with self.enforcer.lock:
            g = self.enforcer.observe(self.enforcer.read(self.enforcer.lookup(self.conn, guest)))
            return self.enforcer.view(g)

    def explain_policy(self, guest: str) -> dict:
        view = self.get_policy(guest)
        return explain(self._tuner, self.inventory.get(view["uuid"]), view)

    @_libvirt_errors
    def delete_policy(self, guest: str) -> dict:
        return self.enforcer.delete_policy(self.conn, guest)

    @_libvirt_errors
    def list_policies(self) -> dict:
        with self.enforcer.lock:
            views = [self.enforcer.view(g) for g in self.inventory.all() if g.policy is not None]
            views += self.enforcer.transient.absent_views(self.inventory)
            return {"policies": sorted(views, key=lambda v: v["guest"])}

    def cpus(self) -> dict:
        with self.enforcer.lock:
            uses: dict[int, list[str]] = {}  # what each dedicated CPU runs, as enforced
            for g in self.inventory.all():
                held = self.pools.allocations.get(g.uuid)
                if held and g.desired is not None:
                    for i, cpus in sorted((g.desired.vcpus or {}).items()):
                        if len(cpus) == 1 and cpus <= held:
                            uses.setdefault(min(cpus), []).append(f"vcpu{i}")
                    if g.desired.emulator is not None and g.desired.emulator <= held:
                        for cpu in g.desired.emulator:
                            uses.setdefault(cpu, []).append("emulator")
            view = self.pools.topology_view({c: ",".join(u) for c, u in uses.items()})
            return {"host_id": self.host_id, **self.pools.view(), "topology": view}

    @_libvirt_errors
    def set_pool(self, pool: str | None) -> dict:
        wanted = _parse_pool(pool, self.pools.host_cpus)
        with self.enforcer.lock:
            self.enforcer.adopt_pools(plan_pool(self.pools, wanted, self.inventory.all(), self.release_on_stop))
            log.info("dedicated pool set to %r; re-pinning guests", cpuset.fmt(wanted))
            self.enforcer.sweep(self.conn, trigger="pool", confine=True)
            return self.cpus()

    @_libvirt_errors
    def reconcile(self) -> dict:
        """One sweep; then the checkpoint file is compared with the allocations, and rewritten when they differ."""
        summary = self.enforcer.sweep(self.conn)
        assert self.machine
        with self.enforcer.lock:
            if why := checkpoint.mismatch(self.checkpoint_path, self.machine, self.enforcer.pools):
                metrics.ERRORS.labels("checkpoint").inc()
                log.warning("checkpoint %s does not hold the allocations (%s); rewriting it", self.checkpoint_path, why)
                self._save()
        return summary

    def check_start(self, guest: str, xml: str | None = None) -> tuple[bool, str]:
        """May ``guest`` start now? From the event-fed cache only (the hook asks while libvirtd waits)."""
        ok, message, _ = self.check_start_detail(guest, xml)
        return ok, message

    def check_start_detail(self, guest: str, xml: str | None = None) -> tuple[bool, str, list[str]]:
        policy = None
        if xml:
            try:
                elem = metadata.find(ET.fromstring(xml))
                policy = metadata.from_element(elem)[0] if elem is not None else GuestPolicy()
            except (ET.ParseError, PolicyError) as exc:
                log.warning("check_start %s: domain XML unusable (%s); using the cached policy", guest, exc)
        return self.inventory.check_start(guest, policy)

    @_libvirt_errors
    def start_domain(self, guest: str, wait: float = 60.0) -> dict:
        """Start ``guest`` after its requirements (transitively, in order, each until it runs)."""
        target, order = self._plan(guest, deps.start_order)
        # no lock held from here: the QEMU hook calls back into this agent
        return start_in_order(self.inventory, lambda: self.conn, order, target, wait)

    @_libvirt_errors
    def stop_domain(self, guest: str, wait: float = 60.0, force: bool = False) -> dict:
        """Shut ``guest`` down after every guest that requires it (dependents first)."""
        _, order = self._plan(guest, deps.stop_order)
        return stop_in_order(self.inventory, lambda: self.conn, order, wait, force)

    def _plan(self, guest: str, plan: Callable[..., list[str]]) -> tuple[str, list[str]]:
        """(the guest's UUID, the guests to start or stop, in order), with the guest verified first."""
        with self.enforcer.lock:
            target = self.enforcer.lookup(self.conn, guest).UUIDString()
            self.enforcer.process(self.conn, target, "request", None)
            return target, plan(self.inventory.graph(), target, self.inventory.name_of)

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until every queued event has been handled (tests, benchmarks)."""
        return self.jobs.wait_idle(timeout)

    def status(self) -> dict:
        return {"host_id": self.host_id, "uri": self.uri, "connected": self.connection.connected.is_set(),
                "pid": os.getpid()}


def _parse_pool(text: str | None, host: frozenset[int]) -> frozenset[int]:
    if text is None or str(text).strip().lower() in ("", "none"):
        return frozenset()
    try:
        return cpuset.parse(text, host=host)
    except cpuset.CpuSetError as exc:
        raise PolicyError(f"dedicated pool {text.strip()}: {exc}") from None
