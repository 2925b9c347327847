"""The policy agent's contract: its operations, requests, replies and events.

Typed models beside the scheduling messages (:mod:`vmsched.messages`), used by
the agent's surfaces (local socket, bus queue ``vmsched.agent.<host>``), its
CLI and the gateway's ``/v1/hosts`` API. Requests travel in an
:class:`~vmsched.messages.Envelope` (``op`` is an :class:`AgentOp` value),
replies in a :class:`~vmsched.messages.ReplyEnvelope` whose ``code`` is an
:class:`~vmsched.messages.ErrorCode`.
"""

from __future__ import annotations

import unicodedata
from enum import Enum
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from vmsched import cpuset
from vmsched.messages import CONTRACT_VERSION, ErrorCode

MAX_NAME = 256


class AgentOp(str, Enum):
    PING = "ping"
    SET_POLICY = "set_policy"
    GET_POLICY = "get_policy"
    DELETE_POLICY = "delete_policy"
    LIST_POLICIES = "list_policies"
    CPUS = "cpus"
    SET_POOL = "set_pool"
    RECONCILE = "reconcile"
    CHECK_START = "check_start"
    START_DOMAIN = "start_domain"
    STOP_DOMAIN = "stop_domain"
    EXPLAIN_POLICY = "explain_policy"


# --- guest names --------------------------------------------------------------------
def check_guest_name(name: str) -> str:
    """A guest name or UUID as libvirt could hold it: 1-256 characters, no control
    characters (NUL, newline, ...) and no lone surrogates."""
    if not name.strip():
        raise ValueError("empty guest name")
    if len(name) > MAX_NAME:
        raise ValueError(f"guest name is {len(name)} characters long; at most {MAX_NAME} are allowed")
    for i, ch in enumerate(name):
        what = {"Cc": "the control character", "Cs": "a lone surrogate"}.get(unicodedata.category(ch))
        if what is not None:
            raise ValueError(f"guest name contains {what} U+{ord(ch):04X} at position {i}")
    return name


GuestName = Annotated[str, AfterValidator(check_guest_name)]


# --- the policy on the wire ------------------------------------------------------------
class AdaptiveDocument(BaseModel):
    """Bounds within which the agent's tuners may change a guest while it runs (docs/policy-agent.md,
    "Adaptive policy"). Checked against the static policy by the agent."""

    model_config = ConfigDict(extra="forbid")

    weight: tuple[int, int] | None = Field(None, description="[min, max] cpu_shares the tuners may set")
    cap_percent: tuple[float, float] | None = Field(
        None, description="[min, max] cap (percent of one CPU per vCPU) the tuners may set"
    )
    may_move: bool = Field(False, description="the tuners may move the vCPUs within the shared CPU set")
    target_wait_percent: float | None = Field(
        None, description="keep the vCPUs' wait for a CPU below this percent of the interval (default 10)"
    )
    keep_on_restart: bool = Field(
        False, description="tuned values also go to the persistent definition and survive a guest restart"
    )


