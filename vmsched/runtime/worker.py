"""The plugin worker process: runs administrators' plugin code for a PluginPool.

Started by :class:`vmsched.runtime.pool.PluginPool` as
``python -P -m vmsched.runtime.worker --plugins-dir DIR ...`` and then reused
for many calls. It talks to its pool over its stdin/stdout pipes with
length-prefixed JSON frames (4-byte big-endian size, then UTF-8 JSON; never
pickle: this process runs untrusted code). Before any plugin runs, the
protocol pipes are moved to private descriptors and fd 0/1 are pointed at
/dev/null and stderr, so a plugin writing to fd 1 cannot corrupt a frame.

Requests (one at a time, each answered by exactly one reply):

- ``{"op": "call", "plugin", "cls", "method", "args"}`` ->
  ``{"ok": true, "value", "stderr"}`` or ``{"ok": false, "error", "stderr"}``
- ``{"op": "analyze", "path"}`` -> ``{"ok": true, "units": [...]}`` or an error
- ``{"op": "warm", "plugins": [...]}`` -> ``{"ok": true, "loaded": [...]}``

This module imports only the standard library (and the stdlib-only protocol,
capture and contract modules of this package): it must start fast and must not drag
the service's dependencies into the plugins' interpreter.
"""

from __future__ import annotations

import argparse
import ast
import faulthandler
import importlib.util
import inspect
import json
import math
import os
import resource
import select
import signal
import sys
import threading
import traceback
from types import ModuleType
from typing import Any

from vmsched.runtime import children, sandbox
from vmsched.runtime.capture import Capture, OutputLimitExceeded, _Redirect
from vmsched.runtime.contract import KINDS
from vmsched.runtime.protocol import Channel, encode_frame
from vmsched.plugin import _held as held_facts

_MAX_MESSAGE = 2000  # characters of an exception message kept in an error


# --- results ------------------------------------------------------------------


class PluginError(Exception):
    """A call cannot run: missing file, class or method, or an import failure."""


def parse_output(text: str) -> Any:
    """The value an old-style plugin printed, as a Python literal."""
    text = text.strip()
    if not text:
        raise PluginError("no result: the method returned None and printed nothing")
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if len(lines) > 1:
        try:
            return ast.literal_eval(lines[-1])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            pass
    shown = text if len(text) <= 200 else text[:200] + "..."
    raise PluginError(f"could not parse output as a Python literal: {shown!r}")


def describe_exception(exc: BaseException, plugins_dir: str) -> str:
    """``Type: message (file.py, line N, in func)`` with the plugin's last frame."""
    if isinstance(exc, SystemExit):
        return f"plugin called sys.exit({exc.code!r})"
    kind = type(exc).__qualname__
    if type(exc).__module__ not in ("builtins", "__main__"):
        kind = f"{type(exc).__module__}.{kind}"
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the error
        message = "<unprintable message>"
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "..."
    text = f"{kind}: {message}" if message else kind
    frame = _last_plugin_frame(exc, plugins_dir)
    if frame is not None:
        where = os.path.relpath(frame.filename, plugins_dir)
        text += f" ({where}, line {frame.lineno}, in {frame.name})"
    if NETWORK_OFF and _refused_socket(exc):
        text += f" [{NETWORK_HINT}]"
    return text


#: Set by main() when the sandbox refuses network sockets.
NETWORK_OFF = False
NETWORK_HINT = (
    "network access is off for plugins; turn it on for this deployment with "
    "--plugin-network (VMSCHED_PLUGIN_NETWORK=true)"
)


def _refused_socket(exc: BaseException) -> bool:
    """A PermissionError raised by the socket module somewhere in the chain of ``exc``."""
    seen: set[int] = set()
    todo: list[Any] = [exc]
    while todo and len(seen) < 20:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, PermissionError):
            names = [f.filename for f in traceback.extract_tb(item.__traceback__)]
            if any(os.path.basename(n) == "socket.py" for n in names):
                return True
        todo += [item.__cause__, item.__context__, getattr(item, "reason", None), *item.args[:3]]
    return False


def _last_plugin_frame(exc: BaseException, plugins_dir: str) -> traceback.FrameSummary | None:
    prefix = plugins_dir.rstrip(os.sep) + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(prefix)]
    return frames[-1] if frames else None


# --- plugin modules -------------------------------------------------------------


