"""How a plugin worker process is started: its command line, its environment, its pipes.

Nothing of the service's environment reaches a plugin but an allow-list (no credential); the worker
gets its protocol pipes, its stderr (drained by the pool, never the service's log) and its progress
page (:mod:`vmsched.runtime.progress`).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from vmsched.runtime.pool.process import Worker, WorkerGone
from vmsched.runtime.progress import Progress
from vmsched.runtime.types import Confinement, Limits

#: The only environment variables a worker inherits (plus Confinement.env): never a credential.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH", "PYTHONIOENCODING", "PYTHONUTF8")


def start(plugins_dirs: Sequence[Path], limits: Limits, confinement: Confinement, max_frame: int) -> Worker:
    """Start one worker process with its progress page (it answers with its ready message)."""
    progress = Progress.create()
    try:
        proc = subprocess.Popen(
            command(plugins_dirs, limits, confinement) + ["--progress-fd", str(progress)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # fd 1 and 2 of the worker: drained, never our log
            cwd=plugins_dirs[0],
            env=environment(confinement),
            bufsize=0,
            close_fds=True,
            process_group=0,  # so a kill also reaches what the plugin spawned
            pass_fds=(progress,),
        )
    except BaseException:
        os.close(progress)
        raise
    return Worker(proc, max_frame, Progress(progress))


def command(plugins_dirs: Sequence[Path], limits: Limits, confinement: Confinement) -> list[str]:
    """The worker's command line (its options: no secret)."""
    write_dirs = tuple(str(Path(d).absolute()) for d in confinement.write_dirs)  # the worker's cwd is elsewhere
    return [
        sys.executable,
        "-P",  # keep the plugins folder (cwd) from shadowing the worker's own imports
        "-m",
        "vmsched.runtime.worker.main",
        *(item for folder in plugins_dirs for item in ("--plugins-dir", str(folder))),
        "--limits",
        json.dumps(asdict(limits)),
        "--confinement",
        json.dumps(asdict(replace(confinement, write_dirs=write_dirs))),
        "--tmp-parent",
        tempfile.gettempdir(),
    ]


def environment(confinement: Confinement) -> dict[str, str]:
    """An allow-list of the service's environment, with vmsched importable by the worker.

    No credential reaches a plugin: only ENV_ALLOWED, LC_* and the names in
    Confinement.env are passed. A source checkout found through the current directory (not installed,
    not on PYTHONPATH) is added to PYTHONPATH; an installed vmsched is not,
    so site-packages never moves ahead of the standard library.
    """
    allowed = set(ENV_ALLOWED) | set(confinement.env)
    env = {k: v for k, v in os.environ.items() if k in allowed or k.startswith("LC_")}
    root = str(Path(__file__).resolve().parents[2])
    on_path = {os.path.abspath(entry or os.curdir) for entry in sys.path}
    if root in on_path and root not in site.getsitepackages():
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return env


def await_ready(worker: Worker, timeout: float) -> dict[str, str]:
    """Wait for the worker's ready message; its sandbox features (feature -> "on (...)" / "off: why")."""
    try:
        reply = worker.receive(timeout)
    except (WorkerGone, OSError, TimeoutError) as exc:
        code = worker.exit_code(timeout=1.0)
        raise RuntimeError(f"plugin worker {worker.pid} did not start ({exc}; exit status {code})") from None
    if not reply.get("ready"):
        if reply.get("ok") is False and isinstance(reply.get("error"), str):
            raise RuntimeError(f"plugin worker {worker.pid} refused to start: {reply['error']}")
        raise RuntimeError(f"plugin worker {worker.pid} sent {reply!r} instead of its ready message")
    report = reply.get("sandbox") or {}
    worker.tmp_dir = str(report.get("tmp_dir") or "")
    return {str(k): str(v) for k, v in (report.get("features") or {}).items()}
