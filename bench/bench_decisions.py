"""The cost of the decision log on the engine's request path (issue 15: at most 3 %).

Two all-in-one gateways on the embedded bus run side by side: ``on`` (the
default: decisions kept and shared on the bus) and ``off``
(VMSCHED_DECISIONS_SIZE=0: no decision log), plus ``off2``, a second ``off``:
the control, whose "cost" against ``off`` is the noise of the machine
(``--sides on,local,off`` adds ``local``: kept, not shared). Besides wall
clock, the gateway process's CPU time per sequential call is read from
/proc (less sensitive to other load than latency). Each round
measures, on every side in turn (the order rotates from round to round),
sequential runFilters (3 filters, 100 hosts, a new connection per call, like
the engine) and then the throughput of 8 concurrent clients. Since both
sides are measured within the same round, each round gives a paired ratio
(``on`` against ``off``); reported are the median of those ratios over the
rounds and their spread (lowest to highest). The machine may be shared with
other work: the interleaving is what makes the comparison fair, and the
spread says how far to trust it.

``--mode rabbitmq`` runs the two gateways as separate processes on a private
vhost of the RabbitMQ at ``--amqp``, sharing one set of services: there the
``on`` gateway also publishes its decisions on the bus for the other replicas
(the embedded bus has no other gateway, so nothing is published there).

    .venv/bin/python bench/bench_decisions.py [--mode embedded|rabbitmq] [--rounds 7] [--calls 1000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gateway import FILTER_BODY, PLUGINS, arun, concurrent, free_port, pct, sequential, start, wait_ready  # noqa: E402

ENV = {"on": {}, "local": {"VMSCHED_DECISIONS_SHARE": "false"}, "off": {"VMSCHED_DECISIONS_SIZE": "0"},
       "off2": {"VMSCHED_DECISIONS_SIZE": "0"}}  # off2: a second 'off', the control (its 'cost' is the noise)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children: the plugin workers are the same on every side)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def _spread(values: list[float]) -> str:
    return f"{min(values):+.1f} .. {max(values):+.1f} %"


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the stacks on SIGTERM too (the finally blocks)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000, help="sequential runFilters per side and round")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of one concurrent run per side and round")
    ap.add_argument("--sides", default="on,off,off2", help="of on, local, off, off2; 'off' is the baseline")
    ap.add_argument("--mode", choices=["embedded", "rabbitmq"], default="embedded")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/", help="the broker (rabbitmq mode)")
    opts = ap.parse_args()
    names = [n for n in opts.sides.split(",") if n in ENV]
    if "off" not in names or len(names) < 2:
        ap.error("--sides needs 'off' and at least one other")
    tmp = Path(tempfile.mkdtemp(prefix="vmsched-bench-decisions-"))
    (tmp / "plugins").mkdir()
    (tmp / "plugins" / "bench.py").write_text(PLUGINS)
    if os.geteuid() == 0:  # as root, plugin workers cannot drop to 'nobody' when Python lives under /root
        os.environ.setdefault("VMSCHED_ALLOW_ROOT_PLUGINS", "true")
    ports = {name: free_port() for name in names}
    procs = []
    vhost = f"vmsched-bench-{uuid.uuid4().hex[:8]}" if opts.mode == "rabbitmq" else ""
    plugins = ["--plugins", str(tmp / "plugins"), "--log-level", "WARNING"]
    if vhost:
        subprocess.run(["rabbitmqctl", "-q", "add_vhost", vhost], check=True, capture_output=True)
        subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", vhost, "guest", ".*", ".*", ".*"], check=True,
                       capture_output=True)
        url = opts.amqp.rstrip("/") + "/" + quote(vhost, safe="")
        procs += [start([service, *plugins], tmp / f"{service}.log", url) for service in ("scoring", "discovery")]
    for name in names:
        os.environ.update(ENV[name])
        if vhost:
            procs.append(start(["gateway", "--port", str(ports[name]), "--metrics-port", "0", "--log-level",
                                "WARNING"], tmp / f"{name}.log", url))
        else:
            procs.append(start(["run", "--amqp", "memory://", "--port", str(ports[name]), "--metrics-port", "0",
                                *plugins], tmp / f"{name}.log"))
        for key in ENV[name]:
            os.environ.pop(key)
    p50: dict[str, list[float]] = {n: [] for n in names}
    rate: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}  # gateway process CPU ms per call (sequential run)
    gateway_pid = dict(zip(names, [p.pid for p in procs[-len(names):]]))
    try:
        for port in ports.values():
            wait_ready(port)
        for i in range(opts.rounds):
            order = names[i % len(names):] + names[:i % len(names)]  # each side first in turn
            for name in order:
                used = cpu_seconds(gateway_pid[name])
                p50[name].append(pct(arun(sequential(ports[name], FILTER_BODY, opts.calls)), 0.50))
                cpu[name].append(1000 * (cpu_seconds(gateway_pid[name]) - used) / (opts.calls + 50))  # + warm-up
            for name in order:
                done, elapsed = arun(concurrent(ports[name], [FILTER_BODY], opts.clients, opts.seconds))
                rate[name].append(done / elapsed)
            print(f"round {i + 1}: " + "; ".join(f"{n} p50 {p50[n][-1]:.3f} ms, {cpu[n][-1]:.3f} CPU ms/call, "
                                                 f"{rate[n][-1]:.0f} req/s" for n in names), flush=True)
    finally:
        for p in procs:
            os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            p.wait(15)
        if vhost:
            subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True)
    try:
        load = " (load average %.1f %.1f %.1f at the end)" % os.getloadavg()
    except OSError:
        load = ""
    print(f"\nrunFilters ({opts.mode}), {opts.rounds} interleaved rounds; {os.cpu_count()} CPUs, load generator "
          f"included{load}:")
    for n in names:
        print(f"  {n:5}  sequential p50 median {statistics.median(p50[n]):.3f} ms "
              f"(rounds {min(p50[n]):.3f}-{max(p50[n]):.3f}); gateway CPU {statistics.median(cpu[n]):.3f} ms/call "
              f"(rounds {min(cpu[n]):.3f}-{max(cpu[n]):.3f}); {opts.clients} clients median "
              f"{statistics.median(rate[n]):.0f} req/s (rounds {min(rate[n]):.0f}-{max(rate[n]):.0f})")
    base_p50, base_rate = p50["off"], rate["off"]
    for n in names:
        if n == "off":
            continue
        slower = [100 * (a / b - 1) for a, b in zip(p50[n], base_p50)]  # + : the log makes a call slower
        fewer = [100 * (b / a - 1) for a, b in zip(rate[n], base_rate)]  # + : the log costs throughput
        more = [100 * (a / b - 1) for a, b in zip(cpu[n], cpu["off"])]  # + : the log costs CPU per call
        print(f"  cost of '{n}' vs 'off', median of the per-round ratios (spread):")
        print(f"    sequential p50    {statistics.median(slower):+.1f} %  ({_spread(slower)})")
        print(f"    gateway CPU/call  {statistics.median(more):+.1f} %  ({_spread(more)})")
        print(f"    {opts.clients}-client rate   {statistics.median(fewer):+.1f} %  ({_spread(fewer)})")


if __name__ == "__main__":
    main()
