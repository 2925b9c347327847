"""The one contract on the bus: typed requests, replies and results.

The gateway, the services and the agent import these definitions; nothing
else is sent on the scheduling queues. Every request travels in an
:class:`Envelope` that carries its correlation id and absolute deadline.
"""

from __future__ import annotations

import re
import time
from enum import Enum
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class Op(str, Enum):
    DISCOVER = "discover"
    FILTER = "filter"
    SCORE = "score"
    BALANCE = "balance"


class Kind(str, Enum):
    FILTER = "filter"
    SCORE = "score"
    BALANCE = "balance"



#: Version of the bus contract this code speaks (the ``v`` of every message); a reader refuses any other.
CONTRACT_VERSION = 2


class ErrorCode(str, Enum):
    """Why a request failed: the ``code`` of an error reply."""

    INVALID = "invalid"  # the request is malformed or refused (every reason in ``details``)
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"  # what the request needs (e.g. libvirt) cannot be reached
    INTERNAL = "internal"
    UNSUPPORTED_VERSION = "unsupported_version"  # the message's contract version is newer than the reader's


class Versioned(BaseModel):
    """A message with its contract version ``v``."""

    v: int = Field(CONTRACT_VERSION, description="contract version")

    def version_problem(self) -> str | None:
        """Why this reader cannot understand the message, or None."""
        if self.v != CONTRACT_VERSION:
            return (f"contract version {self.v}, and this reader speaks {CONTRACT_VERSION}: run the same vmsched "
                    "version everywhere")
        return None


class Envelope(Versioned):
    """A request on a bus queue: what to do, for whom, until when."""

    op: str
    deadline: float = Field(description="absolute UNIX time after which nobody waits for the answer")
    body: dict[str, Any] = Field(default_factory=dict)
    call: str = Field("", description="the gateway's ID of the call (its decision ID); empty: not a scheduling call")
    record: bool = Field(False, description="the gateway records this call: the service records what its units "
                                            "could read, keyed by ``call`` (vmsched.whatif)")

    def remaining(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)


def request_units(body: dict[str, Any], most: int = 50) -> list[str]:
    """The unit names a filter, score or balance request body names (for an error about the whole request)."""
    named = body.get("units") if isinstance(body.get("units"), list) else [body.get("unit")]
    names = [u.get("name") if isinstance(u, dict) else u for u in named]
    return [n[:200] for n in names if isinstance(n, str)][:most]


class _Reply(Versioned):
    """What every reply says: whether the request was done, and if not, why."""

    ok: bool
    error: str | None = None
    code: str | None = Field(None, description="an ErrorCode when not ok")
    details: list[str] = Field(default_factory=list, description="every reason of a refusal, one per item")


class ReplyEnvelope(_Reply):
    body: dict[str, Any] = Field(default_factory=dict)


BodyT = TypeVar("BodyT", bound=BaseModel)


class TypedReply(_Reply, Generic[BodyT]):
    """A reply parsed in one pass straight into the operation's reply model."""

    body: BodyT | None = None


# --- discovery ------------------------------------------------------------


class UnitInfo(BaseModel):
    name: str
    kind: Kind
    description: str = ""
    validation: str = ""
    plugin: str = Field(description="module name (file stem) defining the unit")
    validation_error: str | None = None


class PluginLoadError(BaseModel):
    plugin: str
    error: str


class DiscoverReply(BaseModel):
    units: list[UnitInfo] = Field(default_factory=list)
    load_errors: list[PluginLoadError] = Field(default_factory=list)
    confinement: dict[str, str] | None = Field(
        None, description="the plugin sandbox of the discovery service's workers: feature -> 'on (...)' or "
                          "'off: why' (docs/plugins.md)")


# --- filter / score / balance ----------------------------------------------


_SURROGATE = re.compile("[\ud800-\udfff]")
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _unicode(value: str) -> str:
    """Refuse lone surrogates: they are not Unicode text, and no JSON or XML encoder can send them."""
    if not value.isascii():
        found = _SURROGATE.search(value)
        if found:
            raise ValueError(f"contains a lone surrogate (U+{ord(found.group()):04X}), which is not valid Unicode")
    return value


#: A string of a request: any Unicode text (length limits are the gateway's settings).
Text = Annotated[str, AfterValidator(_unicode)]
#: A per-call plugin timeout: a finite number of seconds, not a boolean.
Seconds = Annotated[float, Field(strict=True, gt=0, allow_inf_nan=False)]


class _Request(BaseModel):
    """A scheduling request: unknown fields are ignored, but values are checked strictly
    (no ``false`` for a number, no NaN or infinity, no lone surrogates)."""

    model_config = ConfigDict(allow_inf_nan=False)


class FilterRequest(_Request):
    units: list[Text]
    hosts: list[Text]
    vm: Text = ""
    properties: dict[Text, Text] = Field(default_factory=dict)
    timeout: Seconds | None = Field(None, description="per-call plugin timeout override, seconds")


class ScoreUnit(_Request):
    name: Text
    factor: int = Field(1, strict=True, ge=INT32_MIN, le=INT32_MAX,
                        description="weight of the unit's scores, an integer (the engine's int32)")


class ScoreRequest(_Request):
    units: list[ScoreUnit]
    hosts: list[Text]
    vm: Text = ""
    properties: dict[Text, Text] = Field(default_factory=dict)
    timeout: Seconds | None = None


