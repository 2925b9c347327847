"""amqps: the broker's certificate verified (CA, host name), a client certificate when the broker asks for one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Iterator

import pytest

from tests.support.rabbit_private import PrivateRabbit, TlsFiles, available
from tests.support.tls_certs import CertSet, make_certs
from vmsched.bus import BusUnavailable
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.broker import BrokerTransport
from vmsched.bus.rabbitmq.worker import ServiceWorker
from vmsched.messages import Envelope

pytestmark = pytest.mark.rabbitmq


@pytest.fixture(scope="module")
def tls_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PrivateRabbit, CertSet]]:
    why = available()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.mktemp("rabbit-tls")
    certs = make_certs(base / "certs")
    tls = TlsFiles(certs.ca, certs.server_cert, certs.server_key, verify_peer=True, fail_if_no_peer_cert=True)
    node = PrivateRabbit.start_new(base / "node", tls=tls)
    try:
        yield node, certs
    finally:
        node.stop()


def test_a_service_and_the_gateway_client_talk_over_amqps(tls_broker):
    node, certs = tls_broker
    options = BusOptions(url=node.url(tls=True), ca=certs.ca, cert=certs.client_cert, key=certs.client_key)
    worker = ServiceWorker(options, "tls-test", {"test.tls": lambda env: {"echo": env.body}}, consumers=1)
    worker.start()
    try:
        assert worker.ready.wait(20)
        assert BrokerTransport(options).call("test.tls", "x", {"a": 1}, timeout=10) == {"echo": {"a": 1}}

        async def gateway_side() -> dict:
            client = AsyncBusClient(options, declare=("test.tls",))
            await client.start()
            try:
                return await client.call("test.tls", "x", {"b": 2}, 10)
            finally:
                await client.close()

        assert asyncio.run(gateway_side()) == {"echo": {"b": 2}}
    finally:
        worker.stop()


def test_a_broker_certificate_from_another_ca_is_refused_promptly(tls_broker):
    node, certs = tls_broker
    options = BusOptions(url=node.url(tls=True), ca=certs.other_ca, cert=certs.client_cert, key=certs.client_key,
                         connect_timeout=5)
    # the handshake's error (BusUnavailable naming the cause), not a BusTimeout at the request's deadline
    with pytest.raises(BusUnavailable, match="CERTIFICATE_VERIFY_FAILED") as exc:
        BrokerTransport(options).call("test.tls", "x", {}, timeout=30)
    assert ":guest@" not in str(exc.value)  # the URL shown without its password


def test_the_system_trust_store_does_not_trust_a_private_ca(tls_broker):
    node, certs = tls_broker  # no --amqp-ca: verification stays on, against the system's CAs
    options = BusOptions(url=node.url(tls=True), cert=certs.client_cert, key=certs.client_key)
    with pytest.raises(BusUnavailable, match="CERTIFICATE_VERIFY_FAILED"):
        BrokerTransport(options).call("test.tls", "x", {}, timeout=10)


def test_tls_options_are_checked_up_front(tmp_path: Path):
    with pytest.raises(ValueError, match="amqps://"):
        BusOptions(url="amqp://u@localhost/", ca=tmp_path / "ca.pem")
    with pytest.raises(ValueError, match="go together"):
        BusOptions(url="amqps://u@localhost/", cert=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="does not exist"):
        BusOptions(url="amqps://u@localhost/", ca=tmp_path / "missing.pem")
    assert "secret" not in repr(BusOptions(url="amqps://u:secret@localhost/"))
