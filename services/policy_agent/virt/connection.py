"""The libvirt connection: default event loop, domain events, keepalive,
close callback and reconnection with bounded backoff.

libvirt needs one event implementation per process, registered before the
connections that want events are opened, and a thread running it; both are
set up once by :func:`ensure_event_loop`. Callbacks run on that thread: they
only timestamp the event and hand it to the agent (``sink``), never calling
libvirt themselves.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import libvirt

from .. import metrics
from ..errors import AgentUnavailable
from ..plural import plural

log = logging.getLogger(__name__)

_loop_lock = threading.Lock()
_loop_started = False


def _quiet(_ctx: Any, _err: Any) -> None:
    """libvirt prints every error on stderr by default; the agent logs them itself."""


def ensure_event_loop() -> None:
    """Register libvirt's default event implementation and run it on a daemon thread (once)."""
    global _loop_started
    with _loop_lock:
        if _loop_started:
            return
        libvirt.registerErrorHandler(_quiet, None)
        libvirt.virEventRegisterDefaultImpl()
        threading.Thread(target=_run_loop, name="libvirt-event-loop", daemon=True).start()
        _loop_started = True


def _run_loop() -> None:
    while True:
        try:
            libvirt.virEventRunDefaultImpl()
        except Exception:  # noqa: BLE001 - the loop must survive anything
            log.exception("libvirt event loop iteration failed")
            time.sleep(0.1)


#: libvirt's lifecycle event number -> its name (``VIR_DOMAIN_EVENT_STARTED`` -> "started")
LIFECYCLE_NAMES = {getattr(libvirt, f"VIR_DOMAIN_EVENT_{name.upper()}"): name for name in metrics.LIFECYCLE_EVENTS}


@dataclass
class DomainEvent:
    kind: str  # lifecycle | reboot | tunable | metadata
    uuid: str
    name: str
    event: str  # lifecycle event name, or the kind
    detail: int = 0
    params: dict[str, Any] = field(default_factory=dict)
    received: float = field(default_factory=time.monotonic)


KEEPALIVE = (5, 3)  # libvirt keepalive: a probe every 5 s, the connection dead after 3 unanswered