class Modules:
    """Plugin modules by name, re-imported when their file changes."""

    def __init__(self, plugins_dir: str) -> None:
        self.dir = plugins_dir
        self._prefix = plugins_dir.rstrip(os.sep) + os.sep
        self._cache: dict[str, tuple[ModuleType, tuple[int, int, int]]] = {}

    def get(self, name: str) -> ModuleType:
        """The module of ``name.py`` (one stat; imported again if changed)."""
        if not name.isidentifier():
            raise PluginError(f"invalid plugin name {name!r}")
        path = os.path.join(self.dir, name + ".py")
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.forget(name)
            raise PluginError(f"plugin file {name}.py not found in {self.dir} (removed?)") from None
        cached = self._cache.get(name)
        if cached is not None and cached[1] == (st.st_mtime_ns, st.st_size, st.st_ino):
            return cached[0]
        return self.load(name, path)

    def load(self, name: str, path: str) -> ModuleType:
        """Import ``path`` fresh as module ``name`` (exceptions propagate)."""
        if name in self._cache:
            self._evict_helpers()
        self.forget(name)
        st = os.stat(path)
        with open(path, "rb") as source:
            code = compile(source.read(), path, "exec", dont_inherit=True)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None:
            raise PluginError(f"cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        if os.path.dirname(path) == self.dir:
            self._cache[name] = (module, (st.st_mtime_ns, st.st_size, st.st_ino))
        return module

    def forget(self, name: str) -> None:
        if self._cache.pop(name, None) is not None:
            sys.modules.pop(name, None)

    def _evict_helpers(self) -> None:
        """Drop helper modules of the plugins folder so a re-import sees their changes."""
        for key, module in list(sys.modules.items()):
            path = getattr(module, "__file__", None)
            if key not in self._cache and isinstance(path, str) and path.startswith(self._prefix):
                del sys.modules[key]


def reads_facts(module: ModuleType, path: str) -> bool:
    """Whether the plugin file uses the facts API (``vmsched.plugin``): its calls then carry the facts.

    The module's names are checked (``from vmsched.plugin import facts`` and friends), and its source
    text as a fallback; a helper module that reads facts on the plugin's behalf must be imported by a
    plugin file that names ``vmsched.plugin`` itself (docs/plugins.md).
    """
    for value in list(vars(module).values()):
        owner = value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        if isinstance(owner, str) and (owner == "vmsched.plugin" or owner.startswith("vmsched.plugin.")):
            return True
    try:
        with open(path, encoding="utf-8", errors="replace") as source:
            return "vmsched.plugin" in source.read(1 << 20)
    except OSError:
        return False


def list_units(module: ModuleType) -> list[dict[str, str]]:
    """One entry per (class defined in ``module``, do_* method it has)."""
    units = []
    for attr, obj in list(vars(module).items()):
        if not isinstance(obj, type) or obj.__module__ != module.__name__ or obj.__name__ != attr:
            continue
        for unit_kind in KINDS:
            func = getattr(obj, unit_kind.method, None)
            if callable(func):
                units.append(
                    {
                        "name": attr,
                        "kind": unit_kind.kind,
                        "description": inspect.getdoc(func) or inspect.getdoc(obj) or "",  # old samples: class docstrings
                        "validation": _validation_of(obj),
                    }
                )
    return units


def _validation_of(cls: type) -> str:
    value = getattr(cls, "properties_validation", "")
    if isinstance(value, str):
        return value
    if isinstance(value, dict):  # written as a dict instead of a string: keep it parseable
        return repr(value)
    return ""


# --- the request handler ---------------------------------------------------------


class Runner:
    """Executes requests inside the worker; never raises for a plugin's fault."""

    def __init__(self, plugins_dir: str, cpu_seconds: int, max_output: int) -> None:
        self.dir = plugins_dir
        self.cpu_seconds = cpu_seconds
        self.max_output = max_output
        self.max_reply = 2 * max_output + (1 << 16)
        self.modules = Modules(plugins_dir)
        self._cpu_soft = -1
        self._cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
        self._cwd = os.getcwd()  # the plugins folder, as the kernel spells it

    def handle(self, request: dict[str, Any]) -> bytes:
        """The reply frame to ``request``."""
        stderr = Capture(self.max_output, strict=False)
        try:
            reply = self._dispatch(request, stderr)
        except Exception as exc:
            reply = {"ok": False, "error": f"internal worker error: {exc!r}"}
        finally:
            self._restore_cwd()
            children.kill_all()  # nothing a plugin started outlives its call
        reply["stderr"] = stderr.getvalue()
        return self._encode(reply, stderr)

    def _dispatch(self, request: dict[str, Any], stderr: Capture) -> dict[str, Any]:
        op = request.get("op")
        if op == "call":
            held_facts.install(request.get("facts"))  # this call's host facts (vmsched.plugin.facts)
            reply = self.call(request["plugin"], request["cls"], request["method"], request["args"], stderr)
            return {**reply, "facts_resync": True} if held_facts.lost() else reply  # it lacked some: resend all
        if op == "analyze":
            return self.analyze(request["path"], stderr)
        if op == "warm":
            return self.warm(request["plugins"], stderr)
        return {"ok": False, "error": f"unknown request {op!r}"}

    def _encode(self, reply: dict[str, Any], stderr: Capture) -> bytes:
        try:
            frame = encode_frame(reply)
        except (TypeError, ValueError, RecursionError, OverflowError) as exc:
            return encode_frame(
                {"ok": False, "error": f"result is not JSON-serializable: {exc}", "stderr": stderr.getvalue()}
            )
        if len(frame) > self.max_reply:
            error = f"result too large: {len(frame)} bytes encoded (limit {self.max_reply})"
            return encode_frame({"ok": False, "error": error, "stderr": stderr.getvalue()[:4096]})
        return frame

    # -- call
    def call(self, plugin: str, cls_name: str, method: str, args: list[Any], stderr: Capture) -> dict[str, Any]:
        try:
            cls = self._resolve(plugin, cls_name, method, stderr)
        except PluginError as exc:
            return {"ok": False, "error": str(exc)}
        self._arm_cpu_limit()
        stdout = Capture(self.max_output, strict=True)
        try:
            with _Redirect(stdout, stderr):
                value = getattr(cls(), method)(*args)
        except OutputLimitExceeded:
            return {"ok": False, "error": f"stdout exceeded {self.max_output} bytes"}
        except SystemExit as exc:
            if exc.code not in (None, 0) or not stdout.getvalue().strip():
                return self._failed(exc, stdout, stderr)
            value = None  # an old plugin that printed its result, then exit(0)
        except BaseException as exc:
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
            with _Redirect(stderr, stderr):
                return self.modules.get(plugin)
        except PluginError:
            raise
        except BaseException as exc:
            raise PluginError(f"cannot import plugin {plugin}: {describe_exception(exc, self.dir)}") from None

    def _failed(self, exc: BaseException, stdout: Capture, stderr: Capture) -> dict[str, Any]:
        if stdout.exceeded:
            return {"ok": False, "error": f"stdout exceeded {self.max_output} bytes"}
        if not isinstance(exc, SystemExit):
            stderr.write("".join(traceback.format_exception(exc)))
        return {"ok": False, "error": describe_exception(exc, self.dir)}

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
        try:
            if os.getcwd() == self._cwd:
                return
        except OSError:
            pass
        os.chdir(self.dir)

    # -- analyze and warm
    def analyze(self, path: str, stderr: Capture) -> dict[str, Any]:
        name = os.path.splitext(os.path.basename(path))[0]
        self._arm_cpu_limit()
        try:
            with _Redirect(stderr, stderr):
                module = self.modules.load(name, path)
                units = list_units(module)
        except BaseException as exc:
            return {"ok": False, "error": f"cannot import plugin {name}: {describe_exception(exc, self.dir)}"}
        return {"ok": True, "units": units, "uses_facts": reads_facts(module, path)}

    def warm(self, plugins: list[str], stderr: Capture) -> dict[str, Any]:
        loaded = []
        for plugin in plugins:
            try:
                self._import(plugin, stderr)
                loaded.append(plugin)
            except PluginError:
                pass
        return {"ok": True, "loaded": loaded}


# --- process setup ---------------------------------------------------------------


def _take_protocol_fds() -> tuple[int, int]:
    """Move the protocol pipes off fd 0/1; fd 0 -> /dev/null, fd 1 -> stderr."""
    read_fd, write_fd = os.dup(0), os.dup(1)  # os.dup: not inherited by children
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    return read_fd, write_fd


def _exit_with_parent(read_fd: int) -> None:
    """Exit when the pool's end of the request pipe closes, even mid-call."""

    def watch() -> None:
        poller = select.poll()
        poller.register(read_fd, 0)  # only POLLHUP/POLLERR/POLLNVAL wake us
        poller.poll()
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _confine(options: argparse.Namespace, plugins_dir: str, channel: Channel) -> sandbox.Report:
    """Apply the sandbox; on refusal tell the pool why and exit."""
    global NETWORK_OFF
    settings = sandbox.Options.from_json({"plugins_dir": plugins_dir, "memory_mb": options.memory_mb, **json.loads(options.sandbox)})
    settings.plugins_dir = plugins_dir
    try:
        report = sandbox.confine(settings)
    except (sandbox.SandboxError, OSError) as exc:
        channel.send(encode_frame({"ok": False, "error": f"sandbox: {exc}"}))
        sys.exit(1)
    NETWORK_OFF = not settings.network and report.features.get("no_network", "").startswith("on")
    return report


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vmsched.runtime.worker")
    parser.add_argument("--plugins-dir", required=True)
    parser.add_argument("--memory-mb", type=int, default=1024)
    parser.add_argument("--cpu-seconds", type=int, default=30)
    parser.add_argument("--max-output", type=int, default=1 << 20)
    parser.add_argument("--sandbox", default="{}", help="sandbox options as JSON (vmsched.runtime.sandbox.Options)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = _parse_args(argv)
    plugins_dir = os.path.abspath(options.plugins_dir)
    read_fd, write_fd = _take_protocol_fds()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the pool decides when we stop
    faulthandler.enable()  # a crashing plugin leaves a Python traceback on stderr
    sys.dont_write_bytecode = True  # never a stale .pyc for a rewritten plugin
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past RLIMIT_FSIZE a write fails (EFBIG) instead
    os.chdir(plugins_dir)
    sys.path.insert(0, plugins_dir)
    channel = Channel(read_fd, write_fd)
    confinement = _confine(options, plugins_dir, channel)  # before any thread starts
    _exit_with_parent(read_fd)
    runner = Runner(plugins_dir, options.cpu_seconds, options.max_output)
    channel.send(encode_frame({"ok": True, "ready": True, "pid": os.getpid(), "sandbox": confinement.as_dict()}))
    while (request := channel.receive()) is not None:
        channel.send(runner.handle(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
