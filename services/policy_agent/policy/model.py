"""The policy schema: what one guest asks for (pydantic).

A :class:`GuestPolicy` is self-contained and host-independent: CPU sets are
checked for syntax here and against a host in :mod:`validation`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError, ValidationInfo, field_validator, model_validator

from vmsched import cpuset
from vmsched.agent_contract import AdaptiveDocument, PolicyDocument

from ..errors import PolicyError

# libvirt's ranges for the QEMU driver's scheduler parameters
SHARES_MIN, SHARES_MAX = 2, 262144
PERIOD_MIN, PERIOD_MAX = 1000, 1000000
QUOTA_MIN, QUOTA_MAX = 1000, 17592186044415
DEFAULT_PERIOD = 100000
DEFAULT_SHARES = 1024


class GuestPolicy(PolicyDocument):
    """CPU policy of one guest: the wire model's fields (:class:`vmsched.agent_contract.PolicyDocument`)
    with their values checked here. Every field is optional."""

    @field_validator("vcpu_pins")
    @classmethod
    def _pins(cls, value: dict[int, str]) -> dict[int, str]:
        out: dict[int, str] = {}
        for vcpu, text in sorted(value.items()):
            if vcpu < 0:
                raise ValueError(f"vCPU {vcpu}: vCPU numbers start at 0")
            try:
                out[vcpu] = cpuset.normalize(str(text))
            except cpuset.CpuSetError as exc:
                raise ValueError(f"vCPU {vcpu}: {exc}") from None
        return out

    @field_validator("emulator_pin")
    @classmethod
    def _emulator(cls, value: str | None) -> str | None:
        return None if value is None else cpuset.normalize(value)

    @field_validator("dedicated", mode="before")
    @classmethod
    def _dedicated(cls, value: Any) -> int | str | None:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 1:
                raise ValueError(f"dedicated CPU count must be at least 1, got {value}")
            return value
        if isinstance(value, str):
            return cpuset.normalize(value)
        if value is not None:
            raise ValueError("expected a CPU count or a CPU set")
        return None

    @field_validator("weight", "cap_percent", "quota", "period")
    @classmethod
    def _libvirt_range(cls, value: float | None, info: ValidationInfo) -> float | None:
        """libvirt's range of each scheduler parameter (a cap is a percent of one CPU per vCPU)."""
        field = info.field_name
        if value is None:
            return None
        if field == "weight" and not SHARES_MIN <= value <= SHARES_MAX:
            raise ValueError(f"weight (cpu_shares) {value} outside libvirt's range {SHARES_MIN}-{SHARES_MAX}")
        if field == "cap_percent" and not 0 < value <= 100:
            raise ValueError(f"cap {value}% outside (0, 100]: it is a percent of one CPU per vCPU")
        if field == "quota" and value != -1 and not QUOTA_MIN <= value <= QUOTA_MAX:
            raise ValueError(f"quota {value} us outside libvirt's range: -1 (unlimited) or {QUOTA_MIN}-{QUOTA_MAX}")
        if field == "period" and not PERIOD_MIN <= value <= PERIOD_MAX:
            raise ValueError(f"period {value} us outside libvirt's range {PERIOD_MIN}-{PERIOD_MAX}")
        return value

    @field_validator("requires")
    @classmethod
    def _requires(cls, value: list[str]) -> list[str]:
        """Each name stripped, once (an empty one is refused by :data:`~vmsched.agent_contract.GuestName`)."""
        return list(dict.fromkeys(name.strip() for name in value))

    @field_validator("adaptive")
    @classmethod
    def _adaptive(cls, value: AdaptiveDocument | None) -> AdaptiveDocument | None:
        if value is not None and (problems := adaptive_range_problems(value)):
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _cap_forms(self) -> "GuestPolicy":
        if problems := self.form_problems():
            raise ValueError("; ".join(problems))
        return self

    def form_problems(self) -> list[str]:
        """Every rule about how the cap fields combine that this policy breaks."""
        problems: list[str] = []
        if self.cap_percent is not None and self.quota is not None:
            problems.append("give the cap either as cap_percent or as quota/period, not both")
        if self.period is not None and self.cap_percent is None and self.quota is None:
            problems.append("period given without cap_percent or quota")
        if self.cap_percent is not None:
            quota = self.effective_quota()
            if quota is not None and quota < QUOTA_MIN:
                problems.append(
                    f"cap {self.cap_percent}% of a {self.effective_period()} us period is a quota of {quota} us,"
                    f" below libvirt's minimum {QUOTA_MIN} us"
                )
        problems.extend(adaptive_static_problems(self))
        problems.extend(placement_problems(self))
        return problems

    # --- the tuners' starting point -----------------------------------------------
    def base_weight(self) -> int:
        return self.weight if self.weight is not None else DEFAULT_SHARES

    # --- derived values ----------------------------------------------------
    def effective_period(self) -> int | None:
        if self.period is not None:
            return self.period
        if self.cap_percent is not None or (self.quota is not None and self.quota != -1):
            return DEFAULT_PERIOD
        return None

    def effective_quota(self) -> int | None:
        if self.cap_percent is not None:
            return int(round(self.effective_period() * self.cap_percent / 100.0))
        return self.quota

    def sched_params(self) -> dict[str, int]:
        """The scheduler parameters this policy sets (QEMU driver names)."""
        out: dict[str, int] = {}
        if self.weight is not None:
            out["cpu_shares"] = self.weight
        quota = self.effective_quota()
        if quota is not None:
            out["vcpu_quota"] = quota
            period = self.effective_period()
            if period is not None:
                out["vcpu_period"] = period
        return out

    def dedicated_set(self) -> frozenset[int] | None:
        return cpuset.parse(self.dedicated) if isinstance(self.dedicated, str) else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without unset fields."""
        return self.model_dump(mode="json", exclude_defaults=True)


def adaptive_range_problems(a: AdaptiveDocument) -> list[str]:
    """What is wrong with an adaptive block on its own (ranges, libvirt's limits)."""
    problems: list[str] = []
    if a.weight is not None:
        lo, hi = a.weight
        if lo > hi:
            problems.append(f"weight [{lo}, {hi}]: min above max")
        if lo < SHARES_MIN or hi > SHARES_MAX:
            problems.append(f"weight [{lo}, {hi}] outside libvirt's range {SHARES_MIN}-{SHARES_MAX}")
    if a.cap_percent is not None:
        lo, hi = a.cap_percent
        if lo > hi:
            problems.append(f"cap_percent [{lo:g}, {hi:g}]: min above max")
        if lo <= 0 or hi > 100:
            problems.append(f"cap_percent [{lo:g}, {hi:g}] outside (0, 100]")
        elif lo * DEFAULT_PERIOD / 100.0 < QUOTA_MIN:
            problems.append(f"cap_percent min {lo:g}% is below libvirt's minimum quota {QUOTA_MIN} us"
                            f" of a {DEFAULT_PERIOD} us period")
    t = a.target_wait_percent
    if t is not None and not 0 < t < 100:
        problems.append(f"target_wait_percent {t:g} outside (0, 100)")
    if a.weight is None and a.cap_percent is None and not a.may_move:
        problems.append("give at least one of weight, cap_percent or may_move")
    return problems


def adaptive_static_problems(p: "GuestPolicy") -> list[str]:
    """Where the adaptive bounds contradict the static policy."""
    a = p.adaptive
    problems: list[str] = []
    if a is None:
        return problems
    if a.may_move and p.dedicated is not None:
        problems.append("adaptive.may_move: a guest with dedicated CPUs cannot move (its vCPUs own their CPUs)")
    if a.weight is not None and a.weight[0] <= a.weight[1] and not a.weight[0] <= p.base_weight() <= a.weight[1]:
        what = f"weight {p.weight}" if p.weight is not None else f"the default weight {DEFAULT_SHARES}"
        problems.append(f"adaptive.weight [{a.weight[0]}, {a.weight[1]}] does not contain {what}")
    if a.cap_percent is not None:
        lo, hi = a.cap_percent
        if p.quota is not None:
            problems.append("adaptive.cap_percent: give the static cap as cap_percent, not as quota")
        elif p.cap_percent is not None and lo <= hi and not lo <= p.cap_percent <= hi:
            problems.append(f"adaptive.cap_percent [{lo:g}, {hi:g}] does not contain cap {p.cap_percent:g}%")
    return problems


def placement_problems(p: "GuestPolicy") -> list[str]:
    """How thread_policy, numa and emulator combine with the other fields."""
    problems: list[str] = []
    chosen = [f"{name} {value}" for name, value, default in (("thread_policy", p.thread_policy, "prefer"),
                                                                ("numa", p.numa, "any"), ("emulator", p.emulator, "share"))
              if value != default]
    if chosen and p.dedicated is None:
        problems.append(f"{', '.join(chosen)}: applies to dedicated CPUs; give dedicated as well")
    if p.emulator == "isolate" and p.emulator_pin is not None:
        problems.append("emulator isolate gives the emulator threads a dedicated CPU of their own: drop emulator_pin,"
                        " or use emulator share")
    return problems


def parse_policy(data: Any) -> GuestPolicy:
    """Build a policy from untrusted data, turning pydantic errors into a PolicyError with every problem."""
    policy, problems = parse_policy_partial(data)
    if problems:
        raise PolicyError(problems)
    return policy


#: fields the model-level rules (:meth:`GuestPolicy.form_problems`) look at
_CAP_FIELDS = ("cap_percent", "quota", "period", "adaptive", "thread_policy", "numa", "emulator", "emulator_pin")


def parse_policy_partial(data: Any) -> tuple[GuestPolicy, list[str]]:
    """(the policy made of the valid fields, every problem found).

    pydantic skips the model-level rules when a field is invalid; here the
    invalid fields are dropped and the rest validated again, so field errors,
    the cap rules and (by the caller, on the partial policy) the host-fit
    checks can all be reported at once.
    """
    if isinstance(data, GuestPolicy):
        return data, []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"a policy must be a mapping, got {type(data).__name__}")
    fields = dict(data)
    problems: list[str] = []
    while True:
        try:
            return GuestPolicy.model_validate(fields), problems
        except ValidationError as exc:
            bad: set[Any] = set()
            for err in exc.errors():
                text = describe(err)
                problems.extend(text.split("; ") if not err.get("loc") else [text])
                bad.add(err["loc"][0] if err.get("loc") else None)
            drop = {k for k in bad if k is not None}
            if None in bad:  # a model-level rule: its fields are the cap fields
                drop |= set(_CAP_FIELDS)
            drop &= set(fields)
            if not drop:  # cannot happen with this model; never loop
                return GuestPolicy(), problems
            for key in drop:
                del fields[key]


def policy_document(data: dict[str, Any]) -> dict[str, Any]:
    """The normalised JSON form of a valid policy; an invalid one is passed on as it is, so that the
    agent reports its field errors together with the host-fit problems it alone can check."""
    policy, problems = parse_policy_partial(data)
    return data if problems else policy.to_dict()


def describe(err: Any, within: str = "") -> str:
    """One pydantic error as ``field: reason``; the fields of the model at ``within`` without that prefix."""
    loc = [str(p) for p in err.get("loc", ())]
    if within and loc[:1] == [within] and len(loc) > 1:
        loc = loc[1:]
    where = ".".join(p for p in loc if p not in ("int", "str"))
    msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
    return f"{where}: {msg}" if where else msg
