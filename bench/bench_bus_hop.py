"""CPU per request of the bus hop alone: gateway bus client -> RabbitMQ -> service worker -> reply.

No HTTP and no plugins: a ``ServiceWorker`` (its own process, the shipped defaults: quorum request queue,
2 handler threads, prefetch 8, the in-flight journal) answers runFilters requests of 3 units x 100 hosts with a
typed reply of the same size as the scoring service's (every host kept), built in the handler without
running anything; ``--op score`` answers 3 x 100 (host, score) pairs (aligned numbers when the caller,
like the gateway, accepts them: ``Envelope.accepts``), paired again on the caller's side as the gateway does. The caller is the gateway's
``AsyncBusClient`` (publisher confirms on) with ``--clients`` concurrent calls for ``--seconds``.
Reported: CPU milliseconds per request of the service process and of the calling process (from
/proc), and the rate. Old/new comparisons: run it with ``PYTHONPATH`` at an exported tree of the old
commit and at this one, interleaved, on the same broker.

    .venv/bin/python bench/bench_bus_hop.py [--op filter|score] [--clients 8] [--seconds 5] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import floor  # noqa: E402

HOSTS = [f"host-{i:03d}-4d6f-8a1e-{i:012d}" for i in range(100)]
UNITS = ["bench_filter_a", "bench_filter_b", "bench_filter_c"]

SERVICE = r'''
import sys, threading, time, signal
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.worker import ServiceWorker
from vmsched.bus.topology import REQUEST_QUEUES
from vmsched.messages import FilterOutcome, FilterReply, FilterRequest, Op, ScoreOutcomeOnBus, ScoreReply, ScoreRequest

def filt(env):
    req = FilterRequest.model_validate(env.body)
    return FilterReply(outcomes=[FilterOutcome(unit=u, ok=True, duration=0.001, hosts=list(req.hosts)) for u in req.units])

def score(env):
    req = ScoreRequest.model_validate(env.body)
    return ScoreReply(outcomes=[ScoreOutcomeOnBus(unit=u.name, ok=True, duration=0.001, factor=u.factor,
                                                  values=[float(i % 7) for i in range(len(req.hosts))])
                                for u in req.units])

stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
worker = ServiceWorker(BusOptions(url=sys.argv[1]), "scoring", consumers=2, prefetch=8, journal_dir=__import__("pathlib").Path(sys.argv[2]),
                       routes={REQUEST_QUEUES[Op.FILTER]: filt, REQUEST_QUEUES[Op.SCORE]: score})
worker.start()
worker.ready.wait(30)
print("READY", flush=True)
stop.wait()
worker.stop()
'''


def cpu(pid: int | str = "self") -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, op: str, clients: int, seconds: float, service_pid: int) -> dict[str, float]:
    from vmsched.bus.rabbitmq.client import AsyncBusClient
    from vmsched.bus.options import BusOptions
    from vmsched.bus.topology import REQUEST_QUEUES
    from vmsched.messages import FilterReply, FilterRequest, Op, ScoreReply, ScoreRequest

    bus = AsyncBusClient(BusOptions(url=url), declare=(REQUEST_QUEUES[Op.FILTER], REQUEST_QUEUES[Op.SCORE]))
    await bus.start()
    if op == "filter":
        queue, req, model = REQUEST_QUEUES[Op.FILTER], FilterRequest(units=UNITS, hosts=HOSTS, vm="vm-1"), FilterReply
    else:
        queue, model = REQUEST_QUEUES[Op.SCORE], ScoreReply
        req = ScoreRequest.model_validate({"units": [{"name": u, "factor": 2} for u in UNITS], "hosts": HOSTS})
    from vmsched.gateway.engine.operations import SCORE

    async def one() -> None:
        reply = await bus.call(queue, op, req.model_dump(), 5.0, model)
        if op == "score":
            reply = SCORE.complete(req, reply)
        kept = reply.outcomes[0].scores if op == "score" else reply.outcomes[0].hosts
        assert len(reply.outcomes) == 3 and reply.outcomes[0].ok and len(kept) == 100, reply

    for _ in range(200):  # warm-up
        await one()
    done = 0
    stop_at = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < stop_at:
            await one()
            done += 1

    mine, theirs, started = cpu(), cpu(service_pid), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    result = {"requests": done, "rate": done / elapsed, "service_ms": (cpu(service_pid) - theirs) * 1000 / done,
              "caller_ms": (cpu() - mine) * 1000 / done}
    await bus.close()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="filter", choices=["filter", "score"])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    opts = ap.parse_args()
    journal = tempfile.mkdtemp(prefix="vmsched-hop-")
    with floor.vhost(opts.amqp, "vmsched-bench-hop") as url:
        service = subprocess.Popen([sys.executable, "-c", SERVICE, url, journal], stdout=subprocess.PIPE,
                                   start_new_session=True)
        try:
            assert service.stdout is not None and service.stdout.readline().strip() == b"READY"
            for _ in range(opts.rounds):
                import uvloop
                print(json.dumps(uvloop.run(drive(url, opts.op, opts.clients, opts.seconds, service.pid))), flush=True)
        finally:
            os.killpg(service.pid, signal.SIGTERM)
            service.wait(15)


if __name__ == "__main__":
    main()
