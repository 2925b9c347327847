"""What a start needs, checked before any service starts.

Each check raises ValueError with one line that says what is wrong and what
to do; the command line prints it as ``vmsched: error: ...``. The listen
socket is bound here too, so a busy port fails before anything runs.
"""

from __future__ import annotations

import errno
import os
import pwd
import socket
import sys
from pathlib import Path

from vmsched.config import Settings
from vmsched.runtime.worker.sandbox import unreadable_by
from vmsched.service import default_plugin_user


def check_plugins(settings: Settings) -> None:
    """The plugins folders exist, and a root service can run plugin workers as the plugin user."""
    for folder in settings.plugin_folders:
        _check_folder(folder, settings)


def _check_folder(folder: Path, settings: Settings) -> None:
    if not folder.exists():
        raise ValueError(f"plugins folder {folder} does not exist (--plugins DIR or VMSCHED_PLUGINS)")
    if not folder.is_dir():
        raise ValueError(f"--plugins {folder} is a file; it must be the folder that holds the plugin files "
                         f"(e.g. --plugins {folder.parent})")
    if os.geteuid() != 0 or settings.allow_root_plugins:
        return  # workers run as the service's own user, or may stay root
    user = settings.plugin_user or default_plugin_user()
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise ValueError(f"plugin workers of a root service run as user {user!r}, which does not exist: create it, "
                         "or choose another --plugin-user") from None
    if entry.pw_uid == 0:
        raise ValueError(f"--plugin-user {user!r} is root: choose an unprivileged user, or give "
                         "--allow-root-plugins to run plugins as root without capabilities")
    needed = unreadable_by(entry, str(folder.absolute()))
    if needed is None:
        return
    if Path(needed).absolute() == folder.absolute() or folder.absolute().is_relative_to(needed):
        raise ValueError(f"plugin workers run as user {user!r}, who cannot read the plugins folder {folder}: "
                         "make it readable by that user, choose another --plugin-user, or give --allow-root-plugins")
    raise ValueError(f"plugin workers run as user {user!r}, who cannot read {needed} (the Python of {sys.prefix}): "
                     "make the venv with a Python that user can read, e.g. /usr/bin/python3 -m venv .venv "
                     "(scripts/bootstrap does), or choose another --plugin-user, or give --allow-root-plugins")


def check_tokens(settings: Settings) -> None:
    """The tokens file, if one is given, exists (its content is checked when it is loaded)."""
    path = settings.tokens_file
    if path is not None and not path.is_file():
        raise ValueError(f"tokens file {path} does not exist: make one with "
                         f"`vmsched token new --name NAME --role read --file {path}`, or leave out --tokens-file")


def cannot_listen(what: str, host: str, port: int | None, exc: OSError, option: str) -> ValueError:
    """What to do when ``what`` cannot listen on host:port; ``option`` is the flag of its port (``--port``)."""
    variable = "VMSCHED_" + option.removeprefix("--").replace("-", "_").upper()
    if exc.errno == errno.EADDRINUSE:
        hint = (f"another process listens there, e.g. a vmsched started before: stop it (Ctrl-C where it runs), "
                f"or choose another port with {option} PORT ({variable})")
    else:
        host_option = option.replace("port", "host")
        hint = f"choose another address or port with {host_option} and {option}"
    return ValueError(f"{what} cannot listen on {host}:{port}: {exc.strerror or exc}; {hint}")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port, or ValueError saying why not and what to do."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ValueError(f"listen address {host!r}: {exc.strerror} (--host ADDR)") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise cannot_listen("the gateway", host, port, exc, "--port") from None
    return sock
