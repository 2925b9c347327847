"""`vmsched run` from an installed copy (a wheel's folder, a virtualenv), answering the engine's XML-RPC."""

from __future__ import annotations

import subprocess
import xmlrpc.client
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx

from tests.support.engine_wire import call
from tests.support.net import free_port
from tests.support.waiting import wait_until

#: A filter that keeps every host only when its plugin worker runs vmsched from under ``args["target"]``.
WHERE_PLUGIN = '''
import sys


class FromInstalled:
    def do_filter(self, hosts, vm, args):
        """Keeps the hosts if this worker's vmsched came from the installed copy."""
        worker = sys.modules["__main__"].__file__
        return hosts if worker.startswith(args["target"]) else []
'''


@contextmanager
def serving(vmsched: list[str], folder: Path, *, cwd: Path, env: dict[str, str],
            options: tuple[str, ...] = ()) -> Iterator[str]:
    """Runs ``VMSCHED run`` (``vmsched``: the command line that is vmsched) with a plugins folder holding
    :data:`WHERE_PLUGIN`, one plugin worker and free ports; yields its URL once ``/readyz`` answers 200.

    ``folder`` holds the plugins folder and the log.
    """
    plugins = folder / "plugins"
    plugins.mkdir()
    (plugins / "where.py").write_text(WHERE_PLUGIN)
    log = folder / "run.log"
    port = free_port()
    proc = subprocess.Popen(
        [*vmsched, "run", "--plugins", str(plugins), "--port", str(port), "--pool-size", "1",
         "--metrics-port", str(free_port()), *options],
        cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/"

    def ready() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return httpx.get(url + "readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(ready, 60, 0.1, f"{' '.join(vmsched)} run")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def engine_call(url: str, method: str, *params: object) -> object:
    """The engine's call of ``method``, sent as the engine sends it; the reply's value."""
    r = httpx.post(url, content=call(method, *params), headers={"Content-Type": "text/xml"}, timeout=30)
    r.raise_for_status()
    (value,), _ = xmlrpc.client.loads(r.content)
    return value
