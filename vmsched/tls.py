"""Server TLS contexts whose certificate and key are reloaded when the files change.

Every handshake passes through the context's SNI callback (OpenSSL calls it
with or without a server name). The callback checks the files at most every
``check_interval`` seconds; after a change it builds a fresh context and
hands it to this and later handshakes, so a renewed certificate is served
without a restart. A pair that fails to load (e.g. the key not written yet)
keeps the last good one; the error is logged and counted
(``vmsched_tls_reloads_total{outcome="error"}``) and retried on the next change.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from pathlib import Path

from vmsched import metrics

log = logging.getLogger("vmsched.tls")


def file_signature(path: Path) -> tuple[int, int, int, int] | None:
    """What tells a file's new content from its old one (None: no such file), for the readers that reload."""
    try:
        st = os.stat(path)  # follows symlinks: a swapped Secret mount shows a new inode
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class ReloadingServerContext:
    """A server-side SSLContext for ``cert``/``key``, optionally asking for client certificates."""

    def __init__(self, cert: Path, key: Path, client_ca: Path | None = None, check_interval: float = 1.0) -> None:
        self.cert, self.key, self.client_ca = Path(cert), Path(key), client_ca
        self.check_interval = check_interval
        self._lock = threading.Lock()
        self._signature = file_signature(self.cert), file_signature(self.key)
        self._checked = time.monotonic()
        self.current = self._build()  # a broken pair at start is an error, not a fallback
        self.context = self._build()
        self.context.sni_callback = self._on_hello

    def _build(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS certificate {self.cert} / key {self.key}: {exc}") from None
        if self.client_ca is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca))
            except (OSError, ssl.SSLError) as exc:
                raise ValueError(f"TLS client CA {self.client_ca}: {exc}") from None
            ctx.verify_mode = ssl.CERT_OPTIONAL  # a certificate is one credential; a bearer token is the other
        return ctx

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.check_interval:
            return
        with self._lock:
            self._checked = now
            signature = file_signature(self.cert), file_signature(self.key)
            if signature == self._signature:
                return
            try:
                fresh = self._build()
            except ValueError as exc:
                metrics.TLS_RELOADS.labels(outcome="error").inc()
                log.error("TLS certificate not reloaded, serving the previous one: %s", exc)
                return  # the signature stays old: retried until the pair loads
            self._signature = signature
            self.current = fresh
            metrics.TLS_RELOADS.labels(outcome="ok").inc()
            log.info("TLS certificate %s reloaded", self.cert)

    def _on_hello(self, sslobj: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
                  context: ssl.SSLContext) -> None:
        self.refresh()
        sslobj.context = self.current


def server_context(cert: Path | None, key: Path | None, client_ca: Path | None = None,
                   what: str = "TLS") -> ssl.SSLContext | None:
    """The reloading context for a listener, None without TLS; both files or neither."""
    if cert is None and key is None:
        if client_ca is not None:
            raise ValueError(f"{what}: a client CA needs a certificate and key (TLS) as well")
        return None
    if cert is None or key is None:
        raise ValueError(f"{what}: give both a certificate and a key")
    return ReloadingServerContext(cert, key, client_ca).context
