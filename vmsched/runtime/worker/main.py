"""The plugin worker process: runs administrators' plugin code for a PluginPool.

Started by :class:`vmsched.runtime.pool.pool.PluginPool` as
``python -P -m vmsched.runtime.worker.main --plugins-dir DIR [--plugins-dir DIR2 ...] ...`` and then reused
for many calls. It talks to its pool over its stdin/stdout pipes with
length-prefixed JSON frames (4-byte big-endian size, then UTF-8 JSON; never
pickle: this process runs untrusted code). Before any plugin runs, the
protocol pipes are moved to private descriptors and fd 0/1 are pointed at
/dev/null and stderr, so a plugin writing to fd 1 cannot corrupt a frame.

Requests (one at a time, each answered by exactly one reply) are batches:

- ``{"op": "batch", "calls": [{"plugin", "cls", "method", "args", "held"?, "facts"?}, ...], "facts"?}`` ->
  ``{"replies": [{"ok": true, "value", "stderr", "t"} or {"ok": false, "error", "stderr", "t"}, ...]}``:
  the units of one request that the pool gave this worker, run one after the other, each with its own
  stdout capture, CPU limit and clean-up; ``t`` is the unit's run time in seconds. A score call marked
  ``"aligned": true`` whose result is one finite number per requested host, in order, is answered
  ``{"ok": true, "scores": [numbers], "stderr", "t"}`` instead (:func:`vmsched.runtime.contract.aligned_scores`).
  Before each unit the worker writes its index and start time to the progress page
  (:class:`vmsched.runtime.protocol.Progress`), so that the pool can tell which unit overran its budget or crashed
  the worker. ``facts`` (the held form of :mod:`vmsched.facts.wire`) is installed once, for the
  calls marked ``held``.

A call may instead name another request (the pool sends these alone in a batch), answered in its place:

- ``{"op": "analyze", "path"}`` -> ``{"ok": true, "units": [...]}`` or an error
- ``{"op": "warm", "plugins": [...]}`` -> ``{"ok": true, "loaded": [...]}``

This module imports only the standard library (and the stdlib-only modules of this package): it must
start fast and must not drag the service's dependencies into the plugins' interpreter.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import math
import os
import resource
import select
import signal
import sys
import threading
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout, suppress
from dataclasses import asdict
from types import ModuleType
from typing import Any

from vmsched.runtime.worker import children, sandbox
from vmsched.runtime.worker import errors as worker_errors
from vmsched.runtime.worker.capture import Capture
from vmsched.runtime.contract import KIND, aligned_scores
from vmsched.runtime.protocol import Channel, Progress, encode_frame, encode_json, reply_frame
from vmsched.runtime.types import Confinement, Limits
from vmsched.runtime.worker.errors import PluginError, describe_exception, parse_output
from vmsched.runtime.worker.modules import Modules, list_units, reads_facts
from vmsched.plugin import facts
from vmsched.facts.held import HeldFacts

#: Members of a held-form facts payload that must be installed only once per frame.
_ONCE = ("data", "guests", "reset", "hosts")
#: A score unit's method, and where its arguments hold the requested hosts (calls marked "aligned").
_SCORE_METHOD = KIND["score"].method
_SCORE_HOSTS = KIND["score"].params.index("hosts")


class Runner:
    """Executes requests inside the worker; never raises for a plugin's fault."""

    def __init__(self, plugins_dirs: str | list[str], cpu_seconds: int, max_output: int, progress: Progress) -> None:
        self.dirs = [plugins_dirs] if isinstance(plugins_dirs, str) else list(plugins_dirs)  # the first: the cwd
        self.cpu_seconds = cpu_seconds
        self.max_output = max_output
        self.max_reply = 2 * max_output + (1 << 16)
        self.modules = Modules(self.dirs)
        self.progress = progress
        self.facts = HeldFacts()  # the host facts the pool sent this worker (vmsched.facts.held)
        self._cpu_soft = -1
        self._cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        self._cwd = os.getcwd()  # the plugins folder, as the kernel spells it

    def handle(self, request: dict[str, Any]) -> bytes:
        """One reply frame for the units of one request (a ``batch``), run in order (each as a ``call``)."""
        parts: list[bytes] = []
        payload = request.get("facts")
        installed = False
        for index, call in enumerate(request.get("calls") or ()):
            self.progress.mark(index)
            began = time.monotonic()
            if call.get("held") and payload is not None:
                call["facts"] = payload
                if not installed:  # later units get the same facts without what must be stored only once
                    installed = True
                    payload = {k: v for k, v in payload.items() if k not in _ONCE}
            hosts = _requested_hosts(call)  # a copy: the plugin gets the list and may change it
            stderr = Capture(self.max_output, strict=False)
            try:
                reply = self._dispatch({"op": "call", **call}, stderr)  # or the request it names (analyze, warm)
            except Exception as exc:
                reply = {"ok": False, "error": f"internal worker error: {exc!r}"}
            finally:
                self._restore_cwd()
                children.kill_all()  # nothing a plugin started outlives its call
            reply["stderr"] = stderr.getvalue()
            reply["t"] = time.monotonic() - began
            parts.append((hosts is not None and self._encode_aligned(hosts, reply)) or self._encode(reply, stderr))
        return reply_frame(b'{"replies":[' + b",".join(parts) + b"]}")

    def _dispatch(self, request: dict[str, Any], stderr: Capture) -> dict[str, Any]:
        op = request.get("op")
        if op == "call":
            token = facts.CALL.set(self.facts.for_call(request.get("facts")))  # what vmsched.plugin.facts reads
            try:
                reply = self.call(request["plugin"], request["cls"], request["method"], request["args"], stderr)
            finally:
                facts.CALL.reset(token)
            return {**reply, "facts_resync": True} if self.facts.lost else reply  # it lacked some: resend all
        if op == "analyze":
            return self.analyze(request["path"], stderr)
        if op == "warm":
            return self.warm(request["plugins"], stderr)
        return {"ok": False, "error": f"unknown request {op!r}"}

    def _encode_aligned(self, hosts: list[Any], reply: dict[str, Any]) -> bytes | None:
        """The reply of a score call marked ``aligned`` whose result is one finite number per requested host,
        in order: ``{"ok": true, "scores": [numbers], ...}`` (contract.aligned_scores). None: encode it the
        usual way (any other result, or one whose pairs might not fit in a reply: the usual way says so)."""
        numbers = aligned_scores(reply.get("value"), hosts) if reply.get("ok") else None
        if numbers is None:
            return None
        short = {**reply, "scores": numbers}
        del short["value"]
        data = encode_json(short)
        # the pairs' JSON is at most this much longer (a host ID's JSON: at most 12 bytes a character + 2)
        if len(data) + 12 * sum(map(len, hosts)) + 5 * len(hosts) > self.max_reply:
            return None
        return data

    def _encode(self, reply: dict[str, Any], stderr: Capture) -> bytes:
        """The reply's JSON (an error in its place if it cannot be encoded or is too large)."""
        try:
            data = encode_json(reply)
        except (TypeError, ValueError, RecursionError, OverflowError) as exc:
            error = f"result is not JSON-serializable: {exc}"
            return encode_json({"ok": False, "error": error, "stderr": stderr.getvalue(), "t": reply.get("t", 0.0)})
        if len(data) > self.max_reply:
            error = f"result too large: {len(data)} bytes encoded (limit {self.max_reply})"
            return encode_json({"ok": False, "error": error, "stderr": stderr.getvalue()[:4096], "t": reply.get("t", 0.0)})
        return data

    # -- call
    def call(self, plugin: str, cls_name: str, method: str, args: list[Any], stderr: Capture) -> dict[str, Any]:
        try:
            cls = self._resolve(plugin, cls_name, method, stderr)
        except PluginError as exc:
            return {"ok": False, "error": str(exc)}
        self._arm_cpu_limit()
        stdout = Capture(self.max_output, strict=True)
        try:
            with redirect_stdout(stdout), redirect_stderr(stderr):
                value = getattr(cls(), method)(*args)
        except SystemExit as exc:
            if exc.code not in (None, 0) or not stdout.getvalue().strip():
                return self._failed(exc, stdout, stderr)
            value = None  # an old plugin that printed its result, then exit(0)
        except BaseException as exc:  # OutputLimitExceeded too: _failed says the stdout limit was exceeded
            return self._failed(exc, stdout, stderr)
        if stdout.exceeded:  # the plugin swallowed OutputLimitExceeded
            return {"ok": False, "error": f"stdout exceeded {self.max_output} bytes"}
        if value is None:
            try:
                value = parse_output(stdout.getvalue())
            except PluginError as exc:
                return {"ok": False, "error": str(exc)}
        return {"ok": True, "value": value}  # tuples become lists when encoded

    def _resolve(self, plugin: str, cls_name: str, method: str, stderr: Capture) -> type:
        module = self._import(plugin, stderr)
        cls = getattr(module, cls_name, None)
        if not isinstance(cls, type):
            raise PluginError(f"plugin {plugin} has no class {cls_name}")
        if not callable(getattr(cls, method, None)):
            raise PluginError(f"class {cls_name} in plugin {plugin} has no method {method}")
        return cls

    def _import(self, plugin: str, stderr: Capture) -> ModuleType:
        """The plugin's module; output printed while importing goes to stderr."""
        try:
            with redirect_stdout(stderr), redirect_stderr(stderr):
                return self.modules.get(plugin)
        except PluginError:
            raise
        except BaseException as exc:
            raise PluginError(f"cannot import plugin {plugin}: {describe_exception(exc, self.dirs)}") from None

    def _failed(self, exc: BaseException, stdout: Capture, stderr: Capture) -> dict[str, Any]:
        if stdout.exceeded:
            return {"ok": False, "error": f"stdout exceeded {self.max_output} bytes"}
        if isinstance(exc, facts.FactsMissing):  # expected (a unit without the facts it needs): its message alone
            return {"ok": False, "error": str(exc)[:2000] or "facts missing"}
        if not isinstance(exc, SystemExit):
            stderr.write("".join(traceback.format_exception(exc)))
        return {"ok": False, "error": describe_exception(exc, self.dirs)}

    def _arm_cpu_limit(self) -> None:
        """Allow ``cpu_seconds`` more CPU time from now (the worker lives on)."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + self.cpu_seconds)
        if self._cpu_hard != resource.RLIM_INFINITY:
            soft = min(soft, self._cpu_hard)
        if soft != self._cpu_soft:
            resource.setrlimit(resource.RLIMIT_CPU, (soft, self._cpu_hard))
            self._cpu_soft = soft

    def _restore_cwd(self) -> None:
        """Undo a plugin's os.chdir(): sibling imports and relative paths need the folder."""
        with suppress(OSError):
            if os.getcwd() == self._cwd:
                return
        os.chdir(self.dirs[0])

    # -- analyze and warm
    def analyze(self, path: str, stderr: Capture) -> dict[str, Any]:
        name = os.path.splitext(os.path.basename(path))[0]
        self._arm_cpu_limit()
        try:
            with redirect_stdout(stderr), redirect_stderr(stderr):
                module = self.modules.load(name, path)
                units = list_units(module)
        except BaseException as exc:
            return {"ok": False, "error": f"cannot import plugin {name}: {describe_exception(exc, self.dirs)}"}
        return {"ok": True, "units": units, "uses_facts": reads_facts(module, path)}

    def warm(self, plugins: list[str], stderr: Capture) -> dict[str, Any]:
        loaded = []
        for plugin in plugins:
            with suppress(PluginError):
                self._import(plugin, stderr)
                loaded.append(plugin)
        return {"ok": True, "loaded": loaded}