class BalanceRequest(_Request):
    unit: Text
    hosts: list[Text]
    properties: dict[Text, Text] = Field(default_factory=dict)
    timeout: Seconds | None = None


class UnitOutcome(BaseModel):
    """The full truth of one unit's call, as the service saw it."""

    unit: str
    ok: bool
    error: str | None = None
    timed_out: bool = False
    duration: float = 0.0
    stderr: str = ""
    reasons: dict[str, str] = Field(default_factory=dict, description=(
        "host ID -> why, as the unit gave it (vmsched.runtime.contract: bounded, plugin-supplied text; "
        "escape it when shown; never sent to the engine)"))


class FilterOutcome(UnitOutcome):
    kind: Literal["filter"] = "filter"
    hosts: list[str] = Field(default_factory=list, description="hosts the unit kept, as it returned them")


class ScoreOutcome(UnitOutcome):
    kind: Literal["score"] = "score"
    factor: int = 1
    scores: list[tuple[str, float]] = Field(default_factory=list, description="raw (host, score) pairs")


class ScoreOutcomeOnBus(ScoreOutcome):
    """A score outcome as the scoring service sends it on the bus: a unit that scored every requested host once,
    in the request's order, sends only its numbers.

    An infinite score travels as the string ``"Infinity"`` or ``"-Infinity"`` (JSON has no infinity; pydantic's
    default, ``null``, is no number, and the gateway refused the whole reply): read back as a float, the gateway
    gives that host the unit's worst score and reports it (gateway.render). NaN never gets here: it fails its
    unit in the service (vmsched.runtime.contract)."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    values: list[float] | None = Field(None, description=(
        "the unit's score of each requested host, in order (then scores is empty); absent when the unit's "
        "pairs were not exactly the requested hosts"))


class BalanceOutcome(UnitOutcome):
    kind: Literal["balance"] = "balance"
    vm: str = ""
    hosts: list[str] = Field(default_factory=list)
    reason: str = Field("", description="the unit's reason for its proposal (plugin-supplied, as ``reasons``)")


class MissingFacts(BaseModel):
    """The host facts the request's units that read facts lacked (shown by the JSON API, the decision log and the
    console; never sent to the engine)."""

    units: list[str] = Field(description="the request's units whose plugins read host facts")
    hosts: dict[str, list[str]] = Field(default_factory=dict, description=(
        "why hosts had no facts -> those hosts, e.g. {\"no agent reports them\": [...]}"))
    vm: str | None = Field(None, description="why the facts of the request's VM (its memory and vCPUs) are unknown")


_MISSING_FACTS = Field(None, description="what the units that read host facts lacked; absent when they lacked "
                                         "nothing")


class FilterReply(BaseModel):
    outcomes: list[FilterOutcome]
    missing_facts: MissingFacts | None = _MISSING_FACTS


class ScoreReply(BaseModel):
    """A score reply on the bus (:class:`ScoreOutcomeOnBus`); the gateway pairs aligned values with its hosts."""

    outcomes: list[ScoreOutcomeOnBus]
    missing_facts: MissingFacts | None = _MISSING_FACTS


class BalanceReply(BaseModel):
    outcome: BalanceOutcome
    missing_facts: MissingFacts | None = _MISSING_FACTS


# --- shadow comparisons (vmsched.whatif.shadow) ---------------------------------------------------------------

#: Routing key prefix of shadow comparisons on ``vmsched.events``: ``shadow.<service>``.
SHADOW_KEY = "shadow."
#: Hosts a comparison explains at most (those whose result differs).
SHADOW_ROWS = 20
ShadowStatus = Literal["same", "changed", "unknown", "error"]


class ShadowHost(BaseModel):
    """One host of a changed call: each unit's verdict with its reason, and the result, on either side."""

    host: str = Field(max_length=512)
    live: dict[str, str]
    candidate: dict[str, str]


class ShadowComparison(Versioned):
    """A shadow candidate's run of one live call compared with the live decision: an event on
    ``vmsched.events`` (key ``shadow.<service>``), kept by every gateway beside its decisions."""

    service: str = Field("", max_length=64, description="who ran the candidate (set by the event's sender)")
    time: float = Field(0.0, description="when it was published, Unix seconds")
    id: str = Field(max_length=64, description="the call's ID: its decision's ID at the gateway")
    op: Literal["filter", "score", "balance"]
    vm: str = Field("", max_length=512)
    hosts: int = Field(ge=0, description="hosts in the call")
    status: ShadowStatus = Field(description="same, changed, unknown (the candidate lacks a unit) or error (a "
                                             "candidate unit failed or timed out)")
    what: str = Field(max_length=2000, description="one line: what changed, or why unknown or error")
    tie: bool = False
    rank: int | None = Field(None, description="score: the candidate's rank of the host ranked first live")
    unknown: list[str] = Field(default_factory=list, description="units the candidate lacks")
    errors: dict[str, str] = Field(default_factory=dict, description="candidate unit -> its error or timeout")
    candidate: str = Field(max_length=512, description="the candidate: its plugins folder's name")
    change: list[str] = Field(default_factory=list, description="what the candidate changes: factors, units left out")
    seconds: float = Field(ge=0, description="the candidate's run of the call")
    rows: list[ShadowHost] = Field(default_factory=list, max_length=SHADOW_ROWS,
                                   description="changed calls: the hosts whose result differs, explained")
