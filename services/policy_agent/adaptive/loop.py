"""The adaptive-policy loop of the agent: every interval, sample the host and the guests with an adaptive
block, run the tuning engine (tuners/), apply what it decides live, and record every decision (a
structured log line, a metric, a ``tuned`` event on the bus, and ``explain``).

A tuner's change is written as desired state (the overlay in :class:`TunedState`) before libvirt is touched,
so the TUNABLE event it causes finds nothing to repair: no drift is counted and the repair-loop guard
does not trip.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import libvirt

from ..enforce.enforcer import Enforcer, Publish
from ..errors import ApplyError
from ..guests.inventory import Guest
from ..tuners.config import TunerConfig
from ..tuners.engine import Engine
from ..tuners.samples import HostCounter, VcpuCounters, guest_sample, vcpu_counters
from ..tuners.types import Decision, GuestView, Proposal
from ..virt.snapshot import Snapshot
from . import metrics as tm
from .plugins import TunerPlugins

log = logging.getLogger("vmsched.agent.tuner")
STATS = libvirt.VIR_DOMAIN_STATS_STATE | libvirt.VIR_DOMAIN_STATS_CPU_TOTAL | libvirt.VIR_DOMAIN_STATS_VCPU
NOWAIT = getattr(libvirt, "VIR_CONNECT_GET_ALL_DOMAINS_STATS_NOWAIT", 0)


class TunerLoop:
    def __init__(self, config: TunerConfig, enforcer: Enforcer, conn: Callable[[], "libvirt.virConnect"],
                 publish: Publish, proc: Path = Path("/proc")) -> None:
        self.config = config
        self.engine = Engine(config)
        self.state = enforcer.tuned
        self.enforcer = enforcer
        self._conn, self._publish, self._proc = conn, publish, Path(proc)
        self._host = HostCounter()
        self._counters: dict[str, VcpuCounters] = {}
        self._when: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.plugins: TunerPlugins | None = None

    def start(self) -> "TunerLoop":
        if self.config.plugins_dir:
            self.plugins = TunerPlugins(Path(self.config.plugins_dir), self.config.plugin_timeout).start()
        if self.config.interval > 0:
            self._thread = threading.Thread(target=self._loop, name="agent-tuner", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self.plugins is not None:
            self.plugins.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.config.interval):
            try:
                self.run_once()
            except (libvirt.libvirtError, OSError) as exc:
                log.warning("tuner round failed: %s", exc)
            except Exception:  # noqa: BLE001 - the loop must survive
                log.exception("tuner round failed")

    # --- one round -------------------------------------------------------------------
    def run_once(self) -> list[Decision]:
        started = time.perf_counter()
        with self.enforcer.lock:
            known = {g.uuid: g for g in self.enforcer.inv.all()}
            guests = [g for g in known.values()
                      if g.running and g.policy is not None and g.policy.adaptive is not None and g.desired is not None]
        for uuid in [u for u in self.engine.decisions if u not in known]:
            self.engine.forget(uuid)  # the guest is gone: so is what explain kept of it
        now = time.monotonic()
        seconds = now - self._when if self._when is not None else 0.0
        self._when = now
        host = self._host.sample((self._proc / "stat").read_text())
        if not guests:
            self._counters.clear()
            return []
        counters = self._read_counters(guests)
        samples = {uuid: s for uuid, c in counters.items()
                   if (s := guest_sample(self._counters.get(uuid), c, seconds)) is not None}
        self._counters = counters
        if host is not None:
            self.engine.observe(host, samples)
        with self.enforcer.lock:
            shared = frozenset(self.enforcer.pools.shared)
            views = [v for g in guests if g.uuid in counters for v in [self._view(g, counters[g.uuid].run, shared)]
                     if v is not None]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("tuner round: pCPU use %s; guests %s", host.pcpu_pct if host else "(baseline)",
                      {g.name: samples.get(g.uuid) for g in guests})
        inp = self.engine.input(shared, views)
        extra: list[Proposal] = self.plugins.propose(inp, self.config) if self.plugins is not None else []
        decisions = self.engine.step(inp, extra)
        for i, d in enumerate(decisions):
            if d.outcome == "applied":
                decisions[i] = self._apply(d)
                if decisions[i] is not d:
                    self.engine.amend(d, decisions[i])
            self._record(decisions[i])
        tm.ROUND_SECONDS.observe(time.perf_counter() - started)
        return decisions

    def _read_counters(self, guests: list[Guest]) -> dict[str, VcpuCounters]:
        conn = self._conn()
        doms = []
        for g in guests:
            try:
                doms.append(conn.lookupByUUIDString(g.uuid))
            except libvirt.libvirtError:
                continue
        out: dict[str, VcpuCounters] = {}
        if not doms:
            return out
        for dom, record in conn.domainListGetStats(doms, STATS, NOWAIT):
            try:
                out[dom.UUIDString()] = vcpu_counters(record, int(dom.ID()))
            except libvirt.libvirtError:
                continue
        return out

    def _view(self, g: Guest, run: int, shared: frozenset[int]) -> GuestView | None:
        assert g.policy is not None and g.desired is not None
        _, live = self.state.split(g.uuid, g.desired, run, g.policy, shared)
        if live.vcpus is None:
            return None
        quota, period = live.sched.get("vcpu_quota"), live.sched.get("vcpu_period") or 100000
        cap = round(quota * 100.0 / period, 3) if quota is not None and quota > 0 else None
        return GuestView(g.uuid, g.name, g.policy, g.nvcpus, dict(live.vcpus),
                         live.sched.get("cpu_shares", g.policy.base_weight()), cap, period)

    def _apply(self, d: Decision) -> Decision:
        """Write ``d`` as desired state, then bring the live guest to it (no repair is counted: it is not one)."""
        e = self.enforcer
        with e.lock:
            g = e.inv.get(d.uuid)
            try:
                snap: Snapshot = e.read(self._conn().lookupByUUIDString(d.uuid))
                run = snap.run
                if g is None or g.policy is None or g.desired is None or run is None:
                    raise ApplyError("the guest is no longer running with an adaptive policy")
                self.state.set(d.uuid, run, g.policy, d.field, d.after)
                e.verify(snap, g, g.desired)
                return d
            except (ApplyError, libvirt.libvirtError) as exc:
                self.state.drop(d.uuid)
                return Decision(d.time, d.uuid, d.guest, d.tuner, d.field, d.before, d.after,
                                f"applying failed, back to the static policy: {exc} (because: {d.reason})", "error")

    def _record(self, d: Decision) -> None:
        tm.CHANGES.labels(d.tuner, d.field, d.outcome).inc()
        body = {"guest": d.guest, "uuid": d.uuid, **d.view()}
        deferred = d.outcome == "deferred"  # a rate limit: proposed again next interval; counted, not announced
        level = logging.DEBUG if deferred else logging.INFO if d.outcome in ("applied", "dry_run") else logging.WARNING
        log.log(level, "tuner %s", json.dumps(body, sort_keys=True, default=str))
        if not deferred:
            self._publish("tuned", body)



def explain(loop: TunerLoop | None, g: Guest | None, view: dict[str, Any]) -> dict[str, Any]:
    """``explain_policy``: the static policy and desired state (``view``), the tuned values, the decisions."""
    overlay = loop.state.get(g.uuid) if loop is not None and g is not None else None
    decisions = loop.engine.decisions.get(g.uuid, ()) if loop is not None and g is not None else ()
    return {"guest": view.get("guest"), "uuid": view.get("uuid"), "policy": view.get("policy"),
            "desired": view.get("desired"), "tuned": overlay.view() if overlay is not None else {},
            "decisions": [d.view() for d in decisions], "tuner": asdict(loop.config) if loop else {"interval": 0}}

