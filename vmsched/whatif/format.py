"""The recording format: one JSON object a line, its kind in ``k`` (docs/testing-policies.md, "The format").

Independent of the bus messages, and versioned (:data:`VERSION`, in every file's first record). A file holds:

- ``recording`` (first): ``format``, ``version``, the ``writer`` label, ``pid``, ``host``, ``started``;
- ``call`` (a gateway): one engine call: ``id`` (its decision ID), ``time``, ``gateway``, ``method`` and ``args``
  exactly as the engine sent them (but the property keys of ``--record-omit``, named in ``omitted``), ``op``,
  the ``reply`` sent, each unit's outcome (``units``), ``missing_facts``, ``bus_failed`` and ``duration``;
- ``inputs`` (a service): what the units of call ``id`` could read: ``time`` (the service's, from which facts
  ages count), per host the generation of its facts (``hosts``) and of its guest list (``guests``, balance
  calls), ``agents`` (hosts resolved to another agent ID), ``missing``, ``vm`` (with its ``pending``
  placements), ``vm_problem``, and ``cache`` (false: the service keeps no facts);
- ``host`` and ``guests``: one host's facts and one guest list, each written once per generation and file.

Each file stands alone (a host's facts are written again in the next file), so dropping the oldest file loses
nothing of the others. Writers build lines with :class:`CallItem` and :class:`InputsItem` (on the writer's
thread); readers parse them with :func:`parse` (one parser: the pydantic models below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Protocol, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from vmsched.messages import BalanceOutcome, FilterOutcome, ScoreOutcome

FORMAT = "vmsched-recording"
#: Version of the format (the header's ``version``); a reader refuses another.
VERSION = 1
#: The engine's method of each operation.
METHODS = {"filter": "runFilters", "score": "runCostFunctions", "balance": "runLoadBalancing"}


# --- writing ----------------------------------------------------------------------------------------------


@dataclass
class FileState:
    """What the file being written holds already: the generations of host facts and guest lists."""

    hosts: set[int] = field(default_factory=set)
    guests: set[int] = field(default_factory=set)


def header(writer: str, pid: int, host: str, started: float) -> bytes:
    return orjson.dumps({"k": "recording", "format": FORMAT, "version": VERSION, "writer": writer, "pid": pid,
                         "host": host, "started": started}) + b"\n"


def _number(value: float) -> float | str:
    """A score as JSON can carry it: a non-finite one as the string ``"Infinity"``, ``"-Infinity"`` or ``"NaN"``."""
    if math.isfinite(value):
        return value
    return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")


def _unit(o: Any, op: str, hosts: list[str], dropped: set[str] | None) -> dict[str, Any]:
    unit: dict[str, Any] = {"unit": o.unit, "ok": o.ok, "error": o.error, "timed_out": o.timed_out,
                            "duration": o.duration, "reasons": o.reasons}
    if op == "filter":
        unit["dropped"] = [h for h in hosts if h in dropped] if dropped else []
    elif op == "score":
        unit["factor"] = o.factor
        values = getattr(o, "values", None)
        if values is not None and len(values) == len(hosts):
            unit["values"] = [_number(float(v)) for v in values]
        else:
            unit["scores"] = [[h, _number(float(s))] for h, s in o.scores]
    else:
        unit["vm"], unit["hosts"], unit["reason"] = o.vm, o.hosts, o.reason
    return unit


@dataclass(frozen=True, slots=True)
class CallItem:
    """One engine call as a gateway saw it; made into a ``call`` line on the writer's thread.

    ``req``, ``decision`` and ``outcomes`` are the gateway's own objects (a request model, a
    :class:`vmsched.decide.rules.Decision`, the outcomes): nothing changes them once the call is answered.
    """

    call_id: str
    at: float
    gateway: str
    op: str
    req: Any
    decision: Any
    outcomes: Any
    bus_failed: bool
    duration: float
    omit: frozenset[str] = frozenset()

    def record(self) -> dict[str, Any]:
        req, op = self.req, self.op
        hosts = list(req.hosts)
        props = {k: v for k, v in req.properties.items() if k not in self.omit}
        if op == "filter":
            args: list[Any] = [list(req.units), hosts, req.vm, props]
        elif op == "score":
            args = [[[u.name, u.factor] for u in req.units], hosts, req.vm, props]
        else:
            args = [req.unit, hosts, props]
        outcomes = self.outcomes if isinstance(self.outcomes, list) else [self.outcomes] if self.outcomes else []
        dropped = self.decision.dropped if op == "filter" else None
        if op == "filter" and (dropped is None or len(dropped) != len(outcomes)):
            dropped = [set(hosts).difference(o.hosts) if o.ok else None for o in outcomes]
        units = [_unit(o, op, hosts, dropped[i] if dropped else None) for i, o in enumerate(outcomes)]
        missing = self.decision.missing_facts
        return {"k": "call", "id": self.call_id, "time": self.at, "gateway": self.gateway, "op": op,
                "method": METHODS[op], "args": args, "omitted": sorted(self.omit.intersection(req.properties)),
                "timeout": req.timeout, "reply": self.decision.envelope(), "units": units,
                "missing_facts": missing.model_dump() if missing is not None else None,
                "bus_failed": self.bus_failed, "duration": round(self.duration, 6)}

    def encode(self, state: FileState) -> bytes:
        return orjson.dumps(self.record()) + b"\n"


class Sink(Protocol):
    def submit(self, item: Any) -> None: ...


class CallRecording:
    """A gateway's recording of the engine's calls: where they go, its label, and the property keys left out."""

    def __init__(self, sink: Sink, gateway: str, omit: Iterable[str] = ()) -> None:
        self.sink = sink
        self.gateway = gateway
        self.omit = frozenset(omit)

    def call(self, call_id: str, at: float, op: str, req: Any, decision: Any, outcomes: Any, bus_failed: bool,
             duration: float) -> None:
        """Queue one answered call (never raises, never blocks: :meth:`vmsched.whatif.writer.RecordWriter.submit`)."""
        self.sink.submit(CallItem(call_id, at, self.gateway, op, req, decision, outcomes, bus_failed, duration,
                                  self.omit))


@dataclass(frozen=True, slots=True)
class InputsItem:
    """What the units of one call could read in a service: its call's facts (a vmsched.facts.wire.PreparedFacts,
    pending placements in its ``vm``), or None without a facts cache; made into lines on the writer's thread."""

    call_id: str
    service: str
    facts: Any

    def encode(self, state: FileState) -> bytes:
        f = self.facts
        if f is None:
            return orjson.dumps({"k": "inputs", "id": self.call_id, "service": self.service, "time": None,
                                 "cache": False}) + b"\n"
        lines = []
        hosts: dict[str, int] = {}
        guests: dict[str, int] = {}
        for host_id, part in f.refs.items():
            hosts[host_id] = part.gen
            if part.gen not in state.hosts:
                lines.append(b'{"k":"host","gen":%d,"stale_at":%s,"facts":%s}\n'
                             % (part.gen, orjson.dumps(part.stale_at), part.fragment.encode()))
                state.hosts.add(part.gen)
            if f.with_guests:
                guests[host_id] = part.guests_gen
                if part.guests_gen not in state.guests:
                    lines.append(b'{"k":"guests","gen":%d,"guests":%s}\n' % (part.guests_gen, part.guests_json().encode()))
                    state.guests.add(part.guests_gen)
        lines.append(orjson.dumps({"k": "inputs", "id": self.call_id, "service": self.service, "time": f.now,
                                   "hosts": hosts, "agents": f.agents, "guests": guests if f.with_guests else None,
                                   "missing": f.missing, "vm": f.vm, "vm_problem": f.vm_problem}) + b"\n")
        return b"".join(lines)


