"""The private-RabbitMQ helper itself: a node of its own, plain and with TLS, torn down after."""

from __future__ import annotations

import ssl
import subprocess

import kombu
import pytest

from tests.rabbit_private import PrivateRabbit, TlsFiles, available
from tests.tls_certs import make_certs

pytestmark = [pytest.mark.rabbitmq, pytest.mark.skipif(available() is not None, reason=str(available()))]


def test_private_node_has_its_own_users_and_stops(tmp_path):
    node = PrivateRabbit.start_new(tmp_path / "node")
    try:
        assert node.port != 5672 and node.node.startswith("vmsched-test-")
        node.ctl("add_user", "alice", "s3cret")
        node.ctl("set_permissions", "-p", "/", "alice", ".*", ".*", ".*")
        with kombu.Connection(node.url("alice", "s3cret"), connect_timeout=5) as conn:
            conn.connect()
            assert conn.connected
        # the shared broker never learns about this user
        shared = subprocess.run(["rabbitmqctl", "-q", "list_users"], capture_output=True, text=True, timeout=60)
        assert "alice" not in shared.stdout
    finally:
        node.stop()
    assert node.proc is not None and node.proc.poll() is not None
    with pytest.raises(Exception):
        with kombu.Connection(node.url("alice", "s3cret"), connect_timeout=2) as conn:
            conn.connect()


def test_private_node_with_tls_verifies_both_sides(tmp_path):
    certs = make_certs(tmp_path / "certs")
    with PrivateRabbit.start_new(tmp_path / "node", tls=TlsFiles(certs.ca, certs.server_cert, certs.server_key,
                                                                 fail_if_no_peer_cert=True)) as node:
        url = node.url(tls=True)
        good = {"ca_certs": str(certs.ca), "cert_reqs": ssl.CERT_REQUIRED,
                "certfile": str(certs.client_cert), "keyfile": str(certs.client_key)}
        with kombu.Connection(url, ssl=good, connect_timeout=5) as conn:
            conn.connect()
            assert conn.connected
        with pytest.raises(ssl.SSLError):  # the server's certificate is not from this CA
            with kombu.Connection(url, ssl={**good, "ca_certs": str(certs.other_ca)}, connect_timeout=5) as conn:
                conn.connect()
        no_client_cert = {"ca_certs": str(certs.ca), "cert_reqs": ssl.CERT_REQUIRED}
        with pytest.raises(Exception):  # the broker requires a client certificate
            with kombu.Connection(url, ssl=no_client_cert, connect_timeout=5) as conn:
                conn.connect()