class PolicyDocument(BaseModel):
    """CPU policy of one guest, as sent and stored; every field is optional.

    This model checks the document's shape (known fields, their types, guest
    names); the agent checks the values (CPU-set syntax, libvirt's ranges,
    the cap rules, the fit on its host) and reports every problem at once.
    """

    model_config = ConfigDict(extra="forbid")

    vcpu_pins: dict[int, str] = Field(default_factory=dict, description="vCPU -> pCPU set (libvirt syntax, e.g. '0-3,^2')")
    emulator_pin: str | None = Field(None, description="pCPU set of the emulator threads")
    dedicated: int | str | None = Field(
        None, description="dedicated pCPUs: a count allocated from the host pool, or an explicit CPU set ('5-5')"
    )
    weight: int | None = Field(None, description="cpu_shares, 2-262144")
    cap_percent: float | None = Field(None, description="cap: percent of one CPU per vCPU, (0, 100]")
    quota: int | None = Field(None, description="vcpu_quota in us, -1 or 1000-17592186044415")
    period: int | None = Field(None, description="vcpu_period in us, 1000-1000000 (with cap_percent or quota)")
    requires: list[GuestName] = Field(default_factory=list, description="guests that must run before this one starts")
    adaptive: AdaptiveDocument | None = Field(None, description="bounds for the agent's tuners (none: not tuned)")
    thread_policy: Literal["prefer", "require", "isolate"] = Field(
        "prefer", description="with dedicated CPUs: prefer whole cores; require whole cores only; isolate: one thread "
                              "per core, its sibling threads held for this guest")
    numa: Literal["any", "strict"] = Field(
        "any", description="with dedicated CPUs: any (one NUMA node where it fits); strict: CPUs and memory in one node")
    emulator: Literal["share", "isolate"] = Field(
        "share", description="with dedicated CPUs: emulator threads on the shared set, or on one more dedicated CPU")

    @field_validator("vcpu_pins", "emulator_pin", "dedicated", mode="before")
    @classmethod
    def _short_cpu_sets(cls, value: Any) -> Any:
        """A CPU set longer than the parser reads (:data:`vmsched.cpuset.MAX_TEXT`) is refused here, before
        anyone parses it; its syntax is checked by the agent, with the policy's other values."""
        for vcpu, text in value.items() if isinstance(value, dict) else [(None, value)]:
            if isinstance(text, str):
                try:
                    cpuset.bounded(text)
                except cpuset.CpuSetError as exc:
                    raise ValueError(str(exc) if vcpu is None else f"vCPU {vcpu}: {exc}") from None
        return value


# --- requests ----------------------------------------------------------------------------
class Request(BaseModel):
    """Base of the requests: unknown fields are ignored (a newer caller may send more)."""

    model_config = ConfigDict(extra="ignore")


class NoArguments(Request):
    pass


class GuestRequest(Request):
    guest: GuestName = Field(description="guest name or UUID")

    @model_validator(mode="before")
    @classmethod
    def _uuid_alias(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("guest") and data.get("uuid"):
            return {**data, "guest": data["uuid"]}
        return data


class SetPolicyRequest(GuestRequest):
    policy: PolicyDocument = Field(default_factory=PolicyDocument)


class SetPoolRequest(Request):
    dedicated_pool: Annotated[str, AfterValidator(cpuset.bounded)] | None = Field(
        None, description="new dedicated pool in libvirt CPU-set syntax; '' or 'none' for none"
    )


class CheckStartRequest(GuestRequest):
    uuid: GuestName | None = Field(None, description="the guest's UUID (the QEMU hook sends both)")
    xml: str | None = Field(None, description="the domain XML; its policy metadata is used when given")


class StartDomainRequest(GuestRequest):
    wait: float = Field(60.0, ge=0, description="seconds to wait for each guest to run")


class StopDomainRequest(StartDomainRequest):
    force: bool = Field(False, description="destroy a guest that has not shut down within wait")


# --- replies ---------------------------------------------------------------------------
class Reply(BaseModel):
    model_config = ConfigDict(extra="allow")


class Status(Reply):
    host_id: str
    uri: str
    connected: bool
    pid: int


class Desired(Reply):
    vcpus: dict[str, str] = Field(default_factory=dict)
    emulator: str | None = None
    memory_nodes: str | None = Field(None, description="NUMA nodes the guest's memory is bound to (numa strict)")
    cpu_shares: int | None = None
    vcpu_quota: int | None = None
    vcpu_period: int | None = None


class GuestView(Reply):
    guest: str
    uuid: str
    state: str = Field(description="running, paused, shutoff, shutdown, crashed, pmsuspended, blocked or nostate")
    policy: dict[str, Any] | None = Field(None, description="the stored policy (PolicyDocument), normalised")
    allocation: str | None = Field(None, description="dedicated CPUs allocated to the guest")
    desired: Desired | None = None
    status: str = Field(description="applied, partial (applied but for what the libvirt driver cannot apply,"
                                    " named in warnings), pending, error or unmanaged")
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)


class Deleted(Reply):
    guest: str
    uuid: str
    deleted: bool = Field(description="false: the guest had no policy")


class PolicyList(Reply):
    policies: list[GuestView]


