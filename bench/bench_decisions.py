"""The cost of the decision log on the engine's request path (issue 15: at most 3 %).

Two all-in-one gateways on the embedded bus run side by side: ``on`` (the
default: decisions kept and shared on the bus) and ``off``
(VMSCHED_DECISIONS_SIZE=0: no decision log); ``--sides on,local,off`` adds
``local`` (kept, not shared: VMSCHED_DECISIONS_SHARE=false). Each round
measures, on every side in turn (the order rotates from round to round),
sequential runFilters (3 filters, 100 hosts, a new connection per call, like
the engine) and then the throughput of 8 concurrent clients. Since both
sides are measured within the same round, each round gives a paired ratio
(``on`` against ``off``); reported are the median of those ratios over the
rounds and their spread (lowest to highest). The machine may be shared with
other work: the interleaving is what makes the comparison fair, and the
spread says how far to trust it.

    .venv/bin/python bench/bench_decisions.py [--rounds 7] [--calls 1000] [--seconds 8] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import FILTER_BODY, PLUGINS, arun, concurrent, free_port, pct, sequential, start, wait_ready  # noqa: E402

ENV = {"on": {}, "local": {"VMSCHED_DECISIONS_SHARE": "false"}, "off": {"VMSCHED_DECISIONS_SIZE": "0"}}


def _spread(values: list[float]) -> str:
    return f"{min(values):+.1f} .. {max(values):+.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000, help="sequential runFilters per side and round")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of one concurrent run per side and round")
    ap.add_argument("--sides", default="on,off", help="of on, local, off; 'off' is the baseline")
    opts = ap.parse_args()
    names = [n for n in opts.sides.split(",") if n in ENV]
    if "off" not in names or len(names) < 2:
        ap.error("--sides needs 'off' and at least one of 'on', 'local'")
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-decisions-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' when Python lives under /root
        os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
    ports = {name: free_port() for name in names}
    procs = []
    for name in names:
        os.environ.update(ENV[name])
        procs.append(start(["run", "--amqp", "memory://", "--port", str(ports[name]), "--metrics-port", "0",
                            "--plugins", str(tmp / "plugins"), "--log-level", "WARNING"], tmp / f"{name}.log"))
        for key in ENV[name]:
            os.environ.pop(key)
    p50: dict[str, list[float]] = {n: [] for n in names}
    rate: dict[str, list[float]] = {n: [] for n in names}
    try:
        for port in ports.values():
            wait_ready(port)
        for i in range(opts.rounds):
            order = names[i % len(names):] + names[:i % len(names)]  # each side first in turn
            for name in order:
                p50[name].append(pct(arun(sequential(ports[name], FILTER_BODY, opts.calls)), 0.50))
            for name in order:
                done, elapsed = arun(concurrent(ports[name], [FILTER_BODY], opts.clients, opts.seconds))
                rate[name].append(done / elapsed)
            print(f"round {i + 1}: " + "; ".join(f"{n} p50 {p50[n][-1]:.3f} ms, {rate[n][-1]:.0f} req/s"
                                                 for n in names), flush=True)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(15)
    try:
        load = " (load average %.1f %.1f %.1f at the end)" % os.getloadavg()
    except OSError:
        load = ""
    print(f"\nrunFilters, {opts.rounds} interleaved rounds; {os.cpu_count()} CPUs, load generator included{load}:")
    for n in names:
        print(f"  {n:5}  sequential p50 median {statistics.median(p50[n]):.3f} ms "
              f"(rounds {min(p50[n]):.3f}-{max(p50[n]):.3f}); {opts.clients} clients median "
              f"{statistics.median(rate[n]):.0f} req/s (rounds {min(rate[n]):.0f}-{max(rate[n]):.0f})")
    base_p50, base_rate = p50["off"], rate["off"]
    for n in names:
        if n == "off":
            continue
        slower = [100 * (a / b - 1) for a, b in zip(p50[n], base_p50)]  # + : the log makes a call slower
        fewer = [100 * (b / a - 1) for a, b in zip(rate[n], base_rate)]  # + : the log costs throughput
        print(f"  cost of '{n}' vs 'off', median of the per-round ratios (spread):")
        print(f"    sequential p50    {statistics.median(slower):+.1f} %  ({_spread(slower)})")
        print(f"    {opts.clients}-client rate   {statistics.median(fewer):+.1f} %  ({_spread(fewer)})")


if __name__ == "__main__":
    main()
