"""Poison messages: a request whose handling kills its service runs at most N times (the default
--delivery-limit, 2), then is dead-lettered and answered with an error naming its units; every other
request is run and answered, even those a killed replica held; a killed replica that comes back never
runs it again (its in-flight journal).

Real processes on a private vhost of the shared RabbitMQ: a gateway and two scoring replicas, as the
test's user (root in CI) and as the unprivileged user nobody. The sandbox stops a plugin from killing
its own service, so the death comes from outside, as it does in a deployment when the kernel's OOM
killer picks the service or native code crashes it: a watcher thread (this test playing the kernel)
SIGKILLs the whole replica whose plugin worker is running the ``Poison`` unit, which marks its own
thread name while it runs. The test also plays the supervisor (systemd ``Restart=``, Kubernetes): it
restarts each killed replica with the same runtime directory.
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest
from kombu import Connection, Exchange, Producer

from tests.support.net import free_port
from tests.support.paths import ROOT
from tests.support.rabbit import RABBIT_URL, private_vhost
from tests.support.stack import SERVICE_QUEUES, TEST_ENV, Proc, Stack, bus_args
from tests.support.waiting import wait_until
from vmsched.bus.rabbitmq.client import AsyncBusClient
from vmsched.bus.options import BusOptions
from vmsched.bus.rabbitmq.journal import FIRST, SECOND, Journal
from vmsched.bus.rabbitmq.confirms import Confirms
from vmsched.bus.rabbitmq.poison import HOLD_SECONDS, LAST_CALL, PASSED_BY, SENT_BY, TURN, TURN_WAIT, HeldOutcome, HeldSecondChances, \
    PoisonTriage, Triage, Turns, Verdict
from vmsched.runtime.pool.process import descendants
from vmsched.bus.topology import DELIVERY_LIMIT, EXCHANGES, REQUEST_QUEUES, REQUESTS_EXCHANGE, dead_letter_queue, \
    request_queue
from vmsched.messages import Envelope, FilterReply, Op, request_units

MARK = "vmsched-poison"  # at most 15 bytes: the kernel's thread name
PLUGIN = f'''
import ctypes
import time


class Poison:
    """Marks its thread, then waits: the watcher kills the service handling it (a crash, an OOM kill)."""
    def do_filter(self, hosts, vm, args):
        ctypes.CDLL(None).prctl(15, b"{MARK}", 0, 0, 0)  # PR_SET_NAME
        time.sleep(8)
        return hosts  # reached only if nobody killed the service: the test then fails


class KeepAll:
    """Keeps every host."""
    def do_filter(self, hosts, vm, args):
        return hosts
'''
HOSTS = [str(uuid.UUID(int=i + 1)) for i in range(4)]
VM = str(uuid.UUID(int=99))


@pytest.fixture
def vhost() -> Iterator[str]:
    """A vhost of this test's own: the poisoned queues and their dead letters are seen by nobody else."""
    with private_vhost("vmsched-poison") as name:
        yield name


def _ancestors(pid: int) -> Iterator[int]:
    while pid > 1:
        yield pid
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return


def _comm(pid: int, tid: str) -> bytes:
    with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
        return f.read().strip()


class Kernel(threading.Thread):
    """Kills the replica (its whole process group) whose plugin worker runs the marked unit."""

    def __init__(self, replicas: list[Proc]) -> None:
        super().__init__(daemon=True)
        self.replicas = replicas
        self.kills: list[int] = []
        self.slots: list[str] = []  # the runtime directory of each killed replica: who came back
        self.errors: list[str] = []
        self.alone: list[int] = []  # replicas killed while no other replica was alive
        self.stop = threading.Event()

    def run(self) -> None:
        # only the live replicas' descendants, each thread of each: cheap enough to see the mark at once on a
        # loaded machine (a scan of all of /proc could take longer than the unit waits)
        while not self.stop.wait(0.02):
            for proc in list(self.replicas):
                if proc.popen is None or proc.popen.poll() is not None:
                    continue
                for pid in descendants(proc.popen.pid):
                    try:
                        if any(_comm(pid, tid) == MARK.encode() for tid in os.listdir(f"/proc/{pid}/task")):
                            self._kill_owner(pid)
                    except OSError:
                        continue  # the process is gone
                    except Exception as exc:  # noqa: BLE001 - reported by the test, never a silent dead watcher
                        self.errors.append(repr(exc))

    def _kill_owner(self, worker: int) -> None:
        chain = set(_ancestors(worker))
        for proc in list(self.replicas):
            if proc.popen is not None and proc.popen.pid in chain and proc.popen.poll() is None:
                if not any(p is not proc and p.popen is not None and p.popen.poll() is None for p in self.replicas):
                    self.alone.append(proc.popen.pid)
                self.kills.append(proc.popen.pid)
                self.slots.append(proc.args[-1])
                proc.kill()  # SIGKILL to the replica's process group, reaped
        try:
            os.kill(worker, signal.SIGKILL)  # in case it is in a process group of its own
        except ProcessLookupError:
            pass