class CpuView(Reply):
    host_id: str
    host_cpus: str
    dedicated_pool: str
    shared: str
    free: str
    allocated: str
    allocations: dict[str, str] = Field(description="guest name -> its dedicated CPUs")
    topology: dict[str, Any] | None = Field(
        None, description="sockets -> NUMA nodes -> cores -> threads, each CPU with its state (shared, free, held, "
                          "and for a held CPU its guest and use: vcpuN, emulator or idle); offline CPUs")


class Reconciled(Reply):
    checked: int
    repaired: int | list[Any]
    errors: list[Any] = Field(default_factory=list)
    duration: float


class StartVerdict(Reply):
    allowed: bool
    message: str
    missing: list[str] = Field(default_factory=list, description="required guests that are not running")


class Started(Reply):
    started: list[str] = Field(description="guests started, in order")
    already_running: list[str] = Field(default_factory=list)


class Stopped(Reply):
    stopped: list[str] = Field(description="guests stopped, in order")
    already_stopped: list[str] = Field(default_factory=list)


class TunerDecision(Reply):
    time: float
    tuner: str
    field: str = Field(description="cpu_shares, vcpu_quota or vcpus")
    before: Any = None
    after: Any = None
    reason: str
    outcome: str = Field(description="applied, dry_run, refused, deferred (a rate limit) or error")


class PolicyExplain(Reply):
    guest: str
    uuid: str
    policy: dict[str, Any] | None = Field(None, description="the static policy (PolicyDocument)")
    desired: Desired | None = Field(None, description="what the static policy puts in force")
    tuned: dict[str, Any] = Field(default_factory=dict, description="values a tuner set live, over the static ones")
    decisions: list[TunerDecision] = Field(default_factory=list, description="the last decisions about this guest")
    tuner: dict[str, Any] = Field(default_factory=dict, description="the host's tuner configuration")


class Operation(NamedTuple):
    request: type[Request]
    reply: type[Reply]


#: Every operation of the agent: its request and reply models (the one table).
OPERATIONS: dict[AgentOp, Operation] = {
    AgentOp.PING: Operation(NoArguments, Status),
    AgentOp.SET_POLICY: Operation(SetPolicyRequest, GuestView),
    AgentOp.GET_POLICY: Operation(GuestRequest, GuestView),
    AgentOp.DELETE_POLICY: Operation(GuestRequest, Deleted),
    AgentOp.LIST_POLICIES: Operation(NoArguments, PolicyList),
    AgentOp.CPUS: Operation(NoArguments, CpuView),
    AgentOp.SET_POOL: Operation(SetPoolRequest, CpuView),
    AgentOp.RECONCILE: Operation(NoArguments, Reconciled),
    AgentOp.CHECK_START: Operation(CheckStartRequest, StartVerdict),
    AgentOp.START_DOMAIN: Operation(StartDomainRequest, Started),
    AgentOp.STOP_DOMAIN: Operation(StopDomainRequest, Stopped),
    AgentOp.EXPLAIN_POLICY: Operation(GuestRequest, PolicyExplain),
}


# --- events (topic exchange vmsched.events, routing key agent.<host_id>.<event>) -------------
class AgentEvent(BaseModel):
    model_config = ConfigDict(extra="allow")

    v: int = Field(CONTRACT_VERSION, description="contract version")
    host_id: str
    guest: str
    uuid: str


class LifecycleEvent(AgentEvent):
    event: str
    detail: Any = None
    time: float


class AppliedEvent(AgentEvent):
    trigger: str
    changes: list[Any] = Field(default_factory=list)
    latency: float | None = None


class DriftEvent(AgentEvent):
    fields: list[Any] = Field(default_factory=list)


class ErrorEvent(AgentEvent):
    error: str


class TunedEvent(AgentEvent):
    tuner: str
    field: str
    before: Any = None
    after: Any = None
    reason: str
    outcome: str = Field(description="applied, dry_run, refused or error (deferred ones are not announced)")


EVENTS: dict[str, type[AgentEvent]] = {
    "lifecycle": LifecycleEvent, "applied": AppliedEvent, "drift": DriftEvent, "error": ErrorEvent,
    "tuned": TunedEvent,
}

__all__ = [
    "AgentOp", "ErrorCode", "GuestName", "check_guest_name", "PolicyDocument", "Operation", "OPERATIONS",
    "EVENTS", "AgentEvent",
]
