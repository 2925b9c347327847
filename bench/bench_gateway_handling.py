"""CPU per call of the gateway's XML-RPC handling in-process, with the bus round trip stubbed.

The bench's runFilters or runCostFunctions body (``bench_gateway.py``) goes through
``engine.handle``: XML-RPC parse, request model, the bus client's typed reply parse (canned reply
bytes as a scoring service sends them: every host kept, or 3 x 100 scores, aligned when the gateway
accepts aligned scores), the decision and the XML reply. No HTTP, no broker, no decision log.
Prints the CPU microseconds per call of 5 runs (sorted). ``--profile`` prints cProfile's top functions.
``--floor``: the same runFilters body through what the floor prototype's gateway does with it instead (the
stdlib's ``xmlrpc.client.loads``, the JSON message to its worker and the worker's reply keeping every host,
``xmlrpc.client.dumps``): its handling of a call alone, for comparison.
Old/new comparisons: run it with ``PYTHONPATH`` at an exported tree of each version (cwd outside the repo).

    .venv/bin/python bench/bench_gateway_handling.py [filter|score] [--profile] [--floor]
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
import sys
import time
import xmlrpc.client
from pathlib import Path
from typing import Any

from vmsched.bus.interface import BusClient
from vmsched.bus.replies import _ok
from vmsched.gateway.engine import calls as engine
from vmsched.gateway.engine.operations import SCORE
from vmsched.gateway.engine.scheduler import Scheduler
from vmsched.messages import FilterOutcome, FilterReply, ScoreOutcomeOnBus, ScoreReply

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_gateway import FILTER_BODY, HOSTS, PLUGINS, SCORE_BODY, VM  # noqa: E402

SCORE_UNITS = [("BenchLoadScore", 1), ("BenchSpreadScore", 2), ("BenchPreferScore", 5)]


def _bench_values() -> list[list[float]]:
    """What bench_gateway.py's three score units (its PLUGINS, run here) give for SCORE_BODY's hosts and VM."""
    units: dict[str, Any] = {}
    exec(PLUGINS, units)  # noqa: S102 - the bench's own plugin source
    return [[score for _, score in units[name]().do_score(HOSTS, VM, {"prefer": HOSTS[7]})] for name, _ in SCORE_UNITS]


def canned(op: str) -> tuple[bytes, bytes]:
    if op == "filter":
        kept = [h for h in HOSTS if h != HOSTS[3]]
        return FILTER_BODY, _ok(FilterReply(outcomes=[FilterOutcome(unit=u, ok=True, duration=0.001, hosts=kept)
                                                      for u in ("BenchCpuFilter", "BenchMemFilter", "BenchLabelFilter")]))
    return SCORE_BODY, _ok(ScoreReply(outcomes=[
        ScoreOutcomeOnBus(unit=u, ok=True, duration=0.001, factor=f, values=values)
        for (u, f), values in zip(SCORE_UNITS, _bench_values())]))


class Canned(BusClient):
    """A bus client whose every round trip gives the same reply at once: the gateway's own work alone."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    @property
    def connected(self) -> bool:
        return True

    @property
    def last_error(self) -> str:
        return ""

    async def roundtrip(self, queue: str, op: str, body: dict, timeout: float, mark: tuple = ("", False)) -> bytes:
        return self.reply


def floor_call(body: bytes) -> bytes:
    """What the floor's gateway does with a runFilters body, without HTTP and the bus (its ``process``)."""
    params, _method = xmlrpc.client.loads(body)
    json.dumps({"method": "runFilters", "args": params})  # the message to its worker
    reply = json.loads(json.dumps({"result": params[1]}))  # its worker's reply: every host kept
    return xmlrpc.client.dumps((reply["result"],), methodresponse=True).encode()


def main() -> None:
    if "--floor" in sys.argv:
        assert floor_call(FILTER_BODY).count(b"<string>") == len(HOSTS)

        def floor_run(n: int) -> float:
            started = time.process_time()
            for _ in range(n):
                floor_call(FILTER_BODY)
            return (time.process_time() - started) / n * 1e6

        floor_run(200)
        print("floor filter CPU us per call:", sorted(round(floor_run(3000), 1) for _ in range(5)))
        return
    op = "score" if "score" in sys.argv[1:] else "filter"
    body, reply = canned(op)
    scheduler = Scheduler(Canned(reply), 30.0)

    async def run(n: int) -> float:
        out = await engine.handle(scheduler, body)
        assert b"<name>result_code</name>" in out and b"<fault>" not in out, out[:300]
        started = time.process_time()
        for _ in range(n):
            await engine.handle(scheduler, body)
        return (time.process_time() - started) / n * 1e6

    if "--profile" in sys.argv:
        cProfile.runctx("asyncio.run(run(2000))", globals(), {"asyncio": asyncio, "run": run}, "/tmp/gateway-handling.prof")
        pstats.Stats("/tmp/gateway-handling.prof").sort_stats("tottime").print_stats(25)
    else:
        print(op, "CPU us per call:", sorted(round(asyncio.run(run(3000)), 1) for _ in range(5)))


if __name__ == "__main__":
    main()
