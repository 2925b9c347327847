"""The scheduling path with host facts attached against the same path without them.

Two RabbitMQ stacks run side by side, each on its own vhost: gateway, scoring,
discovery and balancer services with the same plugin file of three filters
that read host facts (``vmsched.plugin.facts``) for 100 hosts. In one stack a
feeder publishes the 100 hosts' facts on the real bus (``vmsched.events``,
``agent.<host>.facts``) as agents do: every host every 5 s, spread over the
interval, the guest list with the first message only. The other stack runs
with ``VMSCHED_FACTS=false``: its calls carry no facts. runFilters is driven
over XML-RPC like the engine (bench_gateway.py's client): per round and
stack, sequential p50 and the throughput of 8 clients; the rounds alternate
the order of the stacks, and each figure is the median of the rounds with the
spread (min-max), the with/without ratio per round likewise.

    .venv/bin/python bench/bench_gateway_facts.py [--rounds 5] [--calls 1000] [--seconds 5]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_facts import summary  # noqa: E402
from bench_facts_cpu import CpuMeter, rabbitmq_pids  # noqa: E402
from bench_gateway import HOSTS, VM, arun, concurrent, free_port, pct, sequential, wait_ready  # noqa: E402
from tests.support.engine_wire import call  # noqa: E402

INTERVAL = 5.0
PLUGINS = '''
from vmsched.plugin import facts


class BenchFactsMemory:
    """Keep hosts with 1 GiB of free memory (a host without facts is kept)."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if (x := facts.host(h)) is None or x.memory_free_mib >= 1024]


class BenchFactsFresh:
    """Drop hosts whose facts are stale."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if (x := facts.host(h)) is None or not x.stale]


class BenchFactsCpu:
    """Drop hosts above 95 % CPU."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if (x := facts.host(h)) is None or x.cpu_pct < 95]


class BenchFactsProbe:
    """Only hosts with facts (to wait until they are in)."""
    def do_filter(self, hosts, vm, args):
        return [h for h in hosts if facts.host(h) is not None]
