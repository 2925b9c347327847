"""Check a guest's policy against a host, and derive what must be in place.

:func:`check_policy` refuses a policy whole, listing every reason; on
success it returns the allocation the guest would hold and the
:class:`Desired` pins and scheduler parameters. Nothing here touches libvirt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from vmsched import cpuset
from vmsched.cpuset import CpuSet

from ..errors import PolicyError
from ..plural import plural
from . import deps
from .allocation import Pools
from .assignment import node_of_set
from .model import GuestPolicy


@dataclass(frozen=True)
class GuestInfo:
    uuid: str
    name: str
    nvcpus: int


@dataclass(frozen=True)
class Desired:
    """What should be in force; ``None`` means the agent leaves it alone."""

    vcpus: dict[int, CpuSet] | None
    emulator: CpuSet | None
    sched: dict[str, int] = field(default_factory=dict)
    memory_nodes: CpuSet | None = None  # NUMA nodes the memory is bound to, strictly (numa strict)

    def view(self) -> dict:
        return {
            "vcpus": None if self.vcpus is None else {str(i): cpuset.fmt(c) for i, c in sorted(self.vcpus.items())},
            "emulator": None if self.emulator is None else cpuset.fmt(self.emulator),
            "memory_nodes": None if self.memory_nodes is None else cpuset.fmt(self.memory_nodes),
            **{key: self.sched.get(key) for key in ("cpu_shares", "vcpu_quota", "vcpu_period")},
        }


@dataclass
class Checked:
    allocation: CpuSet | None
    desired: Desired
    warnings: list[str] = field(default_factory=list)


def check_policy(
    policy: GuestPolicy,
    guest: GuestInfo,
    pools: Pools,
    graph: deps.Graph,
    resolve: Callable[[str], str | None],
    name_of: Callable[[str], str],
) -> Checked:
    """Validate ``policy`` for ``guest`` on this host; raises PolicyError with every reason."""
    errors: list[str] = []
    warnings: list[str] = []
    host = pools.host_cpus
    allocation: CpuSet | None = None

    def on_host(what: str, text: str) -> CpuSet | None:
        """The CPUs of ``text``, every one of them the host's; None (and the error noted) otherwise."""
        try:
            return cpuset.parse(text, host=host)
        except cpuset.CpuSetError as exc:
            errors.append(f"{what} {text}: {exc}")
            return None

    # dedicated allocation first: pins are checked against it
    if policy.dedicated is not None:
        try:
            allocation = pools.request_for(guest.uuid, guest.name, policy, guest.nvcpus)
        except PolicyError as exc:
            errors.extend(exc.errors)
    # where the vCPUs may be pinned: the allocation but the emulator's CPU and the threads held idle
    for_vcpus = pools.roles(policy, allocation, guest.nvcpus).for_vcpus(allocation) if allocation else None

    if absent := [vcpu for vcpu in policy.vcpu_pins if vcpu >= guest.nvcpus]:  # one line however many
        errors.append(f"{'vCPU' if len(absent) == 1 else 'vCPUs'} {cpuset.fmt(absent)}"
                      f" {'does' if len(absent) == 1 else 'do'} not exist: guest {guest.name!r} has"
                      f" {plural(guest.nvcpus, 'vCPU')} ({cpuset.fmt(range(guest.nvcpus))})")
    for vcpu, text in policy.vcpu_pins.items():
        what = f"vCPU {vcpu} pin"
        if vcpu >= guest.nvcpus or (cpus := on_host(what, text)) is None:  # an absent vCPU is reported above
            continue
        if policy.dedicated is not None:
            within = for_vcpus if for_vcpus is not None else policy.dedicated_set()  # refused set: still check
            if within is not None and not cpus <= within:
                errors.append(
                    f"{what} {cpuset.fmt(cpus)}: {cpuset.named(cpus - within, 'is', 'are')} outside the guest's"
                    f" dedicated {cpuset.named(within)}"
                )
        elif cpus & pools.pool:
            errors.append(
                f"{what} {cpuset.fmt(cpus)}: {cpuset.named(cpus & pools.pool, 'is', 'are')} in the dedicated pool;"
                f" a guest without dedicated CPUs runs on the shared set {cpuset.fmt(pools.shared)}"
            )

    if policy.emulator_pin is not None and (emu := on_host("emulator pin", policy.emulator_pin)) is not None:
        allowed = pools.shared | (for_vcpus or frozenset())
        if emu - allowed:
            errors.append(
                f"emulator pin {cpuset.fmt(emu)}: {cpuset.named(emu - allowed, 'is', 'are')} in the dedicated pool"
                f" and not dedicated to this guest; allowed: {cpuset.fmt(allowed)}"
            )

    # start dependencies
    reqs: list[str] = []
    for req in policy.requires:
        key = resolve(req)
        if key == guest.uuid or req == guest.name:
            errors.append(f"guest {guest.name!r} cannot require itself")
            continue
        if key is None:
            warnings.append(f"required guest {req!r} is not defined on this host (yet)")
            key = req
        reqs.append(key)
    if cycle := deps.find_cycle({**graph, guest.uuid: reqs}, guest.uuid):
        errors.append(deps.describe_cycle(cycle, name_of))

    if errors:
        raise PolicyError(errors)
    return Checked(allocation, desired_for(policy, guest, pools, allocation), warnings)


def desired_for(
    policy: GuestPolicy | None,
    guest: GuestInfo,
    pools: Pools,
    allocation: CpuSet | None,
    confine: bool = False,
) -> Desired:
    """Pins, scheduler parameters and memory binding for ``guest``.

    A dedicated guest: vCPU i on the CPU its allocation gives vCPU i
    (:meth:`Pools.roles`; unless pinned explicitly inside it), emulator
    threads on the shared set or, with ``emulator: isolate``, on their own
    CPU of the allocation; with ``numa: strict`` its memory on the node of its
    CPUs. Any other guest with a policy: explicit pins, else the shared set.
    A guest without a policy is confined to the shared set while a pool exists
    (or when ``confine``), and otherwise left alone.
    """
    shared = pools.shared
    n = guest.nvcpus
    if policy is None:
        if not pools.pool and not confine:
            return Desired(None, None, {})
        return Desired({i: shared for i in range(n)}, shared, {})
    pins = {i: cpuset.parse(t) for i, t in policy.vcpu_pins.items() if i < n}
    emulator = cpuset.parse(policy.emulator_pin) if policy.emulator_pin else shared
    memory = None
    if allocation:
        r = pools.roles(policy, allocation, n)
        rest = r.for_vcpus(allocation)
        vcpus = {i: pins.get(i) or (frozenset({r.vcpus[i]}) if i < len(r.vcpus) else rest) for i in range(n)}
        if r.emulator is not None:
            emulator = frozenset({r.emulator})
        node = node_of_set(pools.topo, allocation)
        if policy.numa == "strict" and node is not None:
            memory = frozenset({node})
    else:
        vcpus = {i: pins.get(i) or shared for i in range(n)}
    return Desired(vcpus, emulator, policy.sched_params(), memory)
