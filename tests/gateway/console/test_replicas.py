"""Console logouts shared by gateway replicas over RabbitMQ (vmsched.gateway.console.logouts).

On a private RabbitMQ node with the least-privilege users of
deploy/rabbitmq/setup-users.sh: replicas on the vmsched-gateway user share
their logouts, a replica that starts later learns the earlier ones, and no
other component may speak there. Then two real gateway processes with the
same console secret: a session made on one works on the other until it is
logged out on the first.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Iterator

import amqp.exceptions
import httpx
import pytest

from tests.support.broker_users import HOSTS, broker, publish, url  # noqa: F401 - the broker fixture
from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.stack import start_replicas
from tests.support.waiting import wait_until
from tests.gateway.console.test_sessions import OTHER, TOKEN, write_tokens
from vmsched.bus.options import BusOptions
from vmsched.bus.topology import EVENTS_EXCHANGE
from vmsched.bus.transport import open_transport
from vmsched.gateway.console.logouts import LogoutLink
from vmsched.gateway.console.sessions import COOKIE, Logouts

pytestmark = pytest.mark.rabbitmq

SIDS = [f"session{i:015d}" for i in range(3)]
PAGE = "/console/decisions/" + "0" * 32


@pytest.mark.parametrize("user, key", [
    ("vmsched-scoring", "gateway.console.logout"),  # only gateways speak of console sessions
    (f"vmsched-agent-{HOSTS[0]}", "gateway.console.hello"),
    ("vmsched-gateway", "gateway.console.other"),
])
def test_console_messages_outside_ones_rights_are_refused(broker, user: str, key: str):  # noqa: F811
    _, secrets = broker
    with pytest.raises(amqp.exceptions.AccessRefused):
        publish(secrets, user, EVENTS_EXCHANGE, key)


def test_replicas_share_logouts_and_a_newcomer_learns_them(broker):  # noqa: F811
    _, secrets = broker
    transport = open_transport(BusOptions(url=url(secrets, "vmsched-gateway"), connect_timeout=2.0))
    books = [Logouts() for _ in range(3)]
    links = [LogoutLink(transport, f"gw-{i}", book) for i, book in enumerate(books)]
    far = 2**40
    try:
        for link in links[:2]:
            link.start()
        for link in links[:2]:
            assert link.ready.wait(20), f"{link.gateway} did not subscribe"
        books[0].add(SIDS[0], far)
        assert links[0].share([(SIDS[0], far)])
        wait_until(lambda: SIDS[0] in books[1], 10, 0.05, "gw-1 to hear of gw-0's logout")
        books[1].add(SIDS[1], far)
        assert links[1].share([(SIDS[1], far)])
        wait_until(lambda: SIDS[1] in books[0], 10, 0.05, "gw-0 to hear of gw-1's logout")
        links[2].start()  # a replica that starts later: its hello gets both lists
        wait_until(lambda: SIDS[0] in books[2] and SIDS[1] in books[2], 20, 0.05, "gw-2 to learn the earlier logouts")
        assert SIDS[2] not in books[2]
    finally:
        for link in links:
            link.stop()


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, Path]]:
    """Two `vmsched gateway` processes on a private vhost, with the same tokens file and console secret."""
    tmp = tmp_path_factory.mktemp("console-replicas")
    tokens = tmp / "tokens.yaml"
    write_tokens(tokens, ("ops", TOKEN, "read"), ("ci", OTHER, "schedule"))
    with private_vhost("vmsched-test-console") as vhost:
        procs, urls = start_replicas(tmp, RABBIT_URL + vhost, tokens)
        try:
            yield urls[0], urls[1], tmp
        finally:
            for proc in procs:
                proc.kill(signal.SIGTERM)


def _log_in(client: httpx.Client) -> str:
    csrf = re.search(r'name="csrf" value="([^"]+)"', client.get("/login").text).group(1)  # type: ignore[union-attr]
    r = client.post("/login", data={"token": TOKEN, "csrf": csrf})
    assert r.status_code == 303, r.text
    return client.cookies[COOKIE]


def _status(base: str, session: str) -> int:
    return httpx.get(base + PAGE, headers={"Cookie": f"{COOKIE}={session}"}, timeout=10).status_code


def test_a_session_from_one_replica_works_on_the_other_until_logged_out(gateways: tuple[str, str, Path]) -> None:
    gw1, gw2, _ = gateways
    with httpx.Client(base_url=gw1, timeout=10) as browser, httpx.Client(base_url=gw1, timeout=10) as other:
        session, kept = _log_in(browser), _log_in(other)
        assert _status(gw2, session) == 404 and _status(gw2, kept) == 404  # authorised: "Decision not found"
        page = browser.get(PAGE)
        csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
        assert browser.post("/logout", data={"csrf": csrf}).status_code == 303
    assert _status(gw1, session) == 303
    wait_until(lambda: _status(gw2, session) == 303, 10, 0.05, "gw-2 to refuse the logged-out session")
    assert _status(gw2, kept) == 404, "the other session of the same token stays"