class LibvirtConnection:
    """One libvirt connection that stays open: reopened after a loss.

    ``sink(event)`` receives domain events; ``on_connect(conn, reconnected)``
    runs on the reconnect thread after every successful (re)open, so the agent
    can reconcile what it missed. ``opener`` opens a connection to a URI:
    ``libvirt.open``, or in tests a connection that stands for a host the
    machine is not (tests/agent/recorded_host.py).
    """

    def __init__(
        self,
        uri: str,
        sink: Callable[[DomainEvent], None],
        on_connect: Callable[["libvirt.virConnect", bool], None],
        opener: Callable[[str], "libvirt.virConnect"] = libvirt.open,
    ):
        self.uri = uri
        self.opener = opener
        self.sink = sink
        self.on_connect = on_connect
        self._conn: libvirt.virConnect | None = None
        self._callbacks: list[int] = []
        self._lock = threading.Lock()
        self._lost = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()
        self.last_error: str | None = None

    # --- public ----------------------------------------------------------------
    @property
    def conn(self) -> "libvirt.virConnect":
        conn = self._conn
        if conn is None:
            raise AgentUnavailable(f"not connected to libvirt at {self.uri}: {self.last_error or 'connecting'}")
        return conn

    def connect(self, timeout: float) -> "libvirt.virConnect":
        """Open the first connection, retrying with backoff for up to ``timeout`` seconds."""
        ensure_event_loop()
        deadline = time.monotonic() + timeout
        attempt = 0
        while (conn := self._try_open(attempt, "cannot connect to libvirt at %s (%s); retrying in %.2f s",
                                      deadline)) is None:
            attempt += 1
        self._thread = threading.Thread(target=self._reconnect_loop, name="libvirt-reconnect", daemon=True)
        self._thread.start()
        return conn

    def mark_lost(self, reason: str) -> None:
        """Declare the connection dead (close callback, or a failed call on a dead link)."""
        if self._stopping.is_set():
            return
        if not self._lost.is_set():
            log.warning("libvirt connection to %s lost: %s", self.uri, reason)
        self.last_error = reason
        self.connected.clear()
        metrics.CONNECTED.set(0)
        self._lost.set()

    def check_alive(self) -> bool:
        conn = self._conn
        try:
            alive = conn is not None and conn.isAlive() == 1
        except libvirt.libvirtError:
            alive = False
        if not alive and conn is not None:
            self.mark_lost("connection is no longer alive")
        return alive

    def close(self) -> None:
        self._stopping.set()
        self._lost.set()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            self._teardown()
        self.connected.clear()
        metrics.CONNECTED.set(0)

    # --- internals -------------------------------------------------------------
    def _try_open(self, attempt: int, retry: str, deadline: float | None = None) -> "libvirt.virConnect | None":
        """A new connection, or None after waiting the backoff of ``attempt`` (logged with ``retry``); raises
        AgentUnavailable when the wait would pass ``deadline``."""
        try:
            return self._open()
        except libvirt.libvirtError as exc:
            self.last_error = exc.get_error_message()
        delay = min(15.0, 0.25 * (2 ** min(attempt, 16)))  # 0.25, 0.5, 1, 2 ... bounded by 15 s
        if deadline is not None and time.monotonic() + delay > deadline:
            raise AgentUnavailable(f"cannot connect to libvirt at {self.uri}: {self.last_error}") from None
        log.warning(retry, self.uri, self.last_error, delay)
        self._stopping.wait(delay)
        return None

    def _open(self) -> "libvirt.virConnect":
        conn = self.opener(self.uri)
        try:
            conn.setKeepAlive(*KEEPALIVE)
        except libvirt.libvirtError as exc:  # the test driver has no keepalive
            log.info("libvirt keepalive not available on %s: %s", self.uri, exc.get_error_message())
        try:
            conn.registerCloseCallback(self._on_close, None)
        except libvirt.libvirtError as exc:
            log.info("libvirt close callback not available on %s: %s", self.uri, exc.get_error_message())
        ids = [
            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._on_lifecycle, None),
            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_REBOOT, self._on_reboot, None),
            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_TUNABLE, self._on_tunable, None),
            conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_METADATA_CHANGE, self._on_metadata, None),
        ]
        with self._lock:
            self._conn, self._callbacks = conn, ids
        self.last_error = None
        self._lost.clear()
        self.connected.set()
        metrics.CONNECTED.set(1)
        log.info("connected to libvirt at %s", self.uri)
        return conn

    def _teardown(self) -> None:
        conn, self._conn = self._conn, None
        ids, self._callbacks = self._callbacks, []
        if conn is None:
            return
        deregister = [functools.partial(conn.domainEventDeregisterAny, cid) for cid in ids]
        for undo in [*deregister, conn.unregisterCloseCallback, conn.close]:
            with contextlib.suppress(libvirt.libvirtError):
                undo()

    def _reconnect_loop(self) -> None:
        while not self._stopping.is_set():
            self._lost.wait()
            if self._stopping.is_set():
                return
            with self._lock:
                self._teardown()
            attempt = 0
            while not self._stopping.is_set():
                conn = self._try_open(attempt, "reconnecting to libvirt at %s failed (%s); next try in %.2f s")
                if conn is None:
                    attempt += 1
                    continue
                metrics.RECONNECTS.inc()
                log.info("reconnected to libvirt at %s after %s; reconciling", self.uri,
                         plural(attempt, "failed attempt"))
                try:
                    self.on_connect(conn, True)
                except Exception:  # noqa: BLE001
                    log.exception("reconcile after reconnect failed")
                break

    # --- callbacks (event-loop thread) -------------------------------------------
    def _on_close(self, conn: "libvirt.virConnect", reason: int, _opaque: Any) -> None:
        names = {
            libvirt.VIR_CONNECT_CLOSE_REASON_ERROR: "I/O error",
            libvirt.VIR_CONNECT_CLOSE_REASON_EOF: "libvirtd closed the connection (EOF)",
            libvirt.VIR_CONNECT_CLOSE_REASON_KEEPALIVE: "keepalive timeout",
        }
        if reason == libvirt.VIR_CONNECT_CLOSE_REASON_CLIENT:
            return
        self.mark_lost(names.get(reason, f"reason {reason}"))

    def _emit(self, kind: str, dom: "libvirt.virDomain", event: str, detail: int = 0, params: dict | None = None) -> None:
        metrics.EVENTS.labels(event).inc()
        try:
            self.sink(DomainEvent(kind, dom.UUIDString(), dom.name(), event, detail, params or {}))
        except Exception:  # noqa: BLE001 - never let an exception into libvirt's loop
            log.exception("handling libvirt %s event failed", event)

    def _on_lifecycle(self, _conn: Any, dom: "libvirt.virDomain", event: int, detail: int, _opaque: Any) -> None:
        self._emit("lifecycle", dom, LIFECYCLE_NAMES.get(event, f"event{event}"), detail)

    def _on_reboot(self, _conn: Any, dom: "libvirt.virDomain", _opaque: Any) -> None:
        self._emit("reboot", dom, "reboot")

    def _on_tunable(self, _conn: Any, dom: "libvirt.virDomain", params: dict, _opaque: Any) -> None:
        self._emit("tunable", dom, "tunable", params=params)

    def _on_metadata(self, _conn: Any, dom: "libvirt.virDomain", mtype: int, nsuri: str, _opaque: Any) -> None:
        self._emit("metadata", dom, "metadata", detail=mtype, params={"nsuri": nsuri})
