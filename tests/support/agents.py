"""Policy agents on libvirt's test driver, as their own processes on a bus, and a tap on their events.

Each agent publishes its host's facts (``--facts-interval``) and answers on its queue; the guests
are those of a test-driver node file the helper writes.
"""

from __future__ import annotations

import threading
from pathlib import Path

from kombu import Consumer, Queue

from tests.support.stack import Proc, bus_args
from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE


def node_xml(guests: list[tuple[str, int]]) -> str:
    domains = "".join(f"<domain type='test'><name>{name}</name><memory unit='KiB'>{mib * 1024}</memory>"
                      f"<vcpu>1</vcpu><os><type>hvm</type></os></domain>" for name, mib in guests)
    return (f"<node><cpu><mhz>2000</mhz><model>i686</model><active>4</active><nodes>1</nodes><sockets>1</sockets>"
            f"<cores>4</cores><threads>1</threads></cpu><memory>8388608</memory>{domains}</node>")


def agent(tmp_path: Path, url: str, host: str, guests: list[tuple[str, int]], interval: str = "0.5") -> Proc:
    node = tmp_path / f"{host}.xml"
    node.write_text(node_xml(guests))
    return Proc(["agent", "--libvirt", f"test://{node}", "--host-id", host, *bus_args(tmp_path, url),
                 "--state-dir", str(tmp_path / host), "--socket", str(tmp_path / f"{host}.sock"),
                 "--lock-dir", str(tmp_path / f"{host}-lock"), "--facts-interval", interval],
                tmp_path / f"agent-{host}.log", env={"VMSCHED_AGENT_AMQP": "", "VMSCHED_AMQP_URL": ""}).start()


class EventTap:
    """Collects the agent's events from the topic exchange in a thread."""

    def __init__(self, url: str, pattern: str) -> None:
        self.events: list[tuple[str, dict]] = []  # (routing key, body)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url, pattern), daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _run(self, url: str, pattern: str) -> None:
        conn = open_connection(BusOptions(url=url))
        try:
            ensure_exchanges(conn, (EVENTS_EXCHANGE,))
            q = Queue(exchange=EVENTS_EXCHANGE, routing_key=pattern, exclusive=True, auto_delete=True)
            with Consumer(conn.default_channel, [q], callbacks=[lambda body, m: self.events.append((m.delivery_info["routing_key"], body))]):
                self._ready.set()
                while not self._stop.is_set():
                    try:
                        conn.drain_events(timeout=0.2)
                    except TimeoutError:
                        pass
        finally:
            conn.release()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