def _consumers(vhost: str, queue: str) -> int:
    out = subprocess.run(["rabbitmqctl", "-q", "list_queues", "-p", vhost, "name", "consumers"],
                         check=True, capture_output=True, text=True).stdout
    return sum(int(line.split()[1]) for line in out.splitlines() if line.split()[:1] == [queue])


SYSTEM_PYTHON = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
SITE = ROOT / ".venv" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
AS_NOBODY = ["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups", str(SYSTEM_PYTHON)]


def _users() -> list[Any]:
    """Who the replicas run as: the test's user (root in CI: plugin workers switch to nobody) and nobody."""
    why = (f"starting the replicas as nobody needs root, setpriv, {SYSTEM_PYTHON} and the venv at {SITE} "
           "(a Python and packages nobody can read)")
    possible = os.geteuid() == 0 and shutil.which("setpriv") and SYSTEM_PYTHON.exists() and SITE.is_dir()
    return [pytest.param(None, id="test-user"),
            pytest.param(AS_NOBODY, id="unprivileged-nobody", marks=pytest.mark.skipif(not possible, reason=why))]


@dataclass
class Replica(Proc):
    """A scoring replica, as the test's user or through ``prefix`` (setpriv: another user)."""

    prefix: list[str] | None = None

    def start(self) -> "Replica":
        if self.prefix is None:
            super().start()
            return self
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(SITE)]), **TEST_ENV, **self.env}  # (plugin workers)
        env.pop("VMSCHED_TOKENS_FILE", None)  # root's, unreadable by nobody; a replica needs none
        # the venv's packages through site.addsitedir, so that its .pth files (the editable install) count
        main = (f"import runpy, site; site.addsitedir({str(SITE)!r}); "
                "runpy.run_module('vmsched.cli', run_name='__main__', alter_sys=True)")
        self.popen = subprocess.Popen([*self.prefix, "-P", "-c", main, *self.args], cwd="/", env=env,
                                      stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        return self


def _for(folder: Path, user: list[str] | None) -> None:
    """Give ``folder`` (and what is in it) to nobody when the replicas run as nobody."""
    if user is not None:
        for path in [folder, *folder.rglob("*")]:
            os.chown(path, pwd.getpwnam("nobody").pw_uid, -1)


@pytest.mark.rabbitmq
@pytest.mark.parametrize("user", _users())
def test_a_request_that_kills_its_service_gets_at_most_n_deliveries_then_an_error(vhost: str, user: list[str] | None):
    base = Path(tempfile.mkdtemp(prefix="vmsched-poison-"))
    base.chmod(0o755)
    plugins = base / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(PLUGIN)
    url = RABBIT_URL + vhost
    port = free_port()
    gateway = Proc(["gateway", "--port", str(port), "--request-timeout", "60", *bus_args(base, url)],
                   base / "gateway.log", env={"VMSCHED_AMQP_URL": ""}).start()
    secrets = base / "replicas"
    secrets.mkdir(mode=0o700)
    replica_args = ["scoring", "--plugins", str(plugins), "--pool-size", "2",
                    *bus_args(secrets, url)]  # the default --delivery-limit: 2
    runtime = [base / "run-0", base / "run-1"]  # each replica's runtime directory, kept across its restarts
    for path in runtime:
        path.mkdir(mode=0o700)
    _for(secrets, user)
    _for(runtime[0], user)
    _for(runtime[1], user)
    started = 0

    def replica(k: int) -> Replica:
        nonlocal started
        started += 1
        return Replica([*replica_args, "--runtime-dir", str(runtime[k])], base / f"scoring-{k}-{started}.log",
                       env={"VMSCHED_AMQP_URL": ""}, prefix=user).start()

    replicas = [replica(0), replica(1)]
    stack = Stack(port, plugins, [gateway, *replicas])
    kernel = Kernel(replicas)
    filter_queue = REQUEST_QUEUES[Op.FILTER]
    try:
        stack.wait_ready(queues=SERVICE_QUEUES["scoring"])
        wait_until(lambda: _consumers(vhost, filter_queue) == 2, 60, 0.2, "both replicas consuming (one channel each)")
        if user is not None:
            assert {_uid(p.popen.pid) for p in replicas if p.popen} == {pwd.getpwnam("nobody").pw_uid}
        kernel.start()
        with ThreadPoolExecutor(12) as pool:
            poisoned = pool.submit(stack.xmlrpc, "runFilters", ["Poison"], HOSTS, VM, {})
            others = [pool.submit(stack.xmlrpc, "runFilters", ["KeepAll"], HOSTS[: 1 + i % 4], VM, {})
                      for i in range(10)]

            def supervise() -> None:  # a killed replica comes back (systemd Restart=, Kubernetes), same runtime dir
                for k, proc in enumerate(replicas):
                    if proc.popen is not None and proc.popen.poll() is not None:
                        replicas[k] = replica(k)
                        stack.procs.append(replicas[k])

            while not poisoned.done():
                supervise()
                time.sleep(0.1)
            reply = poisoned.result()
            answers = [f.result() for f in others]
        kernel.stop.set()
        kernel.join(5)
        supervise()  # the last kill may come just before the error reply
        # at most N deliveries that ran it, so at most N replicas killed; then one error reply naming the unit
        assert not kernel.errors and 1 <= len(kernel.kills) <= 2, (kernel.errors, kernel.kills, reply)
        # a second chance waits for another replica: no kill ever took the last replica alive
        assert not kernel.alone, (kernel.alone, kernel.kills)
        # the replica that died and came back (same runtime directory) never ran it again
        assert len(set(kernel.slots)) == len(kernel.slots), kernel.slots
        assert reply["result"] == HOSTS  # the engine's fallback: every host, at once
        (error,) = reply["errors"]
        assert "dead-lettered" in error and "units: Poison" in error, error
        # every other request was run and answered, even those the killed replicas held
        for i, answer in enumerate(answers):
            assert answer == {"result_code": 0, "result": HOSTS[: 1 + i % 4], "plugin_errors": {}, "errors": []}, \
                (i, answer)
        # the replicas serve on: later requests are all run
        wait_until(lambda: _consumers(vhost, filter_queue) == 2, 60, 0.2, "both replicas consuming again")
        for n in range(1, 5):
            assert stack.xmlrpc("runFilters", ["KeepAll"], HOSTS[:n], VM, {}) == {
                "result_code": 0, "result": HOSTS[:n], "plugin_errors": {}, "errors": []}
        logs = "".join(p.output() for p in stack.procs)
        assert "dead-lettered on vmsched.filter.v2" in logs
        print(f"kills {len(kernel.kills)} (slots {kernel.slots}); second chances {logs.count('second chance, alone')}; "
              f"refused after a restart {logs.count('and was restarted')}; passed on {logs.count('is left to another')}")
    except BaseException:
        print(f"logs kept in {base}")
        raise
    else:
        shutil.rmtree(base, ignore_errors=True)
    finally:
        kernel.stop.set()
        for proc in stack.procs:
            proc.kill()


def _uid(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


KILLS_TWICE_DEADLINE = 20  # the gateway's --request-timeout, seconds


@pytest.mark.rabbitmq
def test_a_request_that_kills_twice_takes_no_innocent_with_it(vhost: str, tmp_path: Path):
    """Three replicas, none restarted. The poisoned request kills the replica that runs it among others, then
    the one that runs its second chance; the requests held beside it are answered by the last replica with their
    results, and the poisoned one with an error naming its unit, all by their deadline."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(PLUGIN)
    url = RABBIT_URL + vhost
    port = free_port()
    gateway = Proc(["gateway", "--port", str(port), "--request-timeout", str(KILLS_TWICE_DEADLINE),
                    *bus_args(tmp_path, url)], tmp_path / "gateway.log", env={"VMSCHED_AMQP_URL": ""}).start()
    replicas = [Proc(["scoring", "--plugins", str(plugins), "--pool-size", "2",
                      "--runtime-dir", str(tmp_path / f"run-{k}"), *bus_args(tmp_path, url)],
                     tmp_path / f"scoring-{k}.log", env={"VMSCHED_AMQP_URL": ""}).start() for k in range(3)]
    stack = Stack(port, plugins, [gateway, *replicas])
    kernel = Kernel(replicas)
    try:
        stack.wait_ready(queues=SERVICE_QUEUES["scoring"])
        wait_until(lambda: _consumers(vhost, REQUEST_QUEUES[Op.FILTER]) == 3, 60, 0.2, "three replicas consuming")
        kernel.start()

        def timed(*params: Any) -> tuple[float, Any]:
            started = time.monotonic()
            reply = stack.xmlrpc("runFilters", *params)
            return time.monotonic() - started, reply

        with ThreadPoolExecutor(12) as pool:
            poisoned = pool.submit(timed, ["Poison"], HOSTS, VM, {})
            others = [pool.submit(timed, ["KeepAll"], HOSTS[: 1 + i % 4], VM, {}) for i in range(10)]
            seconds, reply = poisoned.result(timeout=KILLS_TWICE_DEADLINE + 30)
            answers = [f.result(timeout=KILLS_TWICE_DEADLINE + 30) for f in others]
        kernel.stop.set()
        kernel.join(5)
        assert not kernel.errors and len(kernel.kills) == 2, (kernel.errors, kernel.kills, reply)
        assert not kernel.alone, (kernel.alone, kernel.kills)  # never the last replica alive
        assert reply["result"] == HOSTS and seconds <= KILLS_TWICE_DEADLINE + 1, (seconds, reply)
        (error,) = reply["errors"]
        assert "second chance also ended with the death" in error and "units: Poison" in error, error
        for i, (took, answer) in enumerate(answers):
            assert answer == {"result_code": 0, "result": HOSTS[: 1 + i % 4], "plugin_errors": {}, "errors": []}, \
                (i, answer, took)
            assert took <= KILLS_TWICE_DEADLINE + 1, (i, took)
        logs = "".join(p.output() for p in stack.procs)
        print(f"poisoned answered in {seconds:.1f} s; others in {max(t for t, _ in answers):.1f} s at most; "
              f"turns declined {logs.count('turn declined')}")
    finally:
        kernel.stop.set()
        for proc in stack.procs:
            proc.kill()


@pytest.mark.rabbitmq
def test_one_death_of_a_service_process_counts_one_delivery(vhost: str, tmp_path: Path):
    """A replica with 4 handler threads dies holding a request: the broker returns it counted once (one
    channel per process), not once per consumer channel of the dead process (what made a default of 2 unsafe)."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "poison.py").write_text(PLUGIN)
    url = RABBIT_URL + vhost
    queue = REQUEST_QUEUES[Op.FILTER]
    with Connection(url) as conn:
        channel = conn.default_channel
        for exchange in EXCHANGES:
            Exchange(exchange.name, exchange.type, durable=True)(channel).declare()
        request_queue(queue)(channel).declare()
        dead_letter_queue(queue)(channel).declare()  # so that nothing dead-lettered is dropped
        counts = []
        for attempt in range(2):
            replica = Proc(["scoring", "--plugins", str(plugins), "--pool-size", "2", "--consumers", "4",
                            "--runtime-dir", str(tmp_path / f"run-{attempt}"),
                            *bus_args(tmp_path, url)], tmp_path / f"scoring-{attempt}.log",
                           env={"VMSCHED_AMQP_URL": ""}).start()
            kernel = Kernel([replica])
            try:
                wait_until(lambda: _consumers(vhost, queue) >= 1, 60, 0.2, "the replica consuming")
                kernel.start()
                envelope = Envelope(op="filter", deadline=time.time() + 60,
                                    body={"units": ["Poison"], "hosts": HOSTS, "vm": VM})
                Producer(channel).publish(envelope.model_dump_json(), exchange=REQUESTS_EXCHANGE.name,
                                          routing_key=queue, content_type="application/json",
                                          correlation_id=f"count-{attempt}")
                wait_until(lambda: kernel.kills, 60, 0.05, "the replica killed while it handles the request")
                dead = dead_letter_queue(queue).name  # where it goes if the one death counted more than once
                back = wait_until(lambda: [(q, m) for q in (queue, dead) for m in [channel.basic_get(q, no_ack=True)] if m],
                                  30, 0.1, "the request back on a queue")
                where, returned = back[0]
                counts.append((returned.headers or {}).get("x-delivery-count") if where == queue else "dead-lettered")
            finally:
                kernel.stop.set()
                replica.kill()
        assert counts == [1, 1], counts


def test_the_units_of_a_request_are_named_whatever_its_operation():
    assert request_units({"units": ["A", "B"], "hosts": []}) == ["A", "B"]  # filter
    assert request_units({"units": [{"name": "S", "factor": 2}]}) == ["S"]  # score
    assert request_units({"unit": "Bal", "hosts": []}) == ["Bal"]  # balance
    assert request_units({}) == [] and request_units({"units": "not a list", "unit": 5}) == []


JOURNAL_CHILD = """
import os, signal, sys
from pathlib import Path
from vmsched.bus.rabbitmq.journal import Journal
journal = Journal(Path(sys.argv[1]), "scoring", 2)
journal.begin(0, "done-1")
journal.end(0)
journal.begin(1, "poisoned-2")
print(journal.path, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # dies handling poisoned-2
"""


def test_the_journal_tells_a_restarted_process_what_its_killed_predecessor_was_handling(tmp_path: Path):
    directory = tmp_path / "run" / "journal"
    child = subprocess.run([sys.executable, "-c", JOURNAL_CHILD, str(directory)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert child.returncode == -signal.SIGKILL, child.stderr
    journal = Journal(directory, "scoring", 2)  # the restarted process takes the file its predecessor left
    try:
        assert str(journal.path) == child.stdout.strip()
        assert journal.blame("poisoned-2") == (FIRST, True)  # it was handling that one alone
        assert journal.blame("done-1") is None and journal.blame(None) is None
        assert (directory.stat().st_mode & 0o777) == 0o700
    finally:
        journal.close()
    assert Journal(directory, "scoring", 2).found == {}  # read once: the next process starts clean


def test_journal_records_several_at_a_death_replicas_own_files_and_a_shared_directory_is_refused(tmp_path: Path):
    directory = tmp_path / "journal"
    first = Journal(directory, "balancer", 3)
    first.begin(0, "a")
    first.begin(2, "b", SECOND)
    second = Journal(directory, "balancer", 3)  # a replica alive beside it takes another file
    assert second.path != first.path and second.found == {}
    first.close()  # as a death does: the lock goes, the records stay
    third = Journal(directory, "balancer", 3)
    assert third.path == first.path
    assert third.found == {"a": (FIRST, False), "b": (SECOND, False)}  # not alone: a bystander may be among them
    second.close()
    third.close()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(OSError, match="writable only by it"):
        Journal(shared, "balancer", 1)


class _Message:
    """What the worker reads of a delivered message (kombu's Message), and what it does to it."""

    def __init__(self, cid: str, headers: dict[str, Any] | None = None, redelivered: bool = False,
                 left: float = 30.0, channel: object = None) -> None:
        self.properties = {"correlation_id": cid, "reply_to": "vmsched.reply.x"}
        self.headers = headers or {}
        self.delivery_info = {"redelivered": redelivered}
        self.channel = channel
        self.body = Envelope(op="filter", deadline=time.time() + left, body={"units": ["U"], "hosts": []}).model_dump_json()
        self.content_type, self.content_encoding = "application/json", "utf-8"
        self.acked = False

    def ack(self) -> None:
        self.acked = True


def test_triage_of_requests_that_were_in_a_dead_process(tmp_path: Path):
    """Which requests run, get a second chance, are passed on or are refused (no broker: the decisions alone)."""
    directory = tmp_path / "journal"
    dead = Journal(directory, "scoring", 3)
    dead.begin(0, "among-1")
    dead.begin(1, "among-2")
    dead.close()  # died handling two requests at once
    journal = Journal(directory, "scoring", 3)
    triage = PoisonTriage("scoring", DELIVERY_LIMIT, journal)
    queue, rejected = REQUEST_QUEUES[Op.FILTER], [{"reason": "rejected"}]
    run, to_second_chance = Triage(Verdict.RUN), Triage(Verdict.TO_SECOND_CHANCE)
    second_chance, pass_on = Triage(Verdict.SECOND_CHANCE), Triage(Verdict.PASS_ON)
    hold = Triage(Verdict.HOLD)
    try:
        assert triage.decide(queue, False, _Message("fresh")) == run and run.journal_kind == FIRST
        assert triage.decide(queue, False, _Message("held", {"x-delivery-count": 1})) == to_second_chance
        assert triage.decide(queue, False, _Message("among-1")) == to_second_chance  # among those of the death
        assert triage.decide(queue, True, _Message("held", {"x-death": rejected})) == hold
        # the service puts it on its dead-letter queue itself (the broker's dead-lettering may drop it)
        published: list[dict[str, Any]] = []
        sink = SimpleNamespace(publish=lambda body, **kw: published.append(kw))
        message = _Message("held", {"x-delivery-count": 1, "x-other": "kept"})
        triage.to_second_chance(queue, message, sink)  # type: ignore[arg-type]
        copy = published.pop()
        assert not message.acked and copy["exchange"] == "vmsched.dead" and copy["routing_key"] == queue
        assert copy["headers"][SENT_BY] and copy["headers"]["x-other"] == "kept"
        assert copy["correlation_id"] == "held" and copy["reply_to"] == "vmsched.reply.x"
        assert triage.decide(queue, True, _Message("held", copy["headers"])) == hold
        # its turn: marked running, run by whoever receives it
        message = _Message("held", {"x-death": rejected, "x-delivery-count": 1})  # a death returned it while held
        assert triage.decide(queue, True, message) == hold
        triage.give_turn(queue, message, sink)  # type: ignore[arg-type]
        turn = published.pop()
        # acknowledged by the worker once the copy is confirmed (Confirms), not here
        assert not message.acked and turn["headers"][TURN] and "x-delivery-count" not in turn["headers"]
        assert turn["exchange"] == "vmsched.dead" and turn["routing_key"] == queue
        assert triage.decide(queue, True, _Message("held", turn["headers"])) == second_chance
        assert second_chance.journal_kind == SECOND
        # a turn that comes back from a death was running: refused
        why = triage.decide(queue, True, _Message("held", turn["headers"], redelivered=True))
        assert why.verdict is Verdict.REFUSE and "second chance also ended with the death" in why.why
        why = triage.decide(queue, True, _Message("held", {**turn["headers"], "x-delivery-count": 1}))
        assert why.verdict is Verdict.REFUSE
        # a turn that came while another ran here goes back unmarked: held again
        triage.decline_turn(queue, _Message("held", turn["headers"]), sink)  # type: ignore[arg-type]
        assert TURN not in published[-1]["headers"]
        assert triage.decide(queue, True, _Message("held", published.pop()["headers"])) == hold
        why = triage.decide(queue, True, _Message("limit", {"x-death": [{"reason": "delivery_limit"}]}))
        assert why.verdict is Verdict.REFUSE and "each of its deliveries" in why.why
        # a second chance of what the predecessor was handling among others: another replica's, unless it came back
        assert triage.decide(queue, True, _Message("among-2", {"x-death": rejected})) == pass_on
        message = _Message("among-2", {"x-death": rejected})
        triage.pass_on(queue, message, sink)  # type: ignore[arg-type]
        assert not message.acked and published[0]["headers"][PASSED_BY] == [journal.identity]
        assert published[0]["exchange"] == "vmsched.dead" and published[0]["routing_key"] == queue
        for passes in (1, 2):  # it came back (the broker may hand it to the same replica): passed on again
            back = _Message("among-2", published[-1]["headers"])
            assert triage.decide(queue, True, back) == pass_on
            triage.pass_on(queue, back, sink)  # type: ignore[arg-type]
        assert published[-1]["headers"][PASSED_BY] == [journal.identity] * 3
        back = _Message("among-2", published[-1]["headers"])
        assert triage.decide(queue, True, back) == hold  # no other replica took it: held here for its turn
    finally:
        journal.close()
    alone = Journal(directory, "scoring", 3)  # this one dies handling one request alone
    alone.begin(2, "alone-3", SECOND)
    alone.close()
    journal = Journal(directory, "scoring", 3)
    try:
        why = PoisonTriage("scoring", DELIVERY_LIMIT, journal).decide(queue, False, _Message("alone-3"))
        assert why.verdict is Verdict.REFUSE and "died handling it in its second chance and was restarted" in why.why
    finally:
        journal.close()


def test_held_second_chances_are_decided_together_and_take_turns_one_at_a_time():
    """No broker: the decisions alone. Second chances held together share one wait for another replica, bounded
    by half the time left before each deadline; one turn at a time; one that cannot run in time is answered."""
    channel, queue = object(), REQUEST_QUEUES[Op.FILTER]
    alone = lambda name: False  # noqa: E731 - no other replica consumes the queue
    held = HeldSecondChances(check=0.0)
    soon, later = _Message("soon", left=60.0, channel=channel), _Message("later", left=90.0, channel=channel)
    late, gone = _Message("late", left=LAST_CALL / 2, channel=channel), _Message("gone", channel=object())
    for message in (later, soon, late, gone):
        held.hold(queue, message)
    decided = held.due(channel, alone, turn_free=True)
    assert [(m, d) for _, m, d in decided] == [(late, HeldOutcome.LATE)]  # gone (its channel closed): dropped
    assert held.due(channel, alone, turn_free=True) == []  # both wait for another replica (HOLD_SECONDS)
    # another replica consumes: the nearest deadline first, one turn at a time
    assert [(m, d) for _, m, d in held.due(channel, lambda name: True, turn_free=True)] == [(soon, HeldOutcome.TURN)]
    assert held.due(channel, lambda name: True, turn_free=False) == []  # a turn runs here: the next one waits
    assert [(m, d) for _, m, d in held.due(channel, lambda name: True, turn_free=True)] == [(later, HeldOutcome.TURN)]
    assert not held
    # alone, the wait is bounded by half the time left before the deadline (and HOLD_SECONDS for the queue)
    started, short = time.monotonic(), _Message("short", left=2.8, channel=channel)
    held.hold(queue, short)
    held.hold(queue, _Message("long", left=2 * HOLD_SECONDS + 60, channel=channel))
    while not (turn := held.due(channel, alone, turn_free=True)):
        assert time.monotonic() - started < 2.8 - LAST_CALL, "no turn before its deadline"
        time.sleep(0.02)
    assert turn == [(queue, short, HeldOutcome.TURN)] and time.monotonic() - started >= 1.4 - 0.05
    assert held.due(channel, alone, turn_free=True) == [] and held  # 'long' waits for its queue's wait (15 s)

    turns = Turns()
    assert turns.free
    turns.given()
    assert not turns.free  # until its turn comes back, or TURN_WAIT
    first, second = _Message("first"), _Message("second")
    assert turns.arrived(first) and not turns.free
    assert not turns.arrived(second)  # declined: another runs here
    turns.finished(second)
    assert not turns.free
    turns.finished(first)
    assert turns.free and TURN_WAIT > 0


class _Channel:
    """What Confirms uses of a channel: confirm mode and the confirm events."""

    def __init__(self) -> None:
        self.confirming = False
        self.events: dict[str, set[Any]] = {"basic_ack": set(), "basic_nack": set()}

    def confirm_select(self) -> None:
        self.confirming = True

    def confirm(self, kind: str, tag: int, multiple: bool = False) -> None:
        for callback in self.events[kind]:
            callback(tag, multiple)


def test_a_request_is_acknowledged_once_its_reply_is_confirmed():
    refused: list[_Message] = []
    channel = _Channel()
    acks = Confirms(on_ack=lambda messages: [m.ack() for m in messages], on_nack=refused.extend)
    acks.watch(channel)  # type: ignore[arg-type]
    first, second, third, fourth = (_Message(f"m{i}") for i in range(4))
    acks.published(first)  # tag 1
    acks.published(None)  # tag 2: an event, nothing waits for it
    acks.published(second)  # tag 3
    acks.published(third)  # tag 4
    assert channel.confirming and not any(m.acked for m in (first, second, third)) and len(acks) == 3
    channel.confirm("basic_ack", 3, multiple=True)
    assert first.acked and second.acked and not third.acked
    channel.confirm("basic_ack", 4)
    assert third.acked and not refused and len(acks) == 0
    acks.published(fourth)  # tag 5: refused, never acknowledged: the worker takes a new connection
    channel.confirm("basic_nack", 5)
    assert refused == [fourth] and not fourth.acked and len(acks) == 0
