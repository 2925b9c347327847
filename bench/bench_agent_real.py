#!/usr/bin/env python3
"""Latency of the policy agent on the real libvirt QEMU driver.

Run as root (prepares libvirtd with scripts/libvirt-setup.sh, like the e2e tests):

    .venv/bin/python bench/bench_agent_real.py [--runs 20] [--keep-libvirtd]

It starts the real agent as a separate process (``vmsched agent``), defines a
disk-less TCG guest ``vmsched-e2e-bench`` (2 vCPUs) and sets its policy through
the agent (crossed vCPU pins, emulator pin, weight 512, cap 50 %). Then, for
each run, it starts the guest with the libvirt API and destroys it again.

Figures, per run (this process registers its own libvirt event callbacks):

* ``STARTED -> verified at OS level``: from the moment this process receives
  the STARTED lifecycle event to the moment it has read, from /proc and the
  cgroup files, every vCPU thread's Cpus_allowed_list, the emulator threads',
  cpu.shares and each vCPU's cfs quota/period, all equal to the policy.
  ``in place at first look`` counts the runs where the very first read after
  the event already matched (the agent wrote the policy into the persistent
  definition, so QEMU starts pinned and there is no window).
* ``agent STARTED -> applied``: the agent's own measure, from its receipt of
  the STARTED event to its verification (and repair) being done: the per-run
  increment of the agent's histogram
  ``vmsched_agent_event_to_applied_seconds_sum{event="started"}``.
* ``STARTED -> agent's applied signal seen``: from this process's STARTED event
  to seeing that histogram's count go up (metrics scraped every ~2 ms over
  HTTP, so this includes up to a few ms of polling).
* ``drift repair``: ``pinVcpuFlags(LIVE)`` moves vCPU 0 onto the wrong CPU; from
  that call's return to the vCPU thread's Cpus_allowed_list being the policy's
  again (the agent reacts to libvirt's TUNABLE event).

``--transient`` measures the window of a transient guest instead (created with
``createXML``, as oVirt's vdsm does: its pins cannot be in a persistent
definition before it starts, so its vCPUs run unpinned until the agent has
handled STARTED). Per run, the guest is created with the same UUID and no
policy in its XML, and the figures are the times to every vCPU thread's
Cpus_allowed_list being the stored policy's, measured from: QEMU's process
start (``/proc/PID/stat`` starttime, 10 ms ticks, against CLOCK_BOOTTIME),
``createXML`` returning, and this process receiving STARTED.

Prints figures; asserts nothing. Leaves no guest behind, and stops libvirtd
at the end only if it was not running before (scripts/libvirt-teardown.sh).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.e2e.libvirt import helpers as h  # noqa: E402
from tests.support import libvirtd  # noqa: E402

NAME = h.PREFIX + "bench"
STARTED_SUM = 'vmsched_agent_event_to_applied_seconds_sum{event="started"}'
STARTED_COUNT = 'vmsched_agent_event_to_applied_seconds_count{event="started"}'


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def line(label: str, values: list[float]) -> str:
    ms = [v * 1000 for v in values]
    if not ms:
        return f"  {label:<42} (no samples)"
    return (f"  {label:<42} n={len(ms):<3} p50={pct(ms, .5):8.2f} ms  p90={pct(ms, .9):8.2f} ms  "
            f"max={max(ms):8.2f} ms  mean={statistics.fmean(ms):8.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--keep-libvirtd", action="store_true", help="do not run libvirt-teardown.sh at the end")
    ap.add_argument("--transient", action="store_true", help="measure the unpinned window of a transient guest")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_agent_real: needs root (runs libvirtd and reads QEMU's /proc entries); skipped")
        return 0

    state_file = libvirtd.STATE_DIR / "libvirtd.started"
    owned_session = not state_file.exists()
    t0 = time.monotonic()
    proc = libvirtd.run_setup(check=False)
    if proc.returncode != 0:
        print(f"bench_agent_real: libvirt-setup.sh failed; cannot run here:\n{proc.stdout}{proc.stderr}")
        return 0
    print(f"libvirtd ready in {time.monotonic() - t0:.1f} s (pid {libvirtd.libvirtd_pid()})")

    import libvirt

    h.start_event_loop()
    lv = h.Libvirt()
    started_at: dict[int, float] = {}
    started_evt = threading.Event()
    run_no = [0]

    def on_lifecycle(_c, dom, event, _detail, _o):
        if dom.name() == NAME and event == libvirt.VIR_DOMAIN_EVENT_STARTED:
            started_at[run_no[0]] = time.monotonic()
            started_evt.set()

    lv.on_connect(lambda c: c.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE,
                                                     on_lifecycle, None))
    conn = lv.conn
    cpus = h.host_cpus()
    lo, hi = min(cpus), max(cpus)
    want_vcpus = {0: frozenset({hi}), 1: frozenset({lo})}
    want_emu = {frozenset({lo})}

    workdir = Path(tempfile.mkdtemp(prefix="vmsched-bench-"))
    agent = h.AgentProcess(workdir, dedicated_pool="none")
    h.remove_guest(conn, NAME)
    g = h.OSGuest(NAME)
    os_lat, agent_lat, signal_lat, drift_lat = [], [], [], []
    first_look = 0
    try:
        agent.start()
        if args.transient:
            return transient_window(args, conn, agent, started_evt, started_at, run_no, want_vcpus, lo, hi)
        conn.defineXML(h.guest_xml(NAME, vcpus=2))
        agent.cli("policy", "set", NAME, "--pin", f"0={hi}", "--pin", f"1={lo}", "--emulator-pin", str(lo),
                  "--weight", "512", "--cap", "50")
        dom = conn.lookupByName(NAME)

        def in_place() -> bool:
            return (g.vcpu_pins() == want_vcpus and set(g.emulator_pins().values()) == want_emu
                    and g.shares() == 512 and g.vcpu_quotas() == {0: (50000, 100000), 1: (50000, 100000)})

        print(f"agent: {' '.join(agent.command())}")
        print(f"guest {NAME}: 2 vCPUs TCG, policy vcpu0={hi} vcpu1={lo} emulator={lo} weight=512 cap=50%")
        for i in range(args.runs):
            run_no[0] = i
            started_evt.clear()
            count0 = agent.metric(STARTED_COUNT)
            sum0 = agent.metric(STARTED_SUM)
            dom.create()
            if not started_evt.wait(30):
                print(f"  run {i}: no STARTED event within 30 s; skipped")
                dom.destroy()
                continue
            t_ev = started_at[i]
            first = True
            while True:
                try:
                    ok = in_place()
                except (OSError, KeyError, RuntimeError):
                    ok = False
                if ok:
                    os_lat.append(time.monotonic() - t_ev)
                    first_look += first
                    break
                first = False
                if time.monotonic() - t_ev > 30:
                    print(f"  run {i}: policy not in place 30 s after STARTED: {h.fmt_pins(g.vcpu_pins())}")
                    break
            while True:
                m = agent.metrics()
                if m.get(STARTED_COUNT, 0) > count0:
                    signal_lat.append(time.monotonic() - t_ev)
                    agent_lat.append(m[STARTED_SUM] - sum0)
                    break
                if time.monotonic() - t_ev > 30:
                    print(f"  run {i}: the agent did not report the STARTED event handled")
                    break
                time.sleep(0.002)

            # drift repair, while the guest runs
            wrong_map = tuple(c == lo for c in range(max(cpus) + 1))
            dom.pinVcpuFlags(0, wrong_map, libvirt.VIR_DOMAIN_AFFECT_LIVE)
            t_pin = time.monotonic()
            while True:
                try:
                    if g.vcpu_pins()[0] == want_vcpus[0]:
                        drift_lat.append(time.monotonic() - t_pin)
                        break
                except (OSError, KeyError, RuntimeError):
                    pass
                if time.monotonic() - t_pin > 30:
                    print(f"  run {i}: drift not repaired within 30 s")
                    break
            dom.destroy()
            h.wait_until(lambda: not g.running(), timeout=30, what="QEMU exit")
    finally:
        h.remove_guest(lv.conn, NAME)
        agent.stop()
        lv.close()
        if owned_session and not args.keep_libvirtd:
            td = libvirtd.run_teardown()
            print("teardown: " + " | ".join(td.stdout.strip().splitlines()))

    print(f"\nresults over {args.runs} start/destroy runs (real libvirtd {h.URI}, QEMU TCG, "
          f"{len(cpus)} host CPUs):")
    print(line("STARTED -> verified at OS level", os_lat))
    print(f"  {'in place at first look after STARTED':<42} {first_look}/{len(os_lat)} runs")
    print(line("agent: STARTED received -> applied", agent_lat))
    print(line("STARTED -> agent's applied signal seen", signal_lat))
    print(line("drift repair (pinVcpu LIVE -> restored)", drift_lat))
    return 0


def transient_window(args, conn, agent, started_evt, started_at, run_no, want_vcpus, lo, hi) -> int:
    """createXML the same transient guest ``--runs`` times; time to its stored pins at the OS level."""
    import uuid as uuidlib

    tick = os.sysconf("SC_CLK_TCK")
    xml = h.guest_xml(NAME, vcpus=2).replace("<name>", f"<uuid>{uuidlib.uuid4()}</uuid>\n  <name>", 1)
    g = h.OSGuest(NAME)
    dom = conn.createXML(xml, 0)
    agent.cli("policy", "set", NAME, "--pin", f"0={hi}", "--pin", f"1={lo}")
    dom.destroy()
    h.wait_until(lambda: not g.running(), timeout=30, what="QEMU exit")
    from_qemu, from_return, from_event, unpinned_seen = [], [], [], 0
    print(f"transient guest {NAME}: 2 vCPUs TCG, stored policy vcpu0={hi} vcpu1={lo}")
    for i in range(args.runs):
        run_no[0] = i
        started_evt.clear()
        dom = conn.createXML(xml, 0)
        t_ret, b_ret = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
        first = True
        while True:
            try:
                ok = g.vcpu_pins() == want_vcpus
            except (OSError, KeyError, RuntimeError):
                ok = False
            if ok:
                t_ok, b_ok = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
                break
            if first and g.running() and len(g.vcpus()) == 2:
                unpinned_seen += 1
                first = False
            if time.monotonic() - t_ret > 30:
                print(f"  run {i}: pins not in place 30 s after createXML returned")
                t_ok = None
                break
        if t_ok is not None:
            from_return.append(t_ok - t_ret)
            from_qemu.append(b_ok - g.start_ticks() / tick)
            if started_evt.wait(5):
                from_event.append(t_ok - started_at[i])
        dom.destroy()
        h.wait_until(lambda: not g.running(), timeout=30, what="QEMU exit")
    agent.cli("policy", "delete", NAME)
    print(f"\nresults over {args.runs} createXML/destroy runs (transient guest, stored policy, real libvirtd "
          f"{h.URI}, QEMU TCG):")
    print(line("QEMU process start -> pins at OS level", from_qemu))
    print(line("createXML returned -> pins at OS level", from_return))
    print(line("STARTED received -> pins at OS level", from_event))
    print(f"  {'vCPU threads seen unpinned first':<42} {unpinned_seen}/{len(from_return)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
