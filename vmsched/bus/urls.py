"""Broker URLs: where a password may come from, and how a URL is shown.

A broker may be a cluster: several URLs, separated by ``;`` as in kombu's
failover syntax (``amqp://u:p@node1:5672/vmsched;amqp://u:p@node2:5672/vmsched``),
or one a line in the URL file. A component connects to the first node that
answers and, when that node goes away, to another one
(docs/deploy/rabbitmq-cluster.md).

A password never comes from the command line (``ps`` shows every process's
arguments to every user): it comes from a file (``--amqp-url-file``) or the
environment (``VMSCHED_AMQP_URL``). A URL is only ever shown masked
(``amqp://user:***@host:5672/vhost``), in logs and in error messages.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from urllib.parse import urlsplit

#: ``scheme://user:password@`` anywhere in a text (several URLs, or one inside an error message).
_CREDENTIALS = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@\s]*)@")

ALTERNATIVES = "put the URL in a file readable only by the service (--amqp-url-file FILE, env VMSCHED_AMQP_URL_FILE) " \
               "or in the environment (VMSCHED_AMQP_URL)"


def mask(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def split(text: str) -> list[str]:
    """The URLs of a failover list (``;`` between them), blanks dropped."""
    return [part.strip() for part in text.split(";") if part.strip()]


def has_password(url: str) -> bool:
    """Whether ``url`` (or any URL of a failover list) holds a password."""
    for part in split(url) or [url]:
        try:
            if urlsplit(part).password:
                return True
        except ValueError:
            if _CREDENTIALS.search(part):
                return True
    return False


def command_line_url(value: str) -> str:
    """An ``--amqp`` value: a URL without a password (argparse ``type``)."""
    if has_password(value):
        raise ValueError(f"--amqp {mask(value)}: a password on the command line is visible to every user (ps); "
                         f"{ALTERNATIVES}")
    return value


def url_argument(value: str) -> str:
    """argparse ``type`` of ``--amqp``: :func:`command_line_url`, its error shown without the value."""
    try:
        return command_line_url(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def read_url_file(path: Path | str) -> str:
    """The broker URL kept in ``path``: its non-empty, non-comment lines, several of them (a cluster's nodes)
    joined into one failover list (``;``)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read the broker URL file {path}: {exc.strerror or exc}") from None
    urls: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            for url in split(line):
                if "://" not in url:
                    raise ValueError(f"broker URL file {path} does not hold a URL "
                                     "(amqp://USER:PASSWORD@HOST:PORT/VHOST, one a line for a cluster)")
                urls.append(url)
    if not urls:
        raise ValueError(f"broker URL file {path} is empty (expected amqp://USER:PASSWORD@HOST:PORT/VHOST)")
    return ";".join(urls)
