"""The optional, read-only engine link (docs/facts.md, "The engine link").

It answers two questions a facts cache cannot answer by itself, from the
oVirt engine's REST API (:mod:`vmsched.engine_link.client`):

- **Which agent is engine host X?** For every agent in the cache, the link
  searches the engine's hosts by that agent's vdsm ID (``hw_id=``; without a
  vdsm ID, by its libvirt host UUID, which is what vdsm registers then). For
  an engine host ID still unknown, it also reads the host
  (``hardware_information.uuid``) and takes the one agent reporting that
  libvirt UUID. Two agents for one host, or two hosts for one agent, map
  nothing (never a guess).
- **What does VM X need?** Its memory (MiB), vCPUs (sockets x cores x
  threads) and CPU pinning policy, for a VM being started.

Nothing here blocks a scheduling request: the answers live in a cache filled
by one background thread. A miss answers "not known yet", queues the
question, and a later call sees the answer. Answers are kept
``ttl`` seconds; an expired VM answer is still served while it is fetched
again, and a mapping is kept until a new search contradicts it. Engine calls
have a bounded timeout; after a failure the link waits ``retry`` seconds.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from prometheus_client import Counter

from vmsched.config import Settings
from vmsched.engine_link.client import ENGINE_ID, EngineClient, EngineError, LinkConfig, load_config, vm_requirements
from vmsched.facts.cache import FactsCache
from vmsched.facts.host_map import load_host_map
from vmsched.metrics import REGISTRY

log = logging.getLogger("vmsched.engine_link")

@functools.cache  # registered with the first link: a process without one exports no empty family
def calls() -> Counter:
    """``vmsched_engine_link_calls_total{service,resource,outcome}``."""
    return Counter("vmsched_engine_link_calls_total", "Engine REST calls of the engine link, by resource and "
                   "outcome (ok, not_found, auth, timeout, error)", ["service", "resource", "outcome"],
                   registry=REGISTRY)

#: Identities of the agents in a cache: agent host ID -> (vdsm ID, libvirt host UUID).
Identities = Callable[[], dict[str, tuple[str, str]]]
#: Most VM answers kept, and most questions waiting (request IDs come from outside).
MAX_VMS = 10000
MAX_PENDING = 1000
#: Seconds between two passes over the cache's agents (only new or expired ones cost an engine call).
PASS_SECONDS = 10.0
#: An agent the engine had no host for is searched again after this long (at most the TTL), seconds, when a
#: request names an engine host ID still unknown (a host added to the engine after the agent's search).
RESEARCH_SECONDS = 60.0
#: Longest wait after failures in a row, seconds.
MAX_RETRY = 120.0


class EngineLink:
    def __init__(self, config: LinkConfig, *, ca: Path | None = None, timeout: float = 5.0, ttl: float = 300.0,
                 retry: float = 5.0, service: str = "service", first_wait: float = 0.5) -> None:
        self.client = EngineClient(config, ca, timeout)
        #: how long a request waits for the engine's first answer about a VM (the engine's first call about a
        #: starting VM is usually runFilters: without the wait, its memory filter would know nothing yet)
        self.first_wait = max(0.0, min(first_wait, timeout))
        self.ttl, self.retry, self.service, self.timeout = ttl, min(retry, ttl), service, timeout
        self.negative = min(ttl, RESEARCH_SECONDS)  # how long "no agent for this engine host" holds
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)  # notified when VM answers (or problems) are stored
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._identities: Identities = dict
        self._hosts: dict[str, str] = {}  # engine host ID -> agent host ID
        self._host_problem: dict[str, tuple[float, str]] = {}  # engine host ID -> (until when, why it has no agent)
        self._agent_hits: dict[str, tuple[str, float, tuple[str, ...]]] = {}  # agent -> (key, when, engine IDs found)
        self._uuid_hits: dict[str, tuple[float, tuple[str, ...]]] = {}  # engine host ID -> (when, agents by UUID)
        self._wanted_hosts: set[str] = set()
        self._vms: OrderedDict[str, tuple[float, dict | None, str]] = OrderedDict()  # id -> (when, answer, problem)
        self._wanted_vms: OrderedDict[str, None] = OrderedDict()
        self._failed_until = 0.0
        self._failures = 0  # failed passes in a row: the wait doubles, up to MAX_RETRY (no login storm)
        self._last_error = ""
        for resource in ("search", "host", "vm"):
            for outcome in ("ok", "not_found", "auth", "timeout", "error"):
                calls().labels(service, resource, outcome)

    # --- lifecycle ------------------------------------------------------------------------
    def start(self, identities: Identities) -> "EngineLink":
        self._identities = identities
        self._thread = threading.Thread(target=self._run, name=f"engine-link-{self.service}", daemon=True)
        self._thread.start()
        log.info("%s: engine link to %s as %s (%s)", self.service, self.client.config.url,
                 self.client.config.username, self.client.config.auth)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout * 2 + 1)
        self.client.close()

    # --- the hot path: dictionary reads, never I/O ------------------------------------------
    def host(self, engine_id: str) -> tuple[str | None, str]:
        """The agent host ID of an engine host ID, or (None, why); a miss asks the engine in the background."""
        agent = self._hosts.get(engine_id)  # no lock: the thread replaces the whole dict, never edits it
        if agent is not None:
            return agent, "engine link"
        now = time.time()
        with self._lock:
            problem = self._host_problem.get(engine_id)
            if problem is not None and problem[0] > now:
                return None, problem[1]
            if len(self._wanted_hosts) < MAX_PENDING:
                self._wanted_hosts.add(engine_id)
        self._wake.set()
        return None, ("the engine link is asking the engine which agent this host is (not known yet"
                      + (f"; last error: {self._last_error}" if self._last_error else "") + ")")

    def mapped(self) -> dict[str, str]:
        """Engine host ID -> agent host ID: every mapping the link holds now (the JSON API lists them)."""
        return dict(self._hosts)  # no lock: the thread replaces the whole dict, never edits it

    def vm(self, vm_id: str) -> tuple[dict[str, Any] | None, str]:
        """The VM's requirements from the engine, or (None, why); a miss or an expired answer is fetched again."""
        now = time.time()
        found = self._vms.get(vm_id)
        if found is not None and now - found[0] <= self.ttl:
            return found[1], found[2]  # a fresh answer, read without the lock
        with self._lock:
            found = self._vms.get(vm_id)
            if found is None or now - found[0] > self.ttl:
                if vm_id not in self._wanted_vms and len(self._wanted_vms) < MAX_PENDING:
                    self._wanted_vms[vm_id] = None
                    self._wake.set()
            if found is None and self.first_wait > 0:  # bounded: the request's thread waits, never the loop
                self._answered.wait_for(lambda: vm_id in self._vms, timeout=self.first_wait)
                found = self._vms.get(vm_id)
            if found is None:
                return None, (f"VM {vm_id!r}: the engine link is asking the engine for its memory and vCPUs (not known "
                              "yet" + (f"; last error: {self._last_error}" if self._last_error else "") + ")")
            return found[1], found[2]

    # --- the background thread -------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(timeout=min(self.ttl, PASS_SECONDS))  # new agents are searched at the next pass
            self._wake.clear()
            if self._stop.is_set():
                break
            wait = self._failed_until - time.time()
            if wait > 0:  # the engine failed a moment ago: questions wait, none is lost
                self._stop.wait(wait)
                self._wake.set()
                continue
            try:
                self._fetch_vms()
                self._map_hosts()
            except EngineError as exc:
                self._failed(exc)
            except Exception:  # a bug must not end the thread
                if self._stop.is_set():
                    break  # the client was closed under a call by stop()
                log.exception("%s: engine link", self.service)
                self._failed(EngineError("error", "internal error (logged)"))
            else:
                self._failures = 0

    def _call(self, resource: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            result = fn(*args)
        except EngineError as exc:
            calls().labels(self.service, resource, exc.kind).inc()
            raise
        calls().labels(self.service, resource, "ok").inc()
        if self._last_error:
            log.info("%s: the engine link works again", self.service)
            self._last_error = ""
        return result

    def _failed(self, exc: EngineError) -> None:
        self._failures += 1
        wait = min(self.retry * 2 ** min(self._failures - 1, 16), max(self.retry, MAX_RETRY))
        self._failed_until = time.time() + wait
        message = f"engine link: {exc}"
        if message != self._last_error:  # once per distinct error, not once per retry
            log.warning("%s: %s (retrying in %g s, then less often while it lasts)", self.service, message, wait)
            self._last_error = message

    def _fetch_vms(self) -> None:
        while True:
            with self._lock:
                if not self._wanted_vms:
                    return
                vm_id = next(iter(self._wanted_vms))
            try:
                answer: dict | None = vm_requirements(self._call("vm", self.client.vm, vm_id))
                problem = ""
            except EngineError as exc:
                if exc.kind != "not_found":
                    with self._lock:  # a VM never answered keeps the error as its problem; a known answer is kept
                        if vm_id not in self._vms:
                            self._vms[vm_id] = (0.0, None, f"VM {vm_id!r}: engine link: {exc}")  # asked again later
                            self._answered.notify_all()
                    raise
                answer, problem = None, f"VM {vm_id!r}: the engine knows no such VM"
            with self._lock:
                self._vms[vm_id] = (time.time(), answer, problem)
                self._vms.move_to_end(vm_id)
                while len(self._vms) > MAX_VMS:
                    self._vms.popitem(last=False)
                self._wanted_vms.pop(vm_id, None)
                self._answered.notify_all()

    def _map_hosts(self) -> None:
        """Search the engine for agents not searched within ``ttl``; read wanted engine hosts still unknown."""
        now = time.time()
        identities = self._identities()
        self._agent_hits = {agent: hit for agent, hit in self._agent_hits.items() if agent in identities}
        # one GET per engine host and TTL, found or not (hosts without agents)
        self._uuid_hits = {engine_id: hit for engine_id, hit in self._uuid_hits.items() if now - hit[0] < self.ttl}
        with self._lock:
            unknown = bool(self._wanted_hosts - set(self._hosts))
        for agent, (vdsm_id, libvirt_uuid) in sorted(identities.items()):
            key = vdsm_id or libvirt_uuid
            hit = self._agent_hits.get(agent)
            if not key or not ENGINE_ID.match(key):
                continue
            if hit and hit[0] == key and now - hit[1] < self.ttl and (
                    hit[2] or not unknown or now - hit[1] < self.negative):
                continue
            hosts = self._call("search", self.client.hosts_by_hw_id, key)
            found = tuple(sorted({str(h["id"]) for h in hosts if h.get("id")}))
            if len(found) > 1:
                log.warning("%s: engine link: engine hosts %s all have hw_id %s (agent %s): none is mapped",
                            self.service, ", ".join(found), key, agent)
            self._agent_hits[agent] = (key, now, found)
        claims: dict[str, set[str]] = {}  # engine host ID -> the agents found for it
        for agent, (_key, _when, found) in self._agent_hits.items():
            for engine_id in found:
                claims.setdefault(engine_id, set()).add(agent if len(found) == 1 else f"{agent} (ambiguous)")
        with self._lock:
            wanted = set(self._wanted_hosts)
        for engine_id in sorted(wanted - set(claims)):
            if engine_id not in self._uuid_hits:
                self._uuid_hits[engine_id] = (now, self._by_hardware_uuid(engine_id, identities))
        for engine_id, (_when, agents) in self._uuid_hits.items():
            if agents:
                claims.setdefault(engine_id, set()).update(agents)
        self._publish(claims, wanted, now)

    def _by_hardware_uuid(self, engine_id: str, identities: dict[str, tuple[str, str]]) -> tuple[str, ...]:
        """The agents whose libvirt host UUID is the engine host's ``hardware_information.uuid``."""
        try:
            host = self._call("host", self.client.host, engine_id)
        except EngineError as exc:
            if exc.kind != "not_found":
                raise
            return ()
        uuid = str((host.get("hardware_information") or {}).get("uuid") or "").lower()
        return tuple(sorted(a for a, (_v, lu) in identities.items() if uuid and lu.lower() == uuid))

    def _publish(self, claims: dict[str, set[str]], wanted: set[str], now: float) -> None:
        hosts: dict[str, str] = {}
        problems: dict[str, tuple[float, str]] = {}
        owners: dict[str, list[str]] = {}
        until = now + self.negative  # asked again after that: the engine or the agents may have changed
        for engine_id, agents in claims.items():
            if len(agents) == 1 and not next(iter(agents)).endswith("(ambiguous)"):
                owners.setdefault(next(iter(agents)), []).append(engine_id)
            else:
                problems[engine_id] = (until, f"the engine link matched engine host {engine_id!r} to more than one "
                                              f"agent or host ({', '.join(sorted(agents))}): not mapped")
        for agent, engine_ids in owners.items():
            if len(engine_ids) == 1:
                hosts[engine_ids[0]] = agent
            else:
                for engine_id in engine_ids:
                    problems[engine_id] = (until, f"the engine link matched agent {agent!r} to several engine hosts "
                                                  f"({', '.join(sorted(engine_ids))}): not mapped")
        for engine_id in wanted - set(hosts) - set(problems):
            problems[engine_id] = (until, f"the engine link found no agent whose vdsm ID (hw_id) or libvirt host UUID "
                                          f"is engine host {engine_id!r}'s")
        with self._lock:
            self._hosts = hosts
            self._host_problem = {k: v for k, v in self._host_problem.items() if v[0] > now and k not in hosts}
            self._host_problem.update(problems)
            self._wanted_hosts -= wanted


def facts_cache(settings: Settings, service: str) -> FactsCache | None:
    """The facts cache of a service or gateway, with its engine link when ``--engine-link-file`` is set."""
    if not settings.facts:
        return None
    link = None
    if settings.engine_link_file is not None:
        link = EngineLink(load_config(settings.engine_link_file), ca=settings.engine_link_ca,
                          timeout=settings.engine_link_timeout, ttl=settings.engine_link_ttl, service=service,
                          first_wait=settings.engine_link_wait)
    cache = FactsCache(service, settings.facts_max_age, load_host_map(settings.facts_host_map), link=link)
    if link is not None:
        link.start(cache.identities)
    return cache
