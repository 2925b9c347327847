"""Adaptive policy: what one tuner round costs the agent (issue 12).

An agent in-process on libvirt's test driver with N running guests (default 500), every one with a policy
that has an adaptive block (may_move, weight and cap ranges), all pinned to CPU 1 of 8. One round is the
agent's own ``TunerLoop.run_once``: reading /proc/stat, looking the guests up and reading their stats
(``domainListGetStats``), the tuning engine (three built-in tuners, the guard, the rate limits) and applying
what it decides (at most ``max_changes`` per interval). The test driver reports no vCPU counters, so after
the real stats call the counters are replaced by crafted ones (each guest busy and waiting half the time)
so that the tuners have work to do; real libvirtd adds its RPCs (bench_agent_real.py measures those).

Printed, each the median (min-max) of ROUNDS interleaved rounds:
- round: wall and CPU time of one run_once, and its CPU as % of one core at the default 10 s interval;
- engine only: the pure step (no libvirt), same guests and samples.

    .venv/bin/python bench/bench_tuner.py [--rounds 5] [--guests 500]
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
from vmsched.services.policy_agent.policy.tuning.config import TunerConfig  # noqa: E402
from vmsched.services.policy_agent.policy.tuning.samples import VcpuCounters  # noqa: E402
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--guests", type=int, default=500)
    args = parser.parse_args()
    ensure_event_loop()
    work = Path(tempfile.mkdtemp(prefix="bench-tuner-"))
    uri = node_xml(work / "node.xml", args.guests)
    agent = Agent(uri, "bench", work / "state", dedicated_pool="none", reconcile_interval=3600,
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
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
