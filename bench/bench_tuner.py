"""Adaptive policy: what one tuner round costs the agent.

An agent in-process on libvirt's test driver with N running guests (default 500), every one with a policy
that has an adaptive block (may_move, weight and cap ranges), all pinned to CPU 1 of 8. One round is the
agent's own ``TunerLoop.run_once``: reading /proc/stat, looking the guests up and reading their stats
(``domainListGetStats``), the tuning engine (three built-in tuners, the guard, the rate limits) and applying
what it decides (at most ``max_changes`` per interval). The test driver reports no vCPU counters, so after
the real stats call the counters are replaced by crafted ones (each guest busy and waiting half the time)
so that the tuners have work to do; real libvirtd adds its RPCs (bench_agent_real.py measures those).

Printed, each the median (min-max) of ROUNDS interleaved rounds:
- round: wall and CPU time of one run_once, and its CPU as % of one core at the default 10 s interval;
- engine only: the pure step (no libvirt), same guests and samples;
- agent CPU (``--window S``, 0: skip): the whole agent process's CPU time over S seconds with its tuner
  thread at the default interval, against the same agent with tuning off (``--tune-interval 0``), in
  alternating windows.

    .venv/bin/python bench/bench_tuner.py [--rounds 5] [--guests 500] [--window 30]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vmsched.services.policy_agent.agent import Agent  # noqa: E402
from vmsched.services.policy_agent.tuners.config import TunerConfig  # noqa: E402
from vmsched.services.policy_agent.tuners.samples import VcpuCounters  # noqa: E402
from vmsched.services.policy_agent.virt.connection import ensure_event_loop  # noqa: E402

DEFAULT_INTERVAL = TunerConfig().interval
POLICY = {"vcpu_pins": {0: "1"}, "adaptive": {"may_move": True, "weight": [512, 4096], "cap_percent": [20, 100]}}


def spread(values: list[float], fmt: str = "{:.3g}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def node_xml(path: Path, guests: int) -> str:
    domains = "".join(f"<domain type='test'><name>g{i}</name><memory unit='KiB'>65536</memory><vcpu>1</vcpu>"
                      f"<os><type>hvm</type></os></domain>" for i in range(guests))
    path.write_text(f"<node><cpu><mhz>2000</mhz><model>i686</model><active>8</active><nodes>1</nodes><sockets>1"
                    f"</sockets><cores>8</cores><threads>1</threads></cpu><memory>8388608</memory>{domains}</node>")
    return f"test://{path}"


def crafted(real):
    """Counters that grow with the clock: each guest busy half the time and waiting half of that."""
    def counters(guests):
        runs = {u: c.run for u, c in real(guests).items()}
        ns = time.monotonic_ns()
        return {g.uuid: VcpuCounters(1, ns // 2, ns // 4, runs.get(g.uuid, 1)) for g in guests}
    return counters


def agent_cpu(uri: str, work: Path, guests: int, window: float, rounds: int) -> None:
    """Process CPU over ``window`` seconds: tuning on (default interval) vs off, alternating."""
    on: list[float] = []
    off: list[float] = []
    for i in range(rounds * 2):
        tuning = i % 2 == 0
        state = work / f"state{i}"
        config = TunerConfig() if tuning else TunerConfig(interval=0)
        agent = Agent(uri, "bench", state, None, dedicated_pool="none", reconcile_interval=3600, lock_dir=work / "lock",
                      tuner=config)
        agent.start()
        try:
            for n in range(guests):  # each agent opens the node file afresh: a new test-driver state
                agent.set_policy(f"g{n}", POLICY)
            assert len(agent._tuner.adaptive_guests()) == guests  # type: ignore[union-attr]
            loop = agent._tuner
            assert loop is not None
            loop._read_counters = crafted(loop._read_counters)  # type: ignore[method-assign]
            c = time.process_time()
            time.sleep(window)
            (on if tuning else off).append(100 * (time.process_time() - c) / window)
        finally:
            agent.stop()
    print(f"agent process CPU, {guests} adaptive guests, {window:g} s windows (median (min-max) of {rounds} each)")
    print(f"  tuning on (every {DEFAULT_INTERVAL:g} s): {spread(on)} % of one core; off: {spread(off)} %")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--guests", type=int, default=500)
    parser.add_argument("--window", type=float, default=0.0, help="seconds per agent CPU window (0: skip)")
    args = parser.parse_args()
    ensure_event_loop()
    work = Path(tempfile.mkdtemp(prefix="bench-tuner-"))
    uri = node_xml(work / "node.xml", args.guests)
    agent = Agent(uri, "bench", work / "state", None, dedicated_pool="none", reconcile_interval=3600,
                  lock_dir=work / "lock", tuner=TunerConfig(interval=0)).start()
    try:
        t0 = time.perf_counter()
        for i in range(args.guests):
            agent.set_policy(f"g{i}", POLICY)
        print(f"{args.guests} adaptive policies set in {time.perf_counter() - t0:.1f} s")
        loop = agent._tuner
        assert loop is not None
        real = loop._read_counters
        ns = [0]

        def counters(guests):  # the real stats call, then crafted counters (busy and waiting half the time)
            runs = {u: c.run for u, c in real(guests).items()}
            return {g.uuid: VcpuCounters(1, ns[0], ns[0] // 2, runs.get(g.uuid, 1)) for g in guests}

        loop._read_counters = counters  # type: ignore[method-assign]
        loop.run_once()  # baselines
        round_wall, round_cpu, engine_wall, decided = [], [], [], []
        for _ in range(args.rounds * 3):  # hysteresis 3: every third round has decisions
            ns[0] += 10_000_000_000
            loop._when = (loop._when or 0) - DEFAULT_INTERVAL
            w, c = time.perf_counter(), time.process_time()
            decisions = loop.run_once()
            round_wall.append(time.perf_counter() - w)
            round_cpu.append(time.process_time() - c)
            decided.append(len(decisions))
            with agent.enforcer.lock:  # type: ignore[union-attr]
                shared = frozenset(agent.pools.shared)
                views = [loop._view(g, 1, shared) for g in loop.adaptive_guests()]
            inp = loop.engine.input(shared, [v for v in views if v is not None])
            w = time.perf_counter()
            loop.engine.step(inp)
            engine_wall.append(time.perf_counter() - w)
        pct = [100 * c / DEFAULT_INTERVAL for c in round_cpu]
        print(f"tuner round, {args.guests} adaptive guests on the test driver (median (min-max) of "
              f"{len(round_wall)} rounds; {sum(decided)} decisions, at most {loop.config.max_changes} applied each)")
        print(f"  round: {spread([x * 1000 for x in round_wall])} ms wall, {spread([x * 1000 for x in round_cpu])} ms"
              f" CPU; {spread(pct)} % of one core at the default {DEFAULT_INTERVAL:g} s interval")
        print(f"  engine only: {spread([x * 1000 for x in engine_wall])} ms")
    finally:
        agent.stop()
    try:
        if args.window > 0:
            agent_cpu(uri, work, args.guests, args.window, args.rounds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
