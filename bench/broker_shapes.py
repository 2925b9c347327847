"""Broker CPU per request/reply round trip, by shape of the exchange: what each design choice costs RabbitMQ.

Starts a private RabbitMQ node (nothing else loads it) and, on a vhost of its own for each shape, runs a
requester and a responder (two threads, two connections, kombu) that pass a 5.7 kB request and a reply
back and forth with ``--inflight`` requests outstanding, for ``--seconds``. Shapes, from the floor prototype's
to vmsched's, each adding one choice to the one before:

- ``floor``: default exchange, quorum request queue, transient messages, replies by direct reply-to, no confirms;
- ``+exchange``: requests through a named exchange (``--kind`` direct or topic) instead of the default one;
- ``+reply queue``: replies through a direct exchange to the requester's exclusive queue (not direct reply-to);
- ``+request confirms``: the requester in publisher-confirm mode;
- ``+reply confirms``: the responder too, acknowledging a request once its reply is confirmed;
- ``+expiration``: each request with a per-message TTL, persistent (kombu's default).

In rounds (the order alternates), the broker's CPU per round trip (its whole process tree, from /proc).

    .venv/bin/python bench/broker_shapes.py [--rounds 3] [--seconds 4] [--inflight 8] [--kind direct]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from kombu import Connection, Consumer, Exchange, Producer, Queue

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from floor_cpu import _tree_cpu  # noqa: E402

SHAPES = ["floor", "+exchange", "+reply queue", "+request confirms", "+reply confirms", "+expiration"]
REQUEST = b"r" * 5700  # a runFilters call of 100 hosts, as JSON


def _has(shape: str, part: str) -> bool:
    return SHAPES.index(shape) >= SHAPES.index(part)


def _responder(url: str, shape: str, stop: threading.Event, ready: threading.Event, kind: str, reply: bytes) -> None:
    with Connection(url) as conn:
        ch = conn.channel()
        if _has(shape, "+reply confirms"):
            ch.confirm_select()
        exchange = Exchange("req", type=kind, durable=True) if _has(shape, "+exchange") else Exchange("")
        queue = Queue("req.q", exchange=exchange, routing_key="req.q", durable=True,
                      queue_arguments={"x-queue-type": "quorum"})
        producer = Producer(ch, auto_declare=False)
        reply_exchange = "reply" if _has(shape, "+reply queue") else ""

        def on_message(message) -> None:  # type: ignore[no-untyped-def]
            producer.publish(reply, exchange=reply_exchange, routing_key=message.properties["reply_to"],
                             correlation_id=message.properties["correlation_id"], delivery_mode=1, retry=False)
            message.ack()

        ch.basic_qos(0, 16, False)
        with Consumer(ch, [queue], on_message=on_message, no_ack=False):
            ready.set()
            while not stop.is_set():
                try:
                    conn.drain_events(timeout=0.5)
                except TimeoutError:
                    pass


def _requester(url: str, shape: str, seconds: float, inflight: int, kind: str) -> int:
    with Connection(url) as conn:
        ch = conn.channel()
        confirms = _has(shape, "+request confirms")
        if confirms:
            ch.confirm_select()
            ch.events["basic_ack"].add(lambda *a: None)
        exchange = Exchange("req", type=kind, durable=True) if _has(shape, "+exchange") else Exchange("")
        producer = Producer(ch, auto_declare=False)
        outstanding: set[str] = set()
        if _has(shape, "+reply queue"):
            reply_to = "rq-" + uuid.uuid4().hex
            reply_exchange = Exchange("reply", type="direct", durable=True)
            queues = [Queue(reply_to, exchange=reply_exchange, routing_key=reply_to, exclusive=True, auto_delete=True)]
        else:
            reply_to = "amq.rabbitmq.reply-to"
            queues = [Queue("amq.rabbitmq.reply-to", no_declare=True)]
        extra = {"expiration": 10.0, "delivery_mode": 2} if _has(shape, "+expiration") else {"delivery_mode": 1}

        def send() -> None:
            cid = uuid.uuid4().hex
            outstanding.add(cid)
            producer.publish(REQUEST, exchange=exchange.name, routing_key="req.q", reply_to=reply_to,
                             correlation_id=cid, retry=False, **extra)

        done = 0

        def on_reply(message) -> None:  # type: ignore[no-untyped-def]
            nonlocal done
            outstanding.discard(message.properties["correlation_id"])
            done += 1

        with Consumer(ch, queues, on_message=on_reply, no_ack=True, auto_declare=_has(shape, "+reply queue")):
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                while len(outstanding) < inflight:
                    send()
                try:
                    conn.drain_events(timeout=1.0)
                except TimeoutError:
                    pass
            while outstanding:
                try:
                    conn.drain_events(timeout=2.0)
                except TimeoutError:
                    break
        return done


def _declare(url: str, kind: str) -> None:
    with Connection(url) as conn:
        ch = conn.channel()
        Exchange("req", type=kind, durable=True)(ch).declare()
        Exchange("reply", type="direct", durable=True)(ch).declare()
        Queue("req.q", exchange=Exchange("req", type=kind, durable=True), routing_key="req.q", durable=True,
              queue_arguments={"x-queue-type": "quorum"})(ch).declare()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--inflight", type=int, default=8)
    ap.add_argument("--kind", default="direct", choices=["direct", "topic"])
    ap.add_argument("--reply-bytes", type=int, default=1024, help="size of a reply (default 1024)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which shapes, comma-separated")
    opts = ap.parse_args()
    from tests.support.rabbit_private import PrivateRabbit

    tmp = Path(tempfile.mkdtemp(prefix="vmsched-broker-shapes-"))
    shapes = opts.shapes.split(",")
    per: dict[str, list[float]] = {s: [] for s in shapes}
    with PrivateRabbit.start_new(tmp / "broker") as node:
        assert node.proc is not None
        urls = {}
        for i, shape in enumerate(SHAPES):
            node.ctl("add_vhost", f"shape{i}")
            node.ctl("set_permissions", "-p", f"shape{i}", "guest", ".*", ".*", ".*")
            urls[shape] = node.url(vhost=f"shape{i}")
            _declare(urls[shape], opts.kind)
        for r in range(opts.rounds):
            for shape in shapes if r % 2 == 0 else shapes[::-1]:
                stop, ready = threading.Event(), threading.Event()
                t = threading.Thread(target=_responder, args=(urls[shape], shape, stop, ready, opts.kind, b"a" * opts.reply_bytes), daemon=True)
                t.start()
                ready.wait(30)
                time.sleep(0.3)
                before = _tree_cpu(node.proc.pid)
                done = _requester(urls[shape], shape, opts.seconds, opts.inflight, opts.kind)
                ms = (_tree_cpu(node.proc.pid) - before) * 1000 / max(done, 1)
                stop.set()
                t.join(5)
                per[shape].append(ms)
                print(f"round {r + 1} {shape:18s} {done / opts.seconds:6.0f} round trips/s  broker {ms:.3f} ms each",
                      flush=True)
    print(f"\nmedians, broker CPU ms per round trip (requests through a {opts.kind} exchange from '+exchange' on):")
    base = statistics.median(per[shapes[0]])
    for shape in shapes:
        med = statistics.median(per[shape])
        print(f"  {shape:18s} {med:.3f}  ({med / base:.2f}x the first shape's)")


if __name__ == "__main__":
    main()
