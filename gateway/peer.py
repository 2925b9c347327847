"""The client certificate of a TLS connection, as the ASGI TLS extension's ``client_cert_name``.

uvicorn does not put the peer certificate in the ASGI scope; this mixin for
its httptools protocol does, for connections whose certificate the server
verified (``--tls-client-ca``). The name is the subject in RFC 4514 form,
most specific attribute first (``CN=engine-1,O=Example``), as
``openssl x509 -noout -subject -nameopt RFC2253`` prints it.
"""

from __future__ import annotations

import asyncio
from typing import Any

_SHORT = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU", "countryName": "C",
          "stateOrProvinceName": "ST", "localityName": "L", "domainComponent": "DC", "userId": "UID",
          "streetAddress": "STREET"}


def _escape(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;=' else c for c in value)
    if out[:1] in ("#", " "):
        out = "\\" + out
    if out.endswith(" "):
        out = out[:-1] + "\\ "
    return out


def subject_name(cert: dict[str, Any] | None) -> str | None:
    """RFC 4514 text of ``ssl.getpeercert()``'s subject, None without a verified certificate."""
    if not cert or not cert.get("subject"):
        return None
    rdns = []
    for rdn in reversed(cert["subject"]):
        rdns.append("+".join(f"{_SHORT.get(k, k)}={_escape(v)}" for k, v in rdn))
    return ",".join(rdns)


class ClientCertMixin:
    """Put a verified client certificate's subject into ``scope["extensions"]["tls"]``."""

    scope: dict[str, Any]
    _client_cert_name: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._client_cert_name = subject_name(transport.get_extra_info("peercert"))

    def on_message_begin(self) -> None:
        super().on_message_begin()  # type: ignore[misc]
        if self._client_cert_name:
            self.scope["extensions"] = {"tls": {"client_cert_name": self._client_cert_name}}
