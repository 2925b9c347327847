"""CPU per call of the gateway's HTTP layer alone: uvicorn with the gateway's protocol class, one new TCP
connection per call (as the engine), a trivial ASGI app answering a 4 KiB XML body.

The server runs in its own process; reported: its CPU milliseconds per call (from /proc) and the rate,
with ``--clients`` concurrent clients for ``--seconds``. For old/new comparisons, run it with ``PYTHONPATH``
at an exported tree of each version.

    .venv/bin/python bench/bench_http_conn.py [--clients 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SERVER = r'''
import sys, uvicorn
from vmsched.gateway.http import gateway_http
REPLY = b"<?xml version='1.0'?><methodResponse>" + b"x" * 4000 + b"</methodResponse>"
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/xml; charset=utf-8"), (b"content-length", str(len(REPLY)).encode())]})
    await send({"type": "http.response.body", "body": REPLY})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), loop="uvloop", log_level="warning", lifespan="off",
            access_log=False, server_header=False, date_header=False, http=gateway_http(10, 30))
'''


def cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    opts = ap.parse_args()
    from bench_gateway import FILTER_BODY, arun, free_port, http_request, one_call

    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], start_new_session=True)
    try:
        payload = http_request(FILTER_BODY, port)
        deadline = time.monotonic() + 30
        while True:
            try:
                assert arun(one_call(port, payload)).startswith(b"HTTP/1.1 200")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        async def drive() -> int:
            done = 0
            stop = time.perf_counter() + opts.seconds

            async def client() -> None:
                nonlocal done
                while time.perf_counter() < stop:
                    reply = await one_call(port, payload)
                    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"</methodResponse>")
                    done += 1

            await asyncio.gather(*(client() for _ in range(opts.clients)))
            return done

        arun(drive())  # warm
        before, started = cpu(server.pid), time.perf_counter()
        done = arun(drive())
        elapsed = time.perf_counter() - started
        print(json.dumps({"calls": done, "rate": done / elapsed, "server_ms": (cpu(server.pid) - before) * 1000 / done}))
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(10)


if __name__ == "__main__":
    main()
