"""A console logout reaches the other gateway replicas when the bus was away, or lost under the publisher.

On a private RabbitMQ node with the least-privilege users of deploy/rabbitmq/setup-users.sh (this module's
own: the test stops and starts it; the shared broker is never stopped):

- the broker closes the connection a replica publishes its logouts on: the next logout still reaches the
  other replica (it is confirmed, and sent again on a new connection);
- two real `vmsched gateway` processes: a session made on one is logged out on it while the node is down;
  within 5 s of the node's return, the other replica refuses that session too.
"""

from __future__ import annotations

import re
import signal
import socket
import time
from pathlib import Path

import httpx
import pytest

from tests.gateway.console.test_sessions import TOKEN, write_tokens
from tests.support.broker_users import broker, url  # noqa: F401 - the broker fixture
from tests.support.rabbit_private import PrivateRabbit
from tests.support.stack import console_login, start_replicas
from tests.support.waiting import wait_until
from vmsched.bus.options import BusOptions
from vmsched.bus.transport import open_transport
from vmsched.gateway.console.logouts import LogoutLink
from vmsched.gateway.console.sessions import COOKIE, Logouts

pytestmark = pytest.mark.rabbitmq

PAGE = "/console/decisions/" + "0" * 32
SIDS = [f"session{i:015d}" for i in range(3)]
#: how soon after the node's return the other replica must refuse the session, seconds
SHARED_WITHIN = 5.0


def _connections(node: PrivateRabbit) -> set[str]:
    """The pids of the gateway user's connections."""
    out = node.ctl("list_connections", "pid", "user").stdout
    return {row[0] for row in (line.split("\t") for line in out.splitlines()) if row[-1] == "vmsched-gateway"}


def _consuming(node: PrivateRabbit) -> set[str]:
    """The pids of the connections with a consumer (a subscription's; a publisher's has none)."""
    out = node.ctl("list_channels", "connection", "consumer_count").stdout
    return {row[0] for row in (line.split("\t") for line in out.splitlines()) if row[-1].isdigit() and int(row[-1])}


def test_a_logout_after_the_broker_closed_the_publishers_connection_arrives(broker) -> None:  # noqa: F811
    node, secrets = broker
    transport = open_transport(BusOptions(url=url(secrets, "vmsched-gateway"), connect_timeout=2.0))
    books = [Logouts(), Logouts()]
    links = [LogoutLink(transport, f"gw-{i}", book) for i, book in enumerate(books)]
    far = 2**40
    try:
        links[0].start()
        assert links[0].ready.wait(20), "gw-0 did not subscribe"
        first = wait_until(lambda: _connections(node), 20, 0.2, "gw-0's connections")
        links[1].start()
        assert links[1].ready.wait(20), "gw-1 did not subscribe"
        both = wait_until(lambda: len(_connections(node)) > len(first) and _connections(node), 20, 0.2,
                          "gw-1's connections")
        assert links[0].share([(SIDS[0], far)])  # gw-0's publisher connection is open now
        wait_until(lambda: SIDS[0] in books[1], 10, 0.05, "gw-1 to hear of the first logout")
        gw0 = first | (_connections(node) - both)
        [publisher] = gw0 - _consuming(node)

        node.ctl("close_connection", publisher, "closed by the test")  # the subscriptions stay
        assert links[0].share([(SIDS[1], far)])
        wait_until(lambda: SIDS[1] in books[1], 5, 0.05, "gw-1 to hear of the logout made after the close")
    finally:
        for link in links:
            link.stop()


def _status(base: str, session: str) -> int:
    return httpx.get(base + PAGE, headers={"Cookie": f"{COOKIE}={session}"}, timeout=10).status_code


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_a_logout_during_an_outage_is_shared_soon_after_the_broker_returns(broker, tmp_path: Path) -> None:  # noqa: F811
    node, secrets = broker
    tokens = tmp_path / "tokens.yaml"
    write_tokens(tokens, ("ops", TOKEN, "read"))
    procs, (gw1, gw2) = start_replicas(tmp_path, url(secrets, "vmsched-gateway"), tokens)
    try:
        with httpx.Client(base_url=gw1, timeout=10) as browser:
            assert console_login(browser, TOKEN).status_code == 303
            session = browser.cookies[COOKIE]
            assert _status(gw2, session) == 404  # authorised there too: "Decision not found"

            node.stop()  # the broker goes away: both replicas lose their connections
            page = browser.get(PAGE)
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
            assert browser.post("/logout", data={"csrf": csrf}).status_code == 303
        assert _status(gw1, session) == 303  # refused where it was logged out
        assert _status(gw2, session) == 404  # the other replica cannot have heard of it

        node.launch()  # the same node: its ports, users and data
        wait_until(lambda: _listening(node.port), 120, 0.05, "the node to listen again")
        back = time.monotonic()
        wait_until(lambda: _status(gw2, session) == 303, SHARED_WITHIN + 60, 0.05,
                   "gw-2 to refuse the session logged out on gw-1")
        took = time.monotonic() - back
        assert took <= SHARED_WITHIN, f"gw-2 refused the session only {took:.1f} s after the broker returned"
        node.wait_started()
    finally:
        for proc in procs:
            proc.kill(signal.SIGTERM)
