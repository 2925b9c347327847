"""The floor prototype (../shared/perf-floor) beside vmsched in one benchmark run: its processes, a private
RabbitMQ vhost, the RSS of a process tree and a cold burst.

Used by ``bench/bench_gateway.py --floor``; nothing here knows vmsched. The prototype is started as its
README says (``worker.py`` and ``gateway.py --design L``), on its own vhost of the shared broker, with the
broker URL in its environment (``PROTO_AMQP_URL``), never on a command line.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
import xmlrpc.client
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: ``../shared/perf-floor`` beside the checkout (or beside the folder of worktrees it is in), or $VMSCHED_FLOOR_DIR
FLOOR_DIR = Path(os.environ.get("VMSCHED_FLOOR_DIR") or next(
    (p for p in (Path(__file__).resolve().parents[n] / "shared" / "perf-floor" for n in (2, 3)) if p.is_dir()),
    Path(__file__).resolve().parents[2] / "shared" / "perf-floor"))
FLOOR_UNITS = ["a", "b", "c"]  # the prototype's three plugin processes


#: Reply bodies already parsed and found good, by install: a body equal to one of them is good too. The bench
#: repeats the same calls, so most replies are byte for byte one already checked, and the load generator, on the
#: same two cores as what it measures, does not spend a parse per reply (a score reply's 100 pairs cost the
#: stdlib's xmlrpc about three times a filter's list, which skewed the score mix).
_VERIFIED: dict[str, set[bytes]] = {}
_REMEMBERED = 64  # bodies kept per install at most


def verified(kind: str, body: bytes, check: Callable[[bytes], None]) -> None:
    """``check(body)`` unless the same body passed it before (a reply that differs is parsed and checked)."""
    known = _VERIFIED.setdefault(kind, set())
    if body in known:
        return
    check(body)
    if len(known) < _REMEMBERED:
        known.add(body)


def check_floor(reply: bytes) -> None:
    """The prototype answers a bare list of host IDs (the old reply format)."""
    head, _, body = reply.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"bad floor reply: {head[:100]!r}")
    verified("floor", body, _check_floor_body)


def _check_floor_body(body: bytes) -> None:
    (value,), _ = xmlrpc.client.loads(body)
    if not isinstance(value, list) or not value:
        raise RuntimeError(f"bad floor reply: {body[:200]!r}")


@contextmanager
def vhost(base_url: str, prefix: str) -> Iterator[str]:
    """A private vhost on the shared broker (deleted after); yields its AMQP URL."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    subprocess.run(["rabbitmqctl", "-q", "add_vhost", name], check=True, capture_output=True, timeout=60)
    try:
        subprocess.run(["rabbitmqctl", "-q", "set_permissions", "-p", name, "guest", ".*", ".*", ".*"],
                       check=True, capture_output=True, timeout=60)
        yield base_url.rstrip("/") + "/" + name
    finally:
        subprocess.run(["rabbitmqctl", "-q", "delete_vhost", name], capture_output=True, timeout=60)


def start_floor(port: int, amqp: str, logdir: Path, queue_type: str = "classic") -> list[subprocess.Popen[bytes]]:
    """The prototype's worker (3 plugin processes) and its design-L gateway; ``queue_type`` "quorum": its request
    queue is a durable quorum queue, as vmsched's (``PROTO_QUEUE_TYPE``, see its README)."""
    if not (FLOOR_DIR / "gateway.py").is_file():
        raise SystemExit(f"the floor prototype is not at {FLOOR_DIR}: set VMSCHED_FLOOR_DIR to its folder")
    env = {**os.environ, "PROTO_AMQP_URL": amqp, "PROTO_QUEUE_TYPE": queue_type}
    out = (logdir / f"floor-{queue_type}.log").open("ab")

    def run(*args: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, *args], cwd=FLOOR_DIR, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)

    return [run("worker.py"), run("gateway.py", "--design", "L", "--port", str(port))]


def wait_answering(call: Callable[[], bytes], check: Callable[[bytes], None], timeout: float = 60) -> None:
    """Until one call is answered correctly (the prototype has no readiness probe)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check(call())
            return
        except (OSError, RuntimeError, xmlrpc.client.Error, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def _describe(pid: int) -> tuple[str, float]:
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = [w.decode(errors="replace") for w in argv if w]
    words = [Path(w).name if "/" in w else w for w in words[1:] if not w.startswith("--")][:3] or words[:1]
    rss_kb = next(int(line.split()[1]) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if line.startswith("VmRSS:"))
    return " ".join(words), rss_kb / 1024


def rss_tree(roots: list[int]) -> list[tuple[int, str, float]]:
    """(depth, what, RSS MiB) of every process under ``roots``, parents first."""
    kids = _children()
    rows: list[tuple[int, str, float]] = []

    def walk(pid: int, depth: int) -> None:
        try:
            what, rss = _describe(pid)
        except (OSError, StopIteration):
            return
        rows.append((depth, what if depth == 0 else f"child {pid} of the above", rss))
        for kid in sorted(kids.get(pid, [])):
            walk(kid, depth + 1)

    for root in roots:
        walk(root, 0)
    return rows


async def cold_burst(one_call: Callable[[], Awaitable[bytes]], check: Callable[[bytes], None],
                     clients: int = 8, seconds: float = 1.0) -> list[float]:
    """``clients`` start at once against an idle install; the latencies of the calls started in the first second."""
    lat: list[float] = []
    stop = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop:
            t = time.perf_counter()
            reply = await one_call()
            lat.append(time.perf_counter() - t)
            check(reply)

    await asyncio.gather(*(client() for _ in range(clients)))
    return lat
