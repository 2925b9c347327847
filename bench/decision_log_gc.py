"""The decision log's CPU and garbage-collector cost per decision, in one process (no HTTP, no bus, no noise of
other processes): what bench_decisions.py's side-by-side figures are made of.

Each call builds what a runFilters request leaves behind (the request validated from a dict, the service's reply
with 3 filter outcomes on 100 hosts, the engine's decision; ``--op score``: runCostFunctions, 3 score units' aligned
values paired with the hosts as the gateway does), then hands it to the log (``on``) or drops it
(``off``). Variants alternate within each round (to compare two revisions of the log, use
``bench_decisions.py --before``); reported are the medians over the rounds of CPU per call (``time.process_time``) and of the
collector's CPU per call (``gc.callbacks``), with ``--heap`` extra long-lived objects standing in for a
gateway's heap (a full collection walks them all).

    .venv/bin/python bench/decision_log_gc.py [--rounds 7] [--calls 5000] [--heap 300000] [--op score]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vmsched.gateway.decisions.log import DecisionLog  # noqa: E402
from vmsched.gateway.engine.operations import paired_scores  # noqa: E402
from vmsched.decide.rules import filter_decision, score_decision  # noqa: E402
from vmsched.messages import FilterReply, FilterRequest, ScoreReply, ScoreRequest  # noqa: E402

HOSTS = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(100)]
REQUEST = {"units": ["A", "B", "C"], "hosts": HOSTS, "vm": "11111111-2222-3333-4444-555555555555", "args": {}}
REPLY = {"outcomes": [{"unit": u, "ok": True, "kind": "filter", "duration": 0.001,
                       "hosts": [h for j, h in enumerate(HOSTS) if j % 10 != k]} for k, u in enumerate("ABC")]}
SCORE_REQUEST = {"units": [{"name": u, "factor": f} for u, f in (("A", 1), ("B", 2), ("C", 3))], "hosts": HOSTS,
                 "vm": "11111111-2222-3333-4444-555555555555"}
SCORE_REPLY = {"outcomes": [{"unit": u, "ok": True, "kind": "score", "factor": k + 1, "duration": 0.001,
                             "values": [float((j * 7 + k) % 97) / 3 for j in range(len(HOSTS))]}
                            for k, u in enumerate("ABC")]}
gc_seconds = [0.0]
_began = [0.0]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _began[0] = time.process_time()
    else:
        gc_seconds[0] += time.process_time() - _began[0]


def _filter() -> tuple[Any, Any, Any]:
    req = FilterRequest.model_validate(REQUEST)
    outcomes = FilterReply.model_validate(REPLY).outcomes
    return req, filter_decision(req.hosts, outcomes), outcomes


def _score() -> tuple[Any, Any, Any]:
    req = ScoreRequest.model_validate(SCORE_REQUEST)
    outcomes = paired_scores(req, ScoreReply.model_validate(SCORE_REPLY)).outcomes
    return req, score_decision(req.hosts, outcomes), outcomes


REQUESTS = {"filter": _filter, "score": _score}


def run(submit: Callable[..., None] | None, calls: int, op: str = "filter") -> tuple[float, float]:
    """CPU and collector seconds per call."""
    make = REQUESTS[op]
    gc_seconds[0] = 0.0
    started = time.process_time()
    for _ in range(calls):
        req, decision, outcomes = make()
        if submit is not None:
            submit(op, req, decision, outcomes, False, 0.002)
    return (time.process_time() - started) / calls, gc_seconds[0] / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--heap", type=int, default=300_000, help="long-lived objects standing in for the gateway's")
    ap.add_argument("--size", type=int, default=200, help="ring size per operation")
    ap.add_argument("--op", choices=sorted(REQUESTS), default="filter")
    opts = ap.parse_args()
    heap = [[i] for i in range(opts.heap)]  # noqa: F841 - kept alive: what a full collection walks
    gc.callbacks.append(_on_gc)
    logs: dict[str, Any] = {"off": None, "on": DecisionLog(opts.size, "gw")}
    cpu: dict[str, list[float]] = {n: [] for n in logs}
    collector: dict[str, list[float]] = {n: [] for n in logs}
    for name, log in logs.items():  # warm-up: fill the rings
        run(log and log.submit, opts.size * 3, opts.op)
    for r in range(opts.rounds):
        names = list(logs)[r % len(logs):] + list(logs)[:r % len(logs)]
        for name in names:
            log = logs[name]
            c, g = run(log and log.submit, opts.calls, opts.op)
            cpu[name].append(c * 1e6)
            collector[name].append(g * 1e6)
        print(f"round {r + 1}: " + "; ".join(f"{n} {cpu[n][-1]:.1f} us/call (gc {collector[n][-1]:.1f})"
                                             for n in logs), flush=True)
    med = statistics.median
    print(f"\n{opts.op}: {opts.rounds} rounds of {opts.calls} calls, ring {opts.size}, heap {opts.heap}:")
    for n in logs:
        print(f"  {n:4} CPU {med(cpu[n]):.1f} us/call ({min(cpu[n]):.1f}-{max(cpu[n]):.1f}), of it the collector "
              f"{med(collector[n]):.1f} ({min(collector[n]):.1f}-{max(collector[n]):.1f})")
    for n in logs:
        if n != "off":
            extra = [a - b for a, b in zip(cpu[n], cpu["off"])]
            print(f"  {n} - off: {med(extra):+.1f} us/call ({min(extra):+.1f} .. {max(extra):+.1f})")


if __name__ == "__main__":
    main()
