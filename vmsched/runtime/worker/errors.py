"""How the plugin worker reports a plugin's failure: errors, printed results, exception text.

Standard library only (the plugin worker process imports it).
"""

from __future__ import annotations

import ast
import os
import traceback
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

_MAX_MESSAGE = 2000  # characters of an exception message kept in an error


class PluginError(Exception):
    """A call cannot run: missing file, class or method, or an import failure."""


def parse_output(text: str) -> Any:
    """The value an old-style plugin printed, as a Python literal."""
    text = text.strip()
    if not text:
        raise PluginError("no result: the method returned None and printed nothing")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for candidate in (text, lines[-1]) if len(lines) > 1 else (text,):  # all of it, else its last line
        with suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return ast.literal_eval(candidate)
    shown = text if len(text) <= 200 else text[:200] + "..."
    raise PluginError(f"could not parse output as a Python literal: {shown!r}")


def describe_exception(exc: BaseException, plugins_dirs: Sequence[str]) -> str:
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
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):  # the plugin's last frame
        folder = next((f for f in plugins_dirs if frame.filename.startswith(f.rstrip(os.sep) + os.sep)), None)
        if folder is not None:
            text += f" ({os.path.relpath(frame.filename, folder)}, line {frame.lineno}, in {frame.name})"
            break
    if NETWORK_OFF and _refused_socket(exc):
        text += f" [{NETWORK_HINT}]"
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] in OLD_SDK:
        text += f" [{SDK_HINT}]"
    return text


#: The oVirt Python SDK v3 that the old proxy's samples import.
OLD_SDK = frozenset({"ovirtsdk"})
SDK_HINT = ("the oVirt SDK v3 is not available to plugins: read host facts instead "
            "(docs/plugins.md, 'Porting an old sample')")


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

