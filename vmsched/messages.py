"""The one contract on the bus: typed requests, replies and results.

The gateway, the services and the agent import these definitions; nothing
else is sent on the scheduling queues. Every request travels in an
:class:`Envelope` that carries its correlation id and absolute deadline.
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field


class Op(str, Enum):
    DISCOVER = "discover"
    FILTER = "filter"
    SCORE = "score"
    BALANCE = "balance"


class Kind(str, Enum):
    FILTER = "filter"
    SCORE = "score"
    BALANCE = "balance"


METHOD_OF_KIND = {Kind.FILTER: "do_filter", Kind.SCORE: "do_score", Kind.BALANCE: "do_balance"}


class Envelope(BaseModel):
    """A request on a bus queue: what to do, for whom, until when."""

    op: str
    deadline: float = Field(description="absolute UNIX time after which nobody waits for the answer")
    body: dict[str, Any] = Field(default_factory=dict)

    def remaining(self, now: float | None = None) -> float:
        return self.deadline - (time.time() if now is None else now)


class ReplyEnvelope(BaseModel):
    ok: bool
    error: str | None = None
    body: dict[str, Any] = Field(default_factory=dict)


BodyT = TypeVar("BodyT", bound=BaseModel)


class TypedReply(BaseModel, Generic[BodyT]):
    """A reply parsed in one pass straight into the operation's reply model."""

    ok: bool
    error: str | None = None
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


class DiscoverRequest(BaseModel):
    pass


class DiscoverReply(BaseModel):
    units: list[UnitInfo] = Field(default_factory=list)
    load_errors: list[PluginLoadError] = Field(default_factory=list)


# --- filter / score / balance ----------------------------------------------


class FilterRequest(BaseModel):
    units: list[str]
    hosts: list[str]
    vm: str = ""
    properties: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = Field(None, gt=0, description="per-call plugin timeout override, seconds")


class ScoreUnit(BaseModel):
    name: str
    factor: int = 1


class ScoreRequest(BaseModel):
    units: list[ScoreUnit]
    hosts: list[str]
    vm: str = ""
    properties: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = Field(None, gt=0)


class BalanceRequest(BaseModel):
    unit: str
    hosts: list[str]
    properties: dict[str, str] = Field(default_factory=dict)
    timeout: float | None = Field(None, gt=0)


class UnitOutcome(BaseModel):
    """The full truth of one unit's call, as the service saw it."""

    unit: str
    ok: bool
    error: str | None = None
    timed_out: bool = False
    duration: float = 0.0
    stderr: str = ""


class FilterOutcome(UnitOutcome):
    kind: Literal["filter"] = "filter"
    hosts: list[str] = Field(default_factory=list, description="hosts the unit kept, as it returned them")


class ScoreOutcome(UnitOutcome):
    kind: Literal["score"] = "score"
    factor: int = 1
    scores: list[tuple[str, float]] = Field(default_factory=list, description="raw (host, score) pairs")


class BalanceOutcome(UnitOutcome):
    kind: Literal["balance"] = "balance"
    vm: str = ""
    hosts: list[str] = Field(default_factory=list)


class FilterReply(BaseModel):
    outcomes: list[FilterOutcome]


class ScoreReply(BaseModel):
    outcomes: list[ScoreOutcome]


class BalanceReply(BaseModel):
    outcome: BalanceOutcome
