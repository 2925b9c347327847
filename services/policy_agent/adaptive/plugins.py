"""Tuner plugins: an admin's Python files, run in the plugin sandbox (vmsched.runtime: a worker process as
the plugin user, seccomp without network sockets, Landlock, resource limits, a clean environment).

Each ``NAME.py`` at the top of the folder defines ``class Tuner`` with ``do_tune(self, facts)``; it gets the
host's facts with their history and the adaptive guests (tuners/plugin_io.py) and returns proposals.
It never holds the agent's libvirt connection, the bus or a credential: the worker is a separate process
whose environment and file descriptors are the sandbox's, and it only returns data, which the agent checks
(tuners/guard.py) like a built-in tuner's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from vmsched.runtime.contract import TUNE_CLASS, TUNE_METHOD
from vmsched.runtime.pool.pool import PluginPool
from vmsched.runtime.types import Call, Limits

from ..errors import PolicyError
from ..tuners.config import TunerConfig
from ..tuners.plugin_io import plugin_input, plugin_proposals
from ..tuners.types import Proposal, TuneInput
from . import metrics as tm

log = logging.getLogger("vmsched.agent.tuner")


class TunerPlugins:
    def __init__(self, folder: Path, timeout: float = 5.0) -> None:
        self.folder = Path(folder).absolute()
        self.timeout = timeout
        self.pool = PluginPool(self.folder, size=1, limits=Limits(memory_mb=512, cpu_seconds=60), name="tuners")
        self.errors: dict[str, str] = {}  # plugin -> its last error

    def start(self) -> "TunerPlugins":
        try:
            self.pool.start()
        except (RuntimeError, OSError) as exc:  # e.g. the sandbox cannot confine them: refuse, do not run unconfined
            self.pool.close()
            raise PolicyError(f"tuner plugins in {self.folder} cannot run: {exc}") from None
        log.info("tuner plugins from %s: %s; sandbox %s", self.folder, ", ".join(self.names()) or "none",
                 "; ".join(f"{k} {v}" for k, v in sorted(self.pool.sandbox.items())))
        return self

    def close(self) -> None:
        self.pool.close()

    def names(self) -> list[str]:
        """Plugin files (not imported here: only the sandboxed worker runs their code)."""
        return sorted(p.stem for p in self.folder.glob("*.py") if not p.name.startswith(("_", ".")))

    def propose(self, inp: TuneInput, cfg: TunerConfig) -> list[Proposal]:
        names = self.names()
        if not names:
            return []
        facts = plugin_input(inp, cfg)
        calls = [Call(name, TUNE_CLASS, TUNE_METHOD, (facts,), self.timeout) for name in names]
        results = self.pool.run(calls, deadline=time.time() + self.timeout)
        out: list[Proposal] = []
        for name, r in zip(names, results):
            tuner = f"plugin:{name}"
            if r.stderr:
                log.info("%s wrote: %s", tuner, r.stderr.rstrip()[:2000])
            if not r.ok:
                self._error(name, tuner, r.error or "failed")
                continue
            proposals, problems = plugin_proposals(r.value, tuner, inp)
            for p in problems:
                self._error(name, tuner, p)
            if not problems:
                self.errors.pop(name, None)
            out.extend(proposals)
        return out

    def _error(self, name: str, tuner: str, error: str) -> None:
        if self.errors.get(name) != error:
            log.warning("tuner plugin %s: %s", tuner, error)
        self.errors[name] = error
        tm.CHANGES.labels(tuner, "-", "error").inc()
