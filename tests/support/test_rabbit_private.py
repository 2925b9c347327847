"""The private-RabbitMQ helper itself: a node of its own, plain and with TLS, and a cluster of three, torn down after."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from typing import Iterator

import kombu
import pytest

from tests.support.locks import broker_faults_alone  # noqa: F401 - an autouse fixture
from tests.support.rabbit_private import PrivateCluster, PrivateRabbit, TlsFiles, available
from tests.support.tls_certs import make_certs

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


@pytest.mark.slow
def test_private_cluster_of_three_moves_a_quorum_leader_and_tears_down(tmp_path):
    """Three nodes of their own joined into one cluster: a quorum queue on all three; its leader's node killed,
    another node leads it; every node's processes gone after stop(), the shared broker untouched."""
    shared_before = subprocess.run(["rabbitmqctl", "-q", "cluster_status", "--formatter", "json"], capture_output=True,
                                   text=True, timeout=60).stdout
    cluster = PrivateCluster.start_new(tmp_path / "cluster", 3)
    try:
        assert len({n.port for n in cluster.nodes} | {n.dist_port for n in cluster.nodes}) == 6
        assert 5672 not in {n.port for n in cluster.nodes}
        assert sorted(cluster.running()) == sorted(n.node for n in cluster.nodes)
        with kombu.Connection(cluster.nodes[1].url(), connect_timeout=10) as conn:
            conn.connect()
            kombu.Queue("cluster-test", durable=True, queue_arguments={"x-queue-type": "quorum"})(conn.default_channel).declare()
        leader = cluster.leaders()["cluster-test"]
        assert leader == cluster.nodes[1].node  # placed where its client is connected
        cluster.by_name(leader).kill()
        deadline = time.monotonic() + 60
        while cluster.leaders().get("cluster-test") in (None, leader) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert cluster.leaders()["cluster-test"] in {cluster.nodes[0].node, cluster.nodes[2].node}
    finally:
        cluster.stop()
    assert all(n.proc is not None and n.proc.poll() is not None for n in cluster.nodes)
    shared_after = subprocess.run(["rabbitmqctl", "-q", "cluster_status", "--formatter", "json"], capture_output=True,
                                  text=True, timeout=60).stdout
    assert json.loads(shared_after)["running_nodes"] == json.loads(shared_before)["running_nodes"]