'''
FILTER_BODY = call("runFilters", ["BenchFactsMemory", "BenchFactsFresh", "BenchFactsCpu"], HOSTS, VM, {})
PROBE_BODY = call("runFilters", ["BenchFactsProbe"], HOSTS, VM, {})


def rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


class Stack:
    def __init__(self, name: str, facts: bool, base_url: str, tmp: Path) -> None:
        self.name, self.facts = name, facts
        self.vhost = f"vmsched-bench-{name}-{uuid.uuid4().hex[:6]}"
        self.url = base_url.rstrip("/") + "/" + self.vhost
        self.port = free_port()
        self.tmp = tmp / name
        self.tmp.mkdir()
        (self.tmp / "plugins").mkdir()
        (self.tmp / "plugins" / "bench_facts_filters.py").write_text(PLUGINS)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.seq: dict[str, float] = {}
        self.rate: dict[str, float] = {}

    def start(self) -> None:
        rabbitmqctl("add_vhost", self.vhost)
        rabbitmqctl("set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*")
        env = {**os.environ, "VMSCHED_AMQP_URL": self.url, "VMSCHED_FACTS": "true" if self.facts else "false"}
        common = ["--plugins", str(self.tmp / "plugins"), "--log-level", "WARNING"]
        commands = [["gateway", "--port", str(self.port), "--metrics-port", "0", "--log-level", "WARNING"],
                    ["scoring", *common], ["discovery", *common], ["balancer", *common]]
        for args in commands:
            log = (self.tmp / f"{args[0]}.log").open("ab")
            self.procs.append(subprocess.Popen([sys.executable, "-m", "vmsched.cli", *args], cwd=ROOT, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True, env=env))

    def groups(self) -> dict[str, list[int]]:
        """The stack's processes by name (gateway, scoring, discovery, balancer), for the CPU meter."""
        return {name: [p.pid] for name, p in zip(("gateway", "scoring", "discovery", "balancer"), self.procs)}

    def stop(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", self.vhost], capture_output=True, timeout=60)


def feed(url: str) -> None:
    """Publish the 100 hosts' facts as their agents would: each host every INTERVAL, spread over it.

    Runs in its own process (``--feed``, the URL in VMSCHED_AMQP_URL): a publishing thread in the load generator
    would hold its GIL. The feeder stands in for agents that run on the other hypervisors, so it is kept cheap:
    each host's message is encoded once and only its ``seq`` and ``time`` are replaced per message, and it runs
    at nice 19 (its own CPU is reported apart, ``feeder``).
    """
    from kombu import Producer

    from vmsched.bus.rabbitmq.connection import ensure_exchanges, open_connection
    from vmsched.bus.options import BusOptions
    from vmsched.bus.topology import EVENTS_EXCHANGE
    from vmsched.facts.model import FactsMessage, GuestFacts, facts_key

    os.nice(19)
    guests = [GuestFacts(uuid=str(uuid.UUID(int=(h << 16) + g)), name=f"vm{g}", state="running", vcpus=4,
                         memory_mib=4096) for h in range(len(HOSTS)) for g in range(20)]
    marker = (987654321, 1234567890.25)  # stand-ins for seq and time, replaced in the encoded text

    def template(i: int, first: bool) -> tuple[bytes, bytes, bytes]:
        body = FactsMessage(host_id=HOSTS[i], instance="bench", seq=marker[0], time=marker[1], interval=INTERVAL,
                            host=summary(i), guests=guests[i * 20:(i + 1) * 20] if first else None)
        text = body.model_dump_json().encode()
        head, _, rest = text.partition(b"%d" % marker[0])
        middle, _, tail = rest.partition(repr(marker[1]).encode())
        assert middle and tail, "seq and time must both be in the encoded message"
        return head, middle, tail

    first = [template(i, True) for i in range(len(HOSTS))]  # the guest list with the first message only
    later = [template(i, False) for i in range(len(HOSTS))]
    keys = [facts_key(h) for h in HOSTS]
    conn = open_connection(BusOptions(url=url))
    ensure_exchanges(conn, (EVENTS_EXCHANGE,))
    producer = Producer(conn.default_channel, auto_declare=False)
    seq = 0
    while True:
        seq += 1
        start = time.monotonic()
        for i in range(len(HOSTS)):
            head, middle, tail = (first if seq == 1 else later)[i]
            body = b"%b%d%b%r%b" % (head, seq, middle, time.time(), tail)
            producer.publish(body, exchange=EVENTS_EXCHANGE, routing_key=keys[i], content_type="application/json")
            if seq > 1:
                time.sleep(max(0.0, start + (i + 1) * INTERVAL / len(HOSTS) - time.monotonic()))
        if seq == 1:
            time.sleep(INTERVAL)


def wait_for_facts(port: int, want: int, timeout: float = 60.0) -> None:
    import xmlrpc.client

    from bench_gateway import http_request, one_call

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = arun(one_call(port, http_request(PROBE_BODY, port)))
        body = reply.partition(b"\r\n\r\n")[2]
        try:
            (value,), _ = xmlrpc.client.loads(body)
        except Exception:  # noqa: BLE001 - not up yet
            value = {}
        if isinstance(value, dict) and len(value.get("result") or []) == want:
            return
        time.sleep(0.5)
    raise RuntimeError(f"the facts of {want} hosts did not reach the plugins within {timeout:g} s")


def spy(meter: CpuMeter, out: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy on the stack's gateway, scoring and scoring workers (raw folded stacks of the thread holding the GIL)."""
    out.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).with_name("py-spy")
    found = [(name, pid) for name in ("gateway", "scoring", "scoring workers") for pid in meter.pids(name)]
    spies = [subprocess.Popen([str(exe), "record", "-p", str(pid), "-f", "raw", "-r", "250", "--nonblocking", "--gil",
                               "-o", str(out / f"{name.replace(' ', '-')}-{pid}.txt")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for name, pid in found]
    time.sleep(1.0)  # py-spy attaching
    return spies


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stacks on SIGTERM too (finally below)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=1000, help="sequential runFilters calls per stack and round")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of one concurrent run")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--py-spy", type=Path, metavar="DIR",
                    help="record py-spy raw profiles of gateway, scoring and its workers in the last round, into DIR")
    ap.add_argument("--feed", action="store_true", help=argparse.SUPPRESS)  # the feeder process (URL in env)
    opts = ap.parse_args()
    if opts.feed:
        feed(os.environ["VMSCHED_AMQP_URL"])
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-facts-"))
    tmp.chmod(0o755)  # the plugin user (nobody, when run as root) reads the plugins folder
    stacks = [Stack("facts", True, opts.amqp, tmp), Stack("nofacts", False, opts.amqp, tmp)]
    feeder: subprocess.Popen[bytes] | None = None
    results: dict[str, dict[str, list[float]]] = {s.name: {"p50": [], "p99": [], "rate": []} for s in stacks}
    cpu: dict[str, dict[str, list[float]]] = {s.name: {} for s in stacks}  # ms per request, by process
    try:
        for stack in stacks:
            stack.start()
        for stack in stacks:
            wait_ready(stack.port)
        feeder = subprocess.Popen([sys.executable, __file__, "--feed"], cwd=ROOT, start_new_session=True,
                                  env={**os.environ, "VMSCHED_AMQP_URL": stacks[0].url})  # never on a command line
        wait_for_facts(stacks[0].port, len(HOSTS))
        wait_for_facts(stacks[1].port, 0)
        print(f"3 facts-reading filters x {len(HOSTS)} hosts over RabbitMQ, {os.cpu_count()} CPUs "
              f"(load generator included); facts of {len(HOSTS)} hosts every {INTERVAL:g} s in the facts stack")
        for r in range(opts.rounds):
            for stack in (stacks if r % 2 == 0 else stacks[::-1]):  # interleaved, order alternating
                lat = arun(sequential(stack.port, FILTER_BODY, opts.calls))
                meter = CpuMeter({**stack.groups(), "rabbitmq": rabbitmq_pids(), "feeder": [feeder.pid]})
                meter.start()
                spies = spy(meter, opts.py_spy / stack.name) if opts.py_spy and r == opts.rounds - 1 else []
                done, elapsed = arun(concurrent(stack.port, [FILTER_BODY], opts.clients, opts.seconds))
                used = meter.stop()
                for one in spies:
                    one.send_signal(signal.SIGINT)
                    one.wait(30)
                results[stack.name]["p50"].append(pct(lat, 0.5))
                results[stack.name]["p99"].append(pct(lat, 0.99))
                results[stack.name]["rate"].append(done / elapsed)
                ours = sum(v for k, v in used.items() if k not in ("rabbitmq", "feeder"))
                for name, seconds in {**used, "vmsched": ours, "total": sum(used.values())}.items():
                    cpu[stack.name].setdefault(name, []).append(seconds * 1000 / done)
                print(f"  round {r + 1} {stack.name:>8}: p50 {pct(lat, 0.5):.2f} ms, p99 {pct(lat, 0.99):.2f} ms, "
                      f"{opts.clients} clients {done / elapsed:.0f} req/s, CPU per request "
                      f"{sum(used.values()) * 1000 / done:.2f} ms", flush=True)
    finally:
        if feeder is not None:
            feeder.kill()
            feeder.wait(10)
        for stack in stacks:
            stack.stop()
    with_, without = results["facts"], results["nofacts"]
    p50_ratio = [a / b for a, b in zip(with_["p50"], without["p50"])]
    rate_ratio = [a / b for a, b in zip(with_["rate"], without["rate"])]
    print(f"median (min-max) of {opts.rounds} rounds")
    print(f"  sequential p50, with facts:    {spread(with_['p50'])} ms")
    print(f"  sequential p50, without facts: {spread(without['p50'])} ms   ratio {spread(p50_ratio)}")
    print(f"  {opts.clients} clients, with facts:    {spread(with_['rate'], '{:.0f}')} req/s")
    print(f"  {opts.clients} clients, without facts: {spread(without['rate'], '{:.0f}')} req/s   "
          f"ratio {spread(rate_ratio)}")
    p99_ratio = [a / b for a, b in zip(with_["p99"], without["p99"])]
    print(f"  sequential p99, with facts:    {spread(with_['p99'])} ms")
    print(f"  sequential p99, without facts: {spread(without['p99'])} ms   ratio {spread(p99_ratio)}")
    print(f"CPU ms per request during the {opts.clients}-client runs (from /proc; 'workers': a service's plugin "
          "workers; 'vmsched': the stack's own processes; rabbitmq (the whole broker, shared with anything else using "
          "it) and the feeder (running all along, in both stacks' rounds) are counted in the rounds of the stack that ran)")
    for name in cpu["facts"]:
        a, b = cpu["facts"][name], cpu["nofacts"].get(name, [0.0])
        ratio = f"   ratio {spread([x / y for x, y in zip(a, b)])}" if min(b) > 0 else ""
        if max(a) == 0 and max(b) == 0:
            continue
        print(f"  {name:>17}: with {spread(a, '{:.3f}')}, without {spread(b, '{:.3f}')}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
