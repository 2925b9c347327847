"""How tests/support/rabbit_private.py chooses and holds a private node's ports and reads a port clash from its log (no
RabbitMQ needed), and what a node does when a port is taken all the same (private nodes: needs rabbitmq-server)."""

from __future__ import annotations

import socket

import pytest

import tests.support.rabbit_private as rp
from tests.support.rabbit_private import CTL_DIST_PORTS, SHARED_PORTS, PrivateRabbit, available, hold_port, ports_in_use

no_rabbitmq = pytest.mark.skipif(available() is not None, reason=str(available()))

# Lines as RabbitMQ 3.10.8 wrote them here when a port was taken before the node started.
DIST_CLASH = ('Kernel pid terminated (application_controller) ({application_start_failure,rabbitmq_prelaunch,'
              '{{shutdown,{failed_to_start_child,prelaunch,{dist_port_already_used,40917,not_erlang,"localhost"}}},'
              '{rabbit_prelaunch_app,start,[normal,[]]}}})')
AMQP_CLASH = ('2026-12-01 01:40:39.997690+00:00 [error] <0.661.0>     reason: '
              '{listen_error,{acceptor,{127,0,0,1},41741},eaddrinuse}')


def test_ports_held_at_once_all_differ_and_are_neither_the_cli_tools_nor_the_shared_ones():
    held = [hold_port() for _ in range(300)]
    try:
        ports = [s.getsockname()[1] for s in held]
        assert len(set(ports)) == len(ports)
        assert not set(ports) & (set(CTL_DIST_PORTS) | SHARED_PORTS)
    finally:
        for s in held:
            s.close()


def test_a_held_port_is_refused_to_a_plain_bind_but_a_reuseaddr_listener_may_take_it():
    held = hold_port()
    port = held.getsockname()[1]
    try:
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))
        with socket.socket() as node:  # what the node's listeners do (they set SO_REUSEADDR)
            node.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            node.bind(("127.0.0.1", port))
            node.listen()
    finally:
        held.close()


class _Offered:
    """A stand-in for socket.socket whose bind to port 0 gets the next port of a fixed list."""

    offers: list[int] = []
    closed: list[int] = []

    def __init__(self) -> None:
        self.port = 0

    def setsockopt(self, *args: object) -> None:
        pass

    def bind(self, address: tuple[str, int]) -> None:
        self.port = _Offered.offers.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        _Offered.closed.append(self.port)


def test_hold_port_passes_over_the_cli_tools_range_the_shared_ports_and_those_to_avoid(monkeypatch):
    monkeypatch.setattr(rp.socket, "socket", _Offered)
    _Offered.offers, _Offered.closed = [CTL_DIST_PORTS[3], 5672, 40001, 40003, 40005], []
    s = hold_port(avoid={40001})
    assert s.getsockname()[1] == 40003
    assert sorted(_Offered.closed) == sorted([CTL_DIST_PORTS[3], 5672, 40001])  # held until then, then let go
    _Offered.offers = [40001] * 100
    with pytest.raises(RuntimeError, match="no free port"):
        hold_port(avoid={40001})


def test_a_port_clash_is_read_from_the_log_only_for_the_nodes_own_ports():
    own = {"port": 41741, "dist_port": 40917, "tls_port": None}
    assert ports_in_use(DIST_CLASH, own) == {"dist_port"}
    assert ports_in_use(AMQP_CLASH, own) == {"port"}
    assert ports_in_use(DIST_CLASH + "\n" + AMQP_CLASH, own) == {"port", "dist_port"}
    assert ports_in_use(AMQP_CLASH, {"port": 41743, "dist_port": 40917}) == set()  # someone else's port
    assert ports_in_use("BOOT FAILED\n{error,{timeout_waiting_for_tables,[rabbit_user]}}", own) == set()


@pytest.mark.rabbitmq
def test_a_new_node_holds_distinct_ports_and_keeps_the_ones_it_is_given(tmp_path):
    node = PrivateRabbit(tmp_path / "a")
    given = PrivateRabbit(tmp_path / "b", dist_port=node.dist_port + 2)
    try:
        assert len({node.port, node.dist_port, given.port}) == 3
        assert given.dist_port == node.dist_port + 2
        with socket.socket() as other, pytest.raises(OSError):  # held: no one else gets it before the node listens
            other.bind(("127.0.0.1", node.port))
    finally:
        node.release_ports()
        given.release_ports()
    with socket.socket() as other:  # released
        other.bind(("127.0.0.1", node.port))


@pytest.mark.rabbitmq
def test_a_failure_says_the_vms_last_word_and_the_log_tail(tmp_path):
    node = PrivateRabbit(tmp_path)
    node.release_ports()
    (tmp_path / "server.out").write_text("\n".join(["BOOT FAILED", DIST_CLASH, *(f"line {i}" for i in range(50))]))
    message = node.failure("exited while starting (status 0)")
    assert message.startswith(f"private RabbitMQ {node.node} exited while starting (status 0); {DIST_CLASH}\nlog tail:")
    assert message.endswith("line 49") and "line 19" not in message


def _take(port: int) -> socket.socket:
    """Another program listening on ``port`` (with SO_REUSEADDR, as it may while the helper only holds the port)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


@pytest.mark.rabbitmq
@no_rabbitmq
def test_a_node_whose_chosen_port_was_taken_is_relaunched_once_with_fresh_ports(tmp_path, capsys):
    node = PrivateRabbit(tmp_path / "node")
    first = node.dist_port
    with _take(first):
        try:
            node.start(90)
            assert node.dist_port != first and node.relaunched.endswith(f"because its dist_port {first} was in use")
            assert "dist_port_already_used" in (tmp_path / "node" / "first-launch" / "server.out").read_text()
            assert f"dist_port {first} was in use: relaunched" in capsys.readouterr().err
            node.ctl("status")
        finally:
            node.stop()
    assert node.proc is not None and node.proc.poll() is not None


@pytest.mark.rabbitmq
@no_rabbitmq
def test_a_node_whose_given_port_is_taken_fails_with_its_log_and_is_not_relaunched(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    node = PrivateRabbit(tmp_path / "node", dist_port=port)
    with _take(port):
        try:
            with pytest.raises(RuntimeError, match=rf"(?s)exited while starting .* dist_port {port} was in use; "
                                                   r"Kernel pid terminated .*dist_port_already_used.*\nlog tail:\n"
                               ) as failure:
                node.start(90)
        finally:
            node.stop()
    assert not node.relaunched and "fresh ports" not in str(failure.value)
    assert not (tmp_path / "node" / "first-launch").exists()
    assert node.proc is not None and node.proc.poll() is not None
