"""Test certificates: one private CA (trustme) that signs server and client certificates."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass(frozen=True)
class CertSet:
    ca: Path  # CA certificate (PEM): what clients and servers trust
    server_cert: Path  # chain for localhost / 127.0.0.1
    server_key: Path
    client_cert: Path  # a client certificate with the given common name
    client_key: Path
    other_ca: Path  # a CA that signed nothing here (to test verification failures)


def make_certs(folder: Path, client_name: str = "vmsched-test-client") -> CertSet:
    folder.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert(client_name, common_name=client_name)
    paths = {name: folder / f"{name}.pem" for name in ("ca", "server", "server-key", "client", "client-key", "other")}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_pem.write_to_path(str(paths["server-key"]))
    client.private_key_pem.write_to_path(str(paths["client-key"]))
    paths["server"].write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    paths["client"].write_bytes(b"".join(blob.bytes() for blob in client.cert_chain_pems))
    trustme.CA().cert_pem.write_to_path(str(paths["other"]))
    for key in ("server-key", "client-key"):
        paths[key].chmod(0o600)
    return CertSet(paths["ca"], paths["server"], paths["server-key"], paths["client"], paths["client-key"],
                   paths["other"])
