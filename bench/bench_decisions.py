"""The cost of the decision log on the engine's request path (issue 15: at most 3 %).

Three all-in-one gateways on the embedded bus run side by side: ``log``
(the default: decisions kept and shared on the bus), ``local`` (kept, not
shared: VMSCHED_DECISIONS_SHARE=false) and ``nolog`` (VMSCHED_DECISIONS_SIZE=0).
Each round measures sequential runFilters (3 filters, 100 hosts, a new
connection per call, like the engine) on each, rotating the order. Reported: the median over rounds of each side's p50, the spread, and
the relative cost. The machine may be shared: read the spread first.

    .venv/bin/python bench/bench_decisions.py [--rounds 5] [--calls 1000]
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

from bench_gateway import FILTER_BODY, PLUGINS, arun, free_port, pct, sequential, start, wait_ready  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000, help="sequential runFilters per side and round")
    opts = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-decisions-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' when Python lives under /root
        os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
    sides = {"log": free_port(), "local": free_port(), "nolog": free_port()}
    env = {"log": {}, "local": {"VMSCHED_DECISIONS_SHARE": "false"}, "nolog": {"VMSCHED_DECISIONS_SIZE": "0"}}
    procs = []
    for name, port in sides.items():
        os.environ.update(env[name])
        procs.append(start(["run", "--amqp", "memory://", "--port", str(port), "--metrics-port", "0", "--plugins",
                            str(tmp / "plugins"), "--log-level", "WARNING"], tmp / f"{name}.log"))
        for key in env[name]:
            os.environ.pop(key)
    p50: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for port in sides.values():
            wait_ready(port)
        for i in range(opts.rounds):
            order = list(sides)[i % 3:] + list(sides)[:i % 3]  # each side first in turn
            for name in order:
                p50[name].append(pct(arun(sequential(sides[name], FILTER_BODY, opts.calls)), 0.50))
            print(f"round {i + 1}: " + ", ".join(f"{n} p50 {p50[n][-1]:.3f} ms" for n in sides), flush=True)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(15)
    med = {n: statistics.median(v) for n, v in p50.items()}
    print(f"\nrunFilters p50, median of {opts.rounds} interleaved rounds of {opts.calls} calls "
          f"({os.cpu_count()} CPUs, load generator included):")
    for n in sides:
        print(f"  {n:6} {med[n]:.3f} ms  (rounds {min(p50[n]):.3f}-{max(p50[n]):.3f} ms)")
    for n in ("log", "local"):
        print(f"  decision log cost ({n}): {100 * (med[n] / med['nolog'] - 1):+.1f} % of the request path")


if __name__ == "__main__":
    main()
