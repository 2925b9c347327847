"""Adaptive policy on real QEMU: the agent's tuners act on guests that burn CPU.

The guests boot a 512-byte boot sector the test writes to a raw disk image: it spins on the BIOS tick
counter for a given number of ticks (18.2 per second; 0 means 65536, about an hour), then halts in a loop
(idle). Both guests are pinned to one shared pCPU; the agent runs with a 2 s tuner interval and the default
hysteresis (3). On a 2-core machine the other pCPU also carries the test runner and libvirtd, so the tuners
judge saturation by the guests' own vCPU wait. Deadlines bound the waits; intervals are counted by the
tuner's own round counter, not by the clock.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
import time
from pathlib import Path

import pytest

from tests.e2e.libvirt import helpers as h

pytestmark = [pytest.mark.libvirt, pytest.mark.slow]

CONFIG = 2  # VIR_DOMAIN_AFFECT_CONFIG
ROUNDS = "vmsched_agent_tuner_round_seconds_count"
REPAIRS = "vmsched_agent_repairs_total"
DRIFT = "vmsched_agent_drift_corrections_total"
SWEEPS = "vmsched_agent_reconcile_duration_seconds_count"


def boot_sector(ticks: int) -> bytes:
    """sti; ds=0x40; cx=ticks; repeat cx times: spin until [0x6c] changes; then hlt forever."""
    code = (b"\xfb" b"\xb8\x40\x00" b"\x8e\xd8" b"\xb9" + struct.pack("<H", ticks)
            + b"\xa1\x6c\x00" b"\x3b\x06\x6c\x00" b"\x74\xfa" b"\xe2\xf5" b"\xf4" b"\xeb\xfd")
    return code + bytes(510 - len(code)) + b"\x55\xaa"


def burner_xml(name: str, image: Path) -> str:
    return f"""<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>32</memory>
  <vcpu placement='static'>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='hd'/></os>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='{image}'/>
      <target dev='hda' bus='ide'/></disk>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>"""


def burner(env, guests, tmp_path: Path, seconds: float | None) -> str:
    """Define a guest that burns CPU for ``seconds`` (None: about an hour) and then idles."""
    type(guests).counter += 1
    name = f"{h.PREFIX}burn{type(guests).counter}"
    image = tmp_path / f"{name}.img"
    image.write_bytes(boot_sector(0 if seconds is None else max(1, int(seconds * 18.2))))
    h.remove_guest(env.conn, name)
    env.conn.defineXML(burner_xml(name, image))
    guests.names.append(name)
    return name


def metric_sum(agent, name: str) -> float:
    return sum(v for k, v in agent.metrics().items() if k == name or k.startswith(name + "{"))


def cpu_time(dom) -> float:
    return dom.info()[4] / 1e9


def test_hotspot_moves_one_guest_off_the_saturated_cpu(env, guests, agent_factory, tmp_path):
    if len(env.host_cpus) < 2:
        pytest.skip(f"needs 2 host CPUs, found {sorted(env.host_cpus)}")
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    agent = agent_factory(reconcile_interval=2, extra_args=("--tune-interval", "2"))
    names = [burner(env, guests, tmp_path, None) for _ in range(2)]
    policy = {"vcpu_pins": {"0": str(hi)}, "adaptive": {"may_move": True}}
    for name in names:
        agent.request("set_policy", {"guest": name, "policy": policy})
    os_guests = [guests.start(name) for name in names]
    for g in os_guests:
        h.wait_for(g.vcpu_pins, {0: frozenset({hi})}, what=f"{g.name} pinned to CPU {hi}")
    time.sleep(1.0)  # the start events' syncs settle
    repairs0, drift0, rounds0, sweeps0 = (metric_sum(agent, REPAIRS), agent.metric(DRIFT), agent.metric(ROUNDS),
                                          agent.metric(SWEEPS))

    def moved() -> list[str]:
        return [g.name for g in os_guests if g.vcpu_pins() == {0: frozenset({lo})}]

    h.wait_until(moved, timeout=90, what=f"a guest's vCPU moved to CPU {lo}")
    rounds = agent.metric(ROUNDS) - rounds0
    assert rounds <= 6 + 1, f"moved after {rounds:g} tuner rounds (6 intervals + the one in progress)"
    (mover,) = moved()
    stayer = next(g for g in os_guests if g.name != mover)
    assert stayer.vcpu_pins() == {0: frozenset({hi})}

    # both burn: their CPU time rises
    doms = [guests.dom(n) for n in names]
    before = [cpu_time(d) for d in doms]
    time.sleep(3)
    gained = [cpu_time(d) - b for d, b in zip(doms, before)]
    assert all(x > 0 for x in gained), f"CPU seconds gained in 3 s: {gained}"

    # a few more intervals and sweeps: the move holds, nothing was "repaired", the loop guard never trips
    rounds1 = agent.metric(ROUNDS)
    h.wait_until(lambda: agent.metric(ROUNDS) >= rounds1 + 3 and agent.metric(SWEEPS) >= sweeps0 + 3, timeout=60,
                 what="3 more tuner rounds and sweeps")
    assert h.OSGuest(mover).vcpu_pins() == {0: frozenset({lo})}
    assert metric_sum(agent, REPAIRS) == repairs0, "a sweep or drift repair undid (or redid) the tuner's change"
    assert agent.metric(DRIFT) == drift0
    explain = agent.cli_json("policy", "explain", mover)
    assert explain["tuned"]["vcpus"] == {"0": str(lo)}
    applied = [d for d in explain["decisions"] if d["outcome"] == "applied"]
    assert applied and applied[-1]["tuner"] == "hotspot" and "saturated" in applied[-1]["reason"]
    assert explain["policy"]["vcpu_pins"] == {"0": str(hi)}  # the static policy is unchanged
    cfg_pin = guests.dom(mover).vcpuPinInfo(CONFIG)[0]
    assert [i for i, on in enumerate(cfg_pin) if on] == [hi], "tuned pins are live-only"
    for name in names:
        assert "repair loop" not in (agent.request("get_policy", {"guest": name}).get("error") or "")


def test_tuners_cooperate_the_move_comes_first(env, guests, agent_factory, tmp_path):
    """Two burning guests on one pCPU, each with a weight range, a cap range and may_move: placement goes
    first. The move comes in the earliest round (a baseline, then the hysteresis' 3 samples) or the next, and no
    weight or cap is applied to either guest before it (a move relieves the contention they would answer)."""
    if len(env.host_cpus) < 2:
        pytest.skip(f"needs 2 host CPUs, found {sorted(env.host_cpus)}")
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    agent = agent_factory(reconcile_interval=2, extra_args=("--tune-interval", "2"))
    names = [burner(env, guests, tmp_path, None) for _ in range(2)]
    policy = {"vcpu_pins": {"0": str(hi)},
              "adaptive": {"may_move": True, "weight": [512, 4096], "cap_percent": [50, 100]}}
    for name in names:
        agent.request("set_policy", {"guest": name, "policy": policy})
    os_guests = [guests.start(name) for name in names]
    rounds0 = agent.metric(ROUNDS)  # both run: the next round is at the latest their baseline
    for g in os_guests:
        h.wait_for(g.vcpu_pins, {0: frozenset({hi})}, what=f"{g.name} pinned to CPU {hi}")

    def moved() -> list[str]:
        return [g.name for g in os_guests if g.vcpu_pins() == {0: frozenset({lo})}]

    h.wait_until(moved, timeout=60, interval=0.2, what=f"a guest's vCPU moved to CPU {lo}")
    rounds = agent.metric(ROUNDS) - rounds0
    assert rounds <= 4 + 1, f"moved after {rounds:g} tuner rounds: the earliest is 4 (a baseline and 3 samples)"
    explained = {n: agent.cli_json("policy", "explain", n)["decisions"] for n in names}
    (move,) = [d for ds in explained.values() for d in ds if d["field"] == "vcpus" and d["outcome"] == "applied"]
    early = [(n, d) for n, ds in explained.items() for d in ds
             if d["outcome"] == "applied" and d["field"] != "vcpus" and d["time"] <= move["time"]]
    assert early == [], f"weight or cap applied before the move: {early}"


def test_weight_follows_demand_and_decays_when_idle(env, guests, agent_factory, tmp_path):
    hi = max(env.host_cpus)
    agent = agent_factory(reconcile_interval=2, extra_args=("--tune-interval", "2"))
    starved = burner(env, guests, tmp_path, 30)  # burns ~30 s, then idles
    rival = burner(env, guests, tmp_path, None)
    agent.request("set_policy", {"guest": starved, "policy": {"vcpu_pins": {"0": str(hi)},
                                                              "adaptive": {"weight": [1024, 4096]}}})
    agent.request("set_policy", {"guest": rival, "policy": {"vcpu_pins": {"0": str(hi)}}})
    g = guests.start(starved)
    guests.start(rival)
    dom = guests.dom(starved)
    repairs0 = metric_sum(agent, REPAIRS)
    seen: list[tuple[int, int]] = []

    def observe() -> tuple[int, int]:
        pair = (int(dom.schedulerParameters()["cpu_shares"]), g.shares())
        if not seen or seen[-1] != pair:
            seen.append(pair)
        return pair

    h.wait_until(lambda: observe()[0] > 1024, timeout=60, interval=0.5, what="the starved guest's weight to rise")
    h.wait_until(lambda: observe()[0] >= 4096, timeout=60, interval=0.5, what="the weight to reach its max 4096")
    shares = observe()
    expected_file = 4096 if g.cgroup().version == "v1" else None
    if expected_file is not None:
        assert shares[1] == expected_file, f"cpu.shares {shares[1]} (cgroup v1)"
    else:  # cgroup v2: libvirt converts shares to cpu.weight (1-10000)
        assert shares[1] > 100, f"cpu.weight {shares[1]} (cgroup v2) did not rise above the default 100"
    h.wait_until(lambda: observe()[0] == 1024, timeout=90, interval=0.5,
                 what="the weight to decay back to the base 1024 once the guest idles")
    assert seen[-1][1] == (1024 if g.cgroup().version == "v1" else 100)
    config = dom.schedulerParametersFlags(CONFIG)
    assert config.get("cpu_shares") in (0, 1024), f"tuned weight is live-only; config holds {config}"  # 0: unset
    assert metric_sum(agent, REPAIRS) == repairs0
    values = [s for s, _ in seen]
    assert max(values) <= 4096 and min(values) >= 1024, f"weights seen {seen} left the bounds [1024, 4096]"


TUNER_PLUGIN = '''
import os, socket

class Tuner:
    """Maxes the weight of every adaptive guest, asks for more than its bounds, and reports what of the
    agent's world it can reach (through a proposal the agent refuses: an unknown field)."""

    def do_tune(self, facts):
        found = {"uid": os.getuid()}
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("/run/libvirt/libvirt-sock")
            s.sendall(b"\\0" * 28)  # not even a valid RPC header: libvirtd must not serve this user
            found["libvirt_socket"] = "connected"
        except OSError as exc:
            found["libvirt_socket"] = type(exc).__name__
        finally:
            s.close()
        try:
            import libvirt
            libvirt.open("qemu:///system").getVersion()
            found["libvirt_api"] = "opened"
        except Exception as exc:
            found["libvirt_api"] = type(exc).__name__
        out = []
        for uuid, g in facts["guests"].items():
            lo, hi = g["policy"]["adaptive"]["weight"]
            out.append({"guest": uuid, "field": "cpu_shares", "value": hi, "reason": "plugin: max weight"})
            out.append({"guest": uuid, "field": "cpu_shares", "value": hi * 2, "reason": "plugin: beyond bounds"})
            out.append({"guest": uuid, "field": "report", "value": found, "reason": "plugin: report"})
        return out
'''


def test_tuner_plugin_in_the_sandbox_on_real_qemu(env, guests, agent_factory, tmp_path, request):
    folder = Path(tempfile.mkdtemp(prefix="vmsched-e2e-tuners-"))  # the plugin user must read it (not tmp_path)
    request.addfinalizer(lambda: shutil.rmtree(folder, ignore_errors=True))
    folder.chmod(0o755)
    (folder / "maxer.py").write_text(TUNER_PLUGIN)
    (folder / "maxer.py").chmod(0o644)
    agent = agent_factory(extra_args=("--tune-interval", "2", "--tuner-plugins", str(folder)))
    name = burner(env, guests, tmp_path, None)
    agent.request("set_policy", {"guest": name, "policy": {"adaptive": {"weight": [512, 3000]}}})
    g = guests.start(name)
    dom = guests.dom(name)
    h.wait_until(lambda: dom.schedulerParameters()["cpu_shares"] == 3000, timeout=60, interval=0.5,
                 what="the plugin's weight 3000 applied")
    if g.cgroup().version == "v1":
        assert g.shares() == 3000
    explain = h.wait_until(lambda: (lambda e: e if any(d["outcome"] == "refused" for d in e["decisions"]) else None)(
        agent.cli_json("policy", "explain", name)), timeout=30, what="the refused proposals in explain")
    refused = {d["reason"].rsplit("(proposed because: ", 1)[-1].rstrip(")"): d for d in explain["decisions"]
               if d["outcome"] == "refused"}
    assert "outside the guest's range [512, 3000]" in refused["plugin: beyond bounds"]["reason"]
    report = refused["plugin: report"]["after"]
    assert report["uid"] != 0
    # the socket file may accept a connection (its mode is libvirtd's choice), but libvirtd serves no plugin user
    assert report["libvirt_api"] != "opened", f"a tuner plugin reached libvirt: {report}"
    assert explain["tuned"] == {"cpu_shares": 3000}


def test_elastic_cap_tightens_under_contention(env, guests, agent_factory, tmp_path):
    """The shared set is one pCPU (the other is the dedicated pool) and two guests burn on it: contention
    holds on any machine, so the capped guest's cap steps down from its static 50 % to its min 20 %."""
    if len(env.host_cpus) < 2:
        pytest.skip(f"needs 2 host CPUs, found {sorted(env.host_cpus)}")
    lo, hi = min(env.host_cpus), max(env.host_cpus)
    agent = agent_factory(dedicated_pool=str(lo), reconcile_interval=2, extra_args=("--tune-interval", "2"))
    capped = burner(env, guests, tmp_path, None)
    rival = burner(env, guests, tmp_path, None)
    agent.request("set_policy", {"guest": capped, "policy": {"cap_percent": 50, "adaptive": {"cap_percent": [20, 80]}}})
    g = guests.start(capped)
    guests.start(rival)
    dom = guests.dom(capped)
    h.wait_for(g.vcpu_pins, {0: frozenset({hi})}, what="the capped guest on the shared CPU")
    assert dom.schedulerParameters()["vcpu_quota"] == 50000
    repairs0 = metric_sum(agent, REPAIRS)
    seen: list[int] = []

    def quota() -> int:
        q = int(dom.schedulerParameters()["vcpu_quota"])
        if not seen or seen[-1] != q:
            seen.append(q)
        return q

    h.wait_until(lambda: quota() == 20000, timeout=120, interval=0.5, what="the cap tightened to its min 20 %")
    assert all(20000 <= q <= 50000 for q in seen), f"quotas seen {seen} left [20 %, 50 %]"
    assert seen == sorted(seen, reverse=True), f"the cap only tightens under contention: {seen}"
    cgroup_quota, period = g.vcpu_quotas()[0]
    assert (cgroup_quota, period) == (20000, 100000)  # at the min: nothing tightens further
    assert quota() == 20000
    assert dom.schedulerParametersFlags(CONFIG)["vcpu_quota"] == 50000, "tuned cap is live-only"
    explain = agent.cli_json("policy", "explain", capped)
    assert explain["decisions"][-1]["tuner"] == "elastic_cap" and "contention" in explain["decisions"][-1]["reason"]
    assert metric_sum(agent, REPAIRS) == repairs0
