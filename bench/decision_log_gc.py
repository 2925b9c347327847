"""The decision log's CPU and garbage-collector cost per decision, in one process (no HTTP, no bus, no noise of
other processes): what bench_decisions.py's side-by-side figures are made of.

Each call builds what a runFilters request leaves behind (the request validated from a dict, the service's reply
with 3 filter outcomes on 100 hosts, the engine's decision; ``--op score``: runCostFunctions, 3 score units' aligned
values paired with the hosts as the gateway does), then hands it to the log (``on``) or drops it
(``off``); every ``--batch`` calls the log rings the waiting ones (its 0.2 s batch at that request rate). ``--old
REV`` adds the decision log of git revision REV (``old``: its decision_log.py and decision_compact.py), loaded
from ``git show``. Variants alternate within
each round; reported are the medians over the rounds of CPU per call (``time.process_time``) and of the
collector's CPU per call (``gc.callbacks``), with ``--heap`` extra long-lived objects standing in for a
gateway's heap (a full collection walks them all).

    .venv/bin/python bench/decision_log_gc.py [--rounds 7] [--calls 5000] [--batch 60] [--heap 300000] [--old 2ccb499]
        [--op score]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vmsched.gateway import decision_log  # noqa: E402
from vmsched.gateway.operations import paired_scores  # noqa: E402
from vmsched.gateway.render import filter_decision, score_decision  # noqa: E402
from vmsched.messages import FilterReply, FilterRequest, ScoreReplyOnBus, ScoreRequest  # noqa: E402

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


def _module(rev: str, name: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:gateway/{name}.py"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType(f"{name}_{rev}")
    module.__dict__["__name__"] = module.__name__
    sys.modules[module.__name__] = module
    exec(compile(source, f"{rev}:gateway/{name}.py", "exec"), module.__dict__)  # noqa: S102 - our own history
    return module


def old_module(rev: str) -> types.ModuleType:
    """REV's decision log, with REV's compact form where it had one."""
    module = _module(rev, "decision_log")
    if "decision_compact" in module.__dict__:
        module.decision_compact = _module(rev, "decision_compact")
    return module


def _filter() -> tuple[Any, Any, Any]:
    req = FilterRequest.model_validate(REQUEST)
    outcomes = FilterReply.model_validate(REPLY).outcomes
    return req, filter_decision(req.hosts, outcomes), outcomes


def _score() -> tuple[Any, Any, Any]:
    req = ScoreRequest.model_validate(SCORE_REQUEST)
    outcomes = paired_scores(req, ScoreReplyOnBus.model_validate(SCORE_REPLY)).outcomes
    return req, score_decision(req.hosts, outcomes), outcomes


REQUESTS = {"filter": _filter, "score": _score}


def run(submit: Callable[..., None] | None, ring: Callable[[], None] | None, calls: int, batch: int,
        op: str = "filter") -> tuple[float, float]:
    """CPU and collector seconds per call."""
    make = REQUESTS[op]
    gc_seconds[0] = 0.0
    started = time.process_time()
    for i in range(calls):
        req, decision, outcomes = make()
        if submit is not None:
            submit(op, req, decision, outcomes, False, 0.002)
            if ring is not None and i % batch == batch - 1:
                ring()
    return (time.process_time() - started) / calls, gc_seconds[0] / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--batch", type=int, default=60, help="calls per ringing of the waiting decisions")
    ap.add_argument("--heap", type=int, default=300_000, help="long-lived objects standing in for the gateway's")
    ap.add_argument("--size", type=int, default=200, help="ring size per operation")
    ap.add_argument("--old", help="a git revision whose decision log is compared too")
    ap.add_argument("--op", choices=sorted(REQUESTS), default="filter")
    opts = ap.parse_args()
    heap = [[i] for i in range(opts.heap)]  # noqa: F841 - kept alive: what a full collection walks
    gc.callbacks.append(_on_gc)
    logs: dict[str, Any] = {"off": None, "on": decision_log.DecisionLog(opts.size, "gw")}
    if opts.old:
        logs["old"] = old_module(opts.old).DecisionLog(opts.size, "gw")
    cpu: dict[str, list[float]] = {n: [] for n in logs}
    collector: dict[str, list[float]] = {n: [] for n in logs}
    for name, log in logs.items():  # warm-up: fill the rings
        run(log and _quiet(log), log and _ring(log), opts.size * 3, opts.batch, opts.op)
    for r in range(opts.rounds):
        names = list(logs)[r % len(logs):] + list(logs)[:r % len(logs)]
        for name in names:
            log = logs[name]
            c, g = run(log and _quiet(log), log and _ring(log), opts.calls, opts.batch, opts.op)
            cpu[name].append(c * 1e6)
            collector[name].append(g * 1e6)
        print(f"round {r + 1}: " + "; ".join(f"{n} {cpu[n][-1]:.1f} us/call (gc {collector[n][-1]:.1f})"
                                             for n in logs), flush=True)
    med = statistics.median
    print(f"\n{opts.op}: {opts.rounds} rounds of {opts.calls} calls, ring {opts.size}, batch {opts.batch}, heap {opts.heap}:")
    for n in logs:
        print(f"  {n:4} CPU {med(cpu[n]):.1f} us/call ({min(cpu[n]):.1f}-{max(cpu[n]):.1f}), of it the collector "
              f"{med(collector[n]):.1f} ({min(collector[n]):.1f}-{max(collector[n]):.1f})")
    for n in logs:
        if n != "off":
            extra = [a - b for a, b in zip(cpu[n], cpu["off"])]
            print(f"  {n} - off: {med(extra):+.1f} us/call ({min(extra):+.1f} .. {max(extra):+.1f})")


def _quiet(log: Any) -> Callable[..., None]:
    """The log's submit, outside an event loop: it rings at once unless a batch timer is pending."""
    log._timer = True  # the batch is rung by run() every --batch calls, as the loop's timer would
    return log.submit


def _ring(log: Any) -> Callable[[], None]:
    def ring() -> None:
        log.record_pending()
        log._timer = True  # still "pending": submit never rings by itself here

    return ring


if __name__ == "__main__":
    main()
