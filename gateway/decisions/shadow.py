"""The shadow comparisons a gateway keeps beside its decisions: what a candidate plugins folder would have decided.

The services running a shadow candidate publish one :class:`~vmsched.messages.ShadowComparison` per live call on
``vmsched.events`` with the key ``shadow.<service>``. Every gateway binds its own queue
``vmsched.shadow.gateway.<token>`` (12 hex digits, new at each start; at most :data:`KEEP` messages waiting) to
``shadow.*``, so each replica sees every comparison, and keeps the newest :data:`KEEP` by ID (the oldest leave).
A comparison's ID is its call's, which is the decision's ID at the gateway that answered the call.

Every message is validated (:meth:`ShadowComparison.model_validate_json`); one that is not a comparison of this
contract version is counted in :attr:`ShadowStore.invalid` and ``vmsched_shadow_refused_total``, and logged at most
once a minute, never raised.
A subscription of the process's transport: the embedded bus and RabbitMQ alike, reconnecting with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Collection

import prometheus_client
from pydantic import ValidationError

from vmsched.bus.interface import Topic, Transport
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.gateway import replica_messages
from vmsched.messages import SHADOW_KEY, ShadowComparison
from vmsched.metrics import REGISTRY

log = logging.getLogger("vmsched.gateway.shadow")

#: comparisons kept at most (and waiting in the gateway's queue at most)
KEEP = 10000
#: the routing keys of comparisons: ``shadow.<service>``
BINDING = SHADOW_KEY + "*"
#: a message larger than this is refused, bytes
MAX_MESSAGE = 1 << 20
#: seconds between two log lines about invalid messages
LOG_EVERY = 60.0
STATUSES = ("same", "changed", "unknown", "error")

REFUSED = prometheus_client.Counter(
    "vmsched_shadow_refused_total", "Messages on the shadow comparison keys a gateway refused (not a comparison of "
    "its contract version, or too large); each refusal is logged at most once a minute", registry=REGISTRY)


def first_problem(exc: ValidationError, whole: str) -> str:
    """The first problem a validation found, one line: where (``whole`` when it is the whole input) and what."""
    first = exc.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(str(p) for p in first['loc']) or whole}: {first['msg']}"


class ShadowStore:
    """The newest :data:`KEEP` comparisons by ID and the subscription that feeds them."""

    def __init__(self, transport: Transport, size: int = KEEP) -> None:
        self.size = size
        self.queue_name = f"vmsched.shadow.gateway.{replica_messages.new_token()}"
        topic = Topic(self.queue_name, EVENTS_EXCHANGE, (BINDING,), size)
        self.subscription = transport.subscribe("gateway-shadow", topic, self._received)
        self.ready = self.subscription.ready
        self.received = 0  # comparisons kept since start
        self.invalid = 0  # messages refused since start
        self._kept: OrderedDict[str, ShadowComparison] = OrderedDict()  # oldest first
        self._lock = threading.Lock()
        self._unlogged = 0  # invalid messages since the last log line
        self._logged_at = float("-inf")

    def start(self) -> None:
        self.subscription.start()

    def stop(self, timeout: float = 5.0) -> None:
        self.subscription.stop(timeout)

    # --- readers --------------------------------------------------------------------------------------
    def get(self, comparison_id: str) -> ShadowComparison | None:
        with self._lock:
            return self._kept.get(comparison_id)

    def counts(self) -> dict[str, int]:
        """Kept comparisons by status (every status, 0 when none)."""
        with self._lock:
            counts = Counter(c.status for c in self._kept.values())
        return {status: counts[status] for status in STATUSES}

    def recent(self, limit: int = 100, statuses: Collection[str] | None = None, op: str | None = None,
               vm: str | None = None) -> list[ShadowComparison]:
        """The newest ``limit`` comparisons matching every filter given (``statuses``: any of them)."""
        found: list[ShadowComparison] = []
        with self._lock:
            for c in reversed(self._kept.values()):
                if len(found) >= limit:
                    break
                if ((statuses is None or c.status in statuses) and (op is None or c.op == op)
                        and (vm is None or c.vm == vm)):
                    found.append(c)
        return found

    # --- the subscription's thread ---------------------------------------------------------------------
    def keep(self, comparison: ShadowComparison) -> None:
        """Keep ``comparison`` as the newest (one with the same ID is replaced); the oldest leaves past the size."""
        with self._lock:
            self._kept.pop(comparison.id, None)
            self._kept[comparison.id] = comparison
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
            self.received += 1

    def _received(self, body: bytes, routing_key: str) -> None:
        if len(body) > MAX_MESSAGE:
            return self._refuse(routing_key, f"larger than {MAX_MESSAGE} bytes")
        try:
            comparison = ShadowComparison.model_validate_json(body)
        except ValidationError as exc:
            return self._refuse(routing_key, first_problem(exc, "the message"))
        problem = comparison.version_problem()
        if problem is not None:
            return self._refuse(routing_key, problem)
        # the sender is the routing key's: the broker lets each service publish under its own key only
        updates: dict[str, object] = {"service": routing_key.removeprefix(SHADOW_KEY)[:64]}
        if comparison.time <= 0:
            updates["time"] = time.time()
        self.keep(comparison.model_copy(update=updates))

    def _refuse(self, routing_key: str, why: str) -> None:
        """Count an invalid message; log it at most once every LOG_EVERY seconds (with how many since)."""
        self.invalid += 1
        REFUSED.inc()
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY:
            more = f" ({self._unlogged - 1} more since the last such line)" if self._unlogged > 1 else ""
            log.warning("shadow comparison on %s refused: %s%s", routing_key[:80], why[:300], more)
            self._logged_at, self._unlogged = now, 0
