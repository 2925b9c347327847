"""CPU per request of the service side of the plugin pool and its workers, in process.

Runs a PluginPool with the bench plugins of ``bench_gateway.py`` and drives it like a scoring service:
``--threads`` threads each run requests of 3 units on 100 hosts (runFilters or runCostFunctions). Prints
CPU milliseconds per request of this process and of the plugin workers (from /proc, exact), and the rate.

    .venv/bin/python bench/pool_micro.py [--op filter|score] [--threads 2] [--seconds 3] [--pool-size 4]
        [--read] [--aligned] [--units-alone]

``--read`` also reads each unit's result as the scoring service does (its per-unit outcome, pydantic model
included); ``--aligned`` sets the pool's ``aligned_scores`` (score results as bare numbers, checked again
by that read); ``--units-alone`` runs the 3 units in this process instead, without a pool: what the units
themselves cost. To compare two trees (old and new), run it with PYTHONPATH pointing at each, interleaved;
to compare aligned scores, run ``--op score --read`` with and without ``--aligned``, interleaved.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import HOSTS, PLUGINS  # noqa: E402

from vmsched.runtime.pool.pool import PluginPool  # noqa: E402
from vmsched.runtime.types import Call, Confinement  # noqa: E402
from vmsched.runtime.units import UnitRun, filter_outcome, score_outcome  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            kids += [int(p) for p in f.read().split()]
    return kids


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=("filter", "score"), default="filter")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--bundle-seconds", type=float, help="PluginPool bundle_seconds (0: every unit alone)")
    parser.add_argument("--read", action="store_true", help="read each result as the scoring service does")
    parser.add_argument("--aligned", action="store_true", help="the pool's aligned_scores on (score results as numbers)")
    parser.add_argument("--units-alone", action="store_true", help="the units' own CPU per request, no pool")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pool-micro-"))
    (folder / "bench.py").write_text(PLUGINS)
    names = ["BenchCpuFilter", "BenchMemFilter", "BenchLabelFilter"] if options.op == "filter" else [
        "BenchLoadScore", "BenchSpreadScore", "BenchPreferScore"]
    method = "do_filter" if options.op == "filter" else "do_score"
    args = (list(HOSTS), "vm-1", {"deny": "h-1,h-2"})
    if options.units_alone:
        units: dict = {}
        exec(PLUGINS, units)  # noqa: S102 - the bench's own plugin source
        started, count = time.process_time(), 0
        while time.process_time() - started < options.seconds:
            for name in names:
                getattr(units[name](), method)(*args)
            count += 1
        print(f"the units alone: {(time.process_time() - started) * 1000 / count:.3f} ms CPU per request")
        return 0
    confinement = Confinement(allow_root=True)
    extra = {} if options.bundle_seconds is None else {"bundle_seconds": options.bundle_seconds}
    pool = PluginPool(folder, size=options.pool_size, name="micro", confinement=confinement, max_calls=10**9,
                      **extra)  # never recycled: a recycled worker's CPU would be lost to the count
    pool.aligned_scores = options.aligned
    pool.start()
    pool.warm(["bench"])
    stop = threading.Event()
    counts = [0] * options.threads

    def client(i: int) -> None:
        while not stop.is_set():
            results = pool.run([Call("bench", n, method, args, 10.0) for n in names], deadline=time.time() + 10)
            assert all(r.ok for r in results), results
            assert all((r.scores is not None) == (options.aligned and options.op == "score") for r in results)
            if options.read:
                hosts = args[0]
                outcomes = [filter_outcome(UnitRun(n, r), hosts) if options.op == "filter" else
                            score_outcome(UnitRun(n, r), 1, hosts) for n, r in zip(names, results)]
                assert all(o.ok for o in outcomes), outcomes
            counts[i] += 1

    for _ in range(50):
        pool.run([Call("bench", n, method, args, 10.0) for n in names])
    kids = _children(os.getpid())
    before_self, before_kids = _cpu(os.getpid()), sum(_cpu(k) for k in kids)
    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(options.threads)]
    for t in threads:
        t.start()
    time.sleep(options.seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    total = sum(counts)
    self_ms = (_cpu(os.getpid()) - before_self) * 1000 / total
    kids_ms = (sum(_cpu(k) for k in kids if os.path.exists(f"/proc/{k}")) - before_kids) * 1000 / total
    pool.close()
    result = {"service_ms": round(self_ms, 3), "workers_ms": round(kids_ms, 3),
              "total_ms": round(self_ms + kids_ms, 3), "rate": round(total / elapsed, 1)}
    print(json.dumps(result) if options.json else
          f"service {self_ms:.3f} ms + workers {kids_ms:.3f} ms = {self_ms + kids_ms:.3f} ms CPU per request; "
          f"{total / elapsed:.0f} req/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