# --- reading ----------------------------------------------------------------------------------------------


class _Record(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Header(_Record):
    k: Literal["recording"]
    format: str
    version: int
    writer: str = ""
    pid: int = 0
    host: str = ""
    started: float = 0.0


Number = Union[float, Literal["Infinity", "-Infinity", "NaN"]]


class UnitRecord(_Record):
    unit: str
    ok: bool
    error: str | None = None
    timed_out: bool = False
    duration: float = 0.0
    reasons: dict[str, str] = Field(default_factory=dict)
    dropped: list[str] = Field(default_factory=list)  # filter
    factor: int = 1  # score
    values: list[Number] | None = None  # score: one per requested host, in order
    scores: list[tuple[str, Number]] = Field(default_factory=list)  # score, when not aligned
    vm: str = ""  # balance
    hosts: list[str] = Field(default_factory=list)  # balance
    reason: str = ""  # balance


class Call(_Record):
    k: Literal["call"]
    id: str
    time: float
    gateway: str = ""
    op: Literal["filter", "score", "balance"]
    method: str = ""
    args: list[Any]
    omitted: list[str] = Field(default_factory=list)
    timeout: float | None = None
    reply: dict[str, Any] = Field(default_factory=dict)
    units: list[UnitRecord] = Field(default_factory=list)
    missing_facts: dict[str, Any] | None = None
    bus_failed: bool = False
    duration: float = 0.0


class HostFacts(_Record):
    k: Literal["host"]
    gen: int
    stale_at: float
    facts: dict[str, Any]


class GuestList(_Record):
    k: Literal["guests"]
    gen: int
    guests: list[dict[str, Any]]


class Inputs(_Record):
    k: Literal["inputs"]
    id: str
    service: str = ""
    time: float | None = None
    cache: bool = True
    hosts: dict[str, int] = Field(default_factory=dict)
    agents: dict[str, str] = Field(default_factory=dict)
    guests: dict[str, int] | None = None
    missing: dict[str, str] = Field(default_factory=dict)
    vm: dict[str, Any] | None = None
    vm_problem: str | None = None


Record = Annotated[Union[Header, Call, HostFacts, GuestList, Inputs], Field(discriminator="k")]
_RECORD: TypeAdapter[Any] = TypeAdapter(Record)


def parse(line: bytes) -> Header | Call | HostFacts | GuestList | Inputs:
    """One line; pydantic's ValidationError when it is not a record of this version's kinds."""
    return _RECORD.validate_json(line)


def _float(value: float | str) -> float:
    return float(value)  # "Infinity", "-Infinity" and "NaN" read back as floats too


def outcome(op: str, u: UnitRecord, hosts: list[str]) -> FilterOutcome | ScoreOutcome | BalanceOutcome:
    """A recorded unit's outcome as the services report it (the models :mod:`vmsched.decide.rules` reads)."""
    head = {"unit": u.unit, "ok": u.ok, "error": u.error, "timed_out": u.timed_out, "duration": u.duration,
            "reasons": u.reasons}
    if op == "filter":
        gone = set(u.dropped)
        return FilterOutcome(**head, hosts=[h for h in hosts if h not in gone])
    if op == "score":
        pairs = (list(zip(hosts, map(_float, u.values))) if u.values is not None
                 else [(h, _float(s)) for h, s in u.scores])
        return ScoreOutcome(**head, factor=u.factor, scores=pairs)
    return BalanceOutcome(**head, vm=u.vm, hosts=u.hosts, reason=u.reason)