def _requested_hosts(call: dict[str, Any]) -> list[Any] | None:
    """A copy of the hosts of a score call marked ``aligned`` (None for any other call)."""
    if not (call.get("aligned") and call.get("method") == _SCORE_METHOD):
        return None
    args = call.get("args")
    hosts = args[_SCORE_HOSTS] if type(args) is list and len(args) > _SCORE_HOSTS else None
    return list(hosts) if type(hosts) is list else None


# --- process setup ---------------------------------------------------------------


def _exit_with_parent(read_fd: int) -> None:
    """Exit when the pool's end of the request pipe closes, even mid-call."""

    def watch() -> None:
        poller = select.poll()
        poller.register(read_fd, 0)  # only POLLHUP/POLLERR/POLLNVAL wake us
        poller.poll()
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vmsched.runtime.worker.main")
    parser.add_argument("--plugins-dir", required=True, action="append",
                        help="a plugins folder; several: on sys.path in this order, the first is the working directory")
    parser.add_argument("--limits", type=lambda text: Limits(**json.loads(text)), default=Limits(),
                        help="resource limits as JSON (vmsched.runtime.types.Limits)")
    parser.add_argument("--confinement", type=lambda text: Confinement(**json.loads(text)), default=Confinement(),
                        help="confinement as JSON (vmsched.runtime.types.Confinement)")
    parser.add_argument("--tmp-parent", default="/tmp", help="the folder of its private temporary directory")
    parser.add_argument("--progress-fd", type=int, required=True, help="the pool's progress page (a memfd)")
    options = parser.parse_args(argv)
    plugins_dirs = [os.path.abspath(folder) for folder in options.plugins_dir]
    # the protocol pipes move off fd 0/1 (os.dup: not inherited by children); fd 0 -> /dev/null, fd 1 -> stderr
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when we stop
    faulthandler.enable()  # a crashing plugin leaves a Python traceback on stderr
    sys.dont_write_bytecode = True  # never a stale .pyc for a rewritten plugin
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE a write fails (EFBIG) instead
    os.chdir(plugins_dirs[0])
    sys.path[0:0] = plugins_dirs  # sibling imports: the first folder that has the module
    channel = Channel(read_fd, write_fd)
    progress = Progress(options.progress_fd)  # before the sandbox
    try:  # before any thread starts; on refusal the pool is told why
        confinement = sandbox.confine(plugins_dirs, options.limits, options.confinement, options.tmp_parent)
    except (sandbox.SandboxError, OSError) as exc:
        channel.send(encode_frame({"ok": False, "error": f"sandbox: {exc}"}))
        return 1
    worker_errors.NETWORK_OFF = confinement.features.get("no_network", "").startswith("on")  # never with the network on
    _exit_with_parent(read_fd)
    runner = Runner(plugins_dirs, options.limits.cpu_seconds, options.limits.max_output, progress)
    channel.send(encode_frame({"ok": True, "ready": True, "pid": os.getpid(), "sandbox": asdict(confinement)}))
    while (request := channel.receive()) is not None:
        channel.send(runner.handle(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
