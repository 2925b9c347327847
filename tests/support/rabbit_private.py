"""Private RabbitMQ nodes for tests that must not disturb the shared broker.

Each node has its own node name, AMQP port, distribution port, data and log
folders, ``enabled_plugins`` file and config file, and is torn down
afterwards (``stop()``, or the context manager). It never reads
``/etc/rabbitmq``. Optionally it also listens with TLS (``tls=TlsFiles``).
Tests that kill, cut or reconfigure a broker use one of these; the shared
broker on 127.0.0.1:5672 is only ever used through a private vhost.

    with PrivateRabbit.start_new(tmp_path) as node:
        node.ctl("add_user", "gw", "secret")
        url = node.url("gw", "secret")

:class:`PrivateCluster` joins several such nodes (a shared Erlang cookie,
``rabbitmqctl join_cluster``) into one RabbitMQ cluster on this machine.
A node's ports are held (:func:`hold_port`) from its creation until it listens;
a first launch that exits because one was in use all the same is relaunched once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from tests.support.rabbit_ports import CTL_DIST_PORTS, SHARED_PORTS, PortInUse, hold_port, ports_in_use  # noqa: F401


#: The real scripts, not Debian's wrappers in /usr/sbin (those switch to the rabbitmq user, who cannot
#: write a test's private folders).
LIB_BIN = Path("/usr/lib/rabbitmq/bin")


def tool(name: str) -> str:
    path = LIB_BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def available() -> str | None:
    """None when private nodes can be started here, else why not."""
    if not (LIB_BIN / "rabbitmq-server").exists() and shutil.which("rabbitmq-server") is None:
        return "rabbitmq-server is not installed (scripts/rabbitmq-ensure installs it)"
    return None


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS listener: the CA that signed the server and client certificates."""

    ca: Path
    cert: Path
    key: Path
    verify_peer: bool = True  # ask for (and verify) a client certificate
    fail_if_no_peer_cert: bool = False


@dataclass
class PrivateRabbit:
    base: Path
    name: str = field(default_factory=lambda: f"vmsched-test-{uuid.uuid4().hex[:8]}")
    port: int = 0  # 0: a port held here until the node listens (hold_port)
    dist_port: int = 0  # likewise
    tls: TlsFiles | None = None
    tls_port: int | None = None  # with tls, None: likewise
    plugins: tuple[str, ...] = ()
    extra_config: tuple[str, ...] = ()
    cookie: str | None = None  # the Erlang cookie (the same on every node of a cluster); default: a new one
    proc: subprocess.Popen[bytes] | None = None
    relaunched: str = field(default="", init=False)  # why its first launch was given up for fresh ports, if it was
    _auto: set[str] = field(default_factory=set, init=False, repr=False)  # the port fields chosen here
    _holds: list[socket.socket] = field(default_factory=list, init=False, repr=False)
    _has_started: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base = Path(self.base)
        self._auto = {f for f in ("port", "dist_port", "tls_port")[:3 if self.tls else 2] if not getattr(self, f)}
        self._choose_ports()

    @classmethod
    def start_new(cls, base: Path, timeout: float = 90.0, **kwargs: object) -> "PrivateRabbit":
        node = cls(Path(base), **kwargs)  # type: ignore[arg-type]
        node.start(timeout)
        return node

    # --- names ----------------------------------------------------------------
    @property
    def node(self) -> str:
        return f"{self.name}@localhost"

    def ports(self) -> list[int]:
        return [p for p in (self.port, self.dist_port, self.tls_port) if p]

    def _choose_ports(self, avoid: frozenset[int] | set[int] = frozenset()) -> None:
        taken = set(avoid) | set(self.ports())
        for name in sorted(self._auto):
            self._holds.append(hold_port(taken))
            setattr(self, name, self._holds[-1].getsockname()[1])
            taken.add(getattr(self, name))

    def release_ports(self) -> None:
        for s in self._holds:
            s.close()
        self._holds.clear()

    def url(self, user: str = "guest", password: str = "guest", vhost: str = "/", tls: bool = False) -> str:
        scheme, port = ("amqps", self.tls_port) if tls else ("amqp", self.port)
        return f"{scheme}://{quote(user, safe='')}:{quote(password, safe='')}@localhost:{port}/{quote(vhost, safe='')}"

    # --- files and environment ------------------------------------------------
    def _config(self) -> str:
        lines = [f"listeners.tcp.default = 127.0.0.1:{self.port}", "log.console = false",
                 "log.file.level = info", *self.extra_config]
        if self.tls is not None:
            lines += [
                f"listeners.ssl.default = 127.0.0.1:{self.tls_port}",
                f"ssl_options.cacertfile = {self.tls.ca}",
                f"ssl_options.certfile = {self.tls.cert}",
                f"ssl_options.keyfile = {self.tls.key}",
                f"ssl_options.verify = {'verify_peer' if self.tls.verify_peer else 'verify_none'}",
                f"ssl_options.fail_if_no_peer_cert = {str(self.tls.fail_if_no_peer_cert).lower()}",
            ]
        return "\n".join(lines) + "\n"

    def env(self) -> dict[str, str]:
        d = self.base
        return {
            **os.environ,
            "HOME": str(d),  # its own Erlang cookie, shared by the node and rabbitmqctl
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
            "RABBITMQ_LOG_BASE": str(d / "log"),
            "RABBITMQ_PID_FILE": str(d / "node.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(d / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(d / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(d / "rabbitmq-env.conf"),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_CRASH_DUMP": str(d / "erl_crash.dump"),  # not into the test's working folder
        }

    # --- lifecycle --------------------------------------------------------------
    def start(self, timeout: float = 90.0) -> "PrivateRabbit":
        self.launch()
        return self.wait_started(timeout)

    def launch(self) -> None:
        """Start the node's process (not waiting for it: :meth:`wait_started`)."""
        why = available()
        if why:
            raise RuntimeError(why)
        for sub in ("mnesia", "log"):
            (self.base / sub).mkdir(parents=True, exist_ok=True)
        (self.base / "enabled_plugins").write_text(f"[{','.join(self.plugins)}].\n")
        (self.base / "rabbitmq.conf").write_text(self._config())
        (self.base / "advanced.config").write_text("[].\n")
        (self.base / "rabbitmq-env.conf").write_text("# private test node: nothing from /etc/rabbitmq\n")
        if self.cookie is not None:
            cookie = self.base / ".erlang.cookie"
            if cookie.exists():
                cookie.chmod(0o600)
            cookie.write_text(self.cookie)
            cookie.chmod(0o400)  # Erlang refuses a cookie others may read
        with (self.base / "server.out").open("ab") as out:
            self.proc = subprocess.Popen([tool("rabbitmq-server")], env=self.env(), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd=self.base)

    def wait_started(self, timeout: float = 90.0) -> "PrivateRabbit":
        """Wait until the node answers. A first start that exits because ports chosen here were in use
        (:class:`PortInUse`) is relaunched once with fresh ports (``relaunched`` says why); nothing else is."""
        try:
            return self._wait_started(timeout)
        except PortInUse as clash:
            if self._has_started or self.relaunched or not clash.fields <= self._auto:
                raise
            self._relaunch(clash)
        return self._wait_started(timeout)

    def _wait_started(self, timeout: float) -> "PrivateRabbit":
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.release_ports()
                why = f"exited while starting (status {self.proc.returncode})"
                own = {f: getattr(self, f) for f in ("port", "dist_port", "tls_port")}
                fields = ports_in_use(self._log_text(), own)
                if not fields:
                    raise RuntimeError(self.failure(why))
                why += f" because its {', '.join(f'{f} {own[f]}' for f in sorted(fields))} was in use"
                raise PortInUse(self.failure(why), why, fields)
            if self._answers():
                self._has_started = True
                self.release_ports()  # it listens on them itself now
                return self
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(self.failure(f"did not start within {timeout:g} s"))

    def failure(self, what: str) -> str:
        again = f" after a relaunch with fresh ports (the first launch {self.relaunched})" if self.relaunched else ""
        out = self.base / "server.out"  # the Erlang VM's last word, often above the log tail's shutdown lines
        last = [line for line in (out.read_text(errors="replace") if out.exists() else "").splitlines()
                if line.startswith(("Kernel pid terminated", '{"init terminating in do_boot"'))][-1:]
        return f"private RabbitMQ {self.node} {what}{again}; {''.join(last)[:1500]}\nlog tail:\n{self.log_tail()}"

    def _relaunch(self, clash: PortInUse) -> None:
        old = set(self.ports())
        self.release_ports()
        kept = self.base / "first-launch"  # its log and data, out of the second launch's way
        kept.mkdir(exist_ok=True)
        for name in ("server.out", "log", "mnesia", "erl_crash.dump"):
            if (self.base / name).exists():
                shutil.move(self.base / name, kept / name)
        for name in self._auto:
            setattr(self, name, 0)
        self._choose_ports(avoid=old)
        self.relaunched = clash.why
        print(f"private RabbitMQ {self.node} {clash.why}: relaunched, ports {self.ports()}; first launch: {kept}",
              file=sys.stderr)
        self.launch()

    def _answers(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
        except OSError:
            return False
        return self.ctl("await_startup", check=False, timeout=30).returncode == 0

    def ctl(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n NODE ARGS`` (output captured; raises on failure when ``check``)."""
        out = subprocess.run([tool("rabbitmqctl"), "-q", "-n", self.node, *args], env=self.env(), capture_output=True,
                             text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {self.node}: {out.stderr.strip() or out.stdout}")
        return out

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Kill the node's whole process group (the Erlang VM and its helpers)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.ctl("stop", check=False, timeout=30)
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            self.kill()
        self.release_ports()

    def _log_text(self) -> str:
        paths = [self.base / "server.out", *sorted((self.base / "log").glob("*.log"))]
        return "\n".join(path.read_text(errors="replace") for path in paths if path.exists())

    def log_tail(self, lines: int = 30) -> str:
        texts = []
        for path in [self.base / "server.out", *sorted((self.base / "log").glob("*.log"))]:
            if path.exists():
                texts += path.read_text(errors="replace").splitlines()[-lines:]
        return "\n".join(texts[-lines:])

    def __enter__(self) -> "PrivateRabbit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class PrivateCluster:
    """Private RabbitMQ nodes joined into one cluster (each its own name, ports, data and plugins)."""

    nodes: list[PrivateRabbit]

    @classmethod
    def start_new(cls, base: Path, size: int = 3, timeout: float = 120.0, **kwargs: object) -> "PrivateCluster":
        cookie = uuid.uuid4().hex
        prefix = f"vmsched-test-{uuid.uuid4().hex[:6]}"
        nodes: list[PrivateRabbit] = []
        cluster = cls(nodes)
        try:
            for i in range(1, size + 1):  # each holds its ports until it listens: they all differ
                nodes.append(PrivateRabbit(Path(base) / f"node{i}", name=f"{prefix}-{i}", cookie=cookie,
                                           **kwargs))  # type: ignore[arg-type]
            for node in nodes:  # all at once: a node takes seconds to boot
                node.launch()
            for node in nodes:
                node.wait_started(timeout)  # relaunched once with fresh ports if its own were in use
            ports = [port for node in nodes for port in node.ports()]
            if len(set(ports)) != len(ports):
                raise RuntimeError(f"private cluster nodes share a port: {[(n.node, n.ports()) for n in nodes]}")
            for node in nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", nodes[0].node)
                node.ctl("start_app")
            cluster.wait_running(size, timeout)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def urls(self, user: str = "guest", password: str = "guest", vhost: str = "/") -> str:
        """Every node's URL, as kombu's failover list (``a;b;c``)."""
        return ";".join(node.url(user, password, vhost) for node in self.nodes)

    def running(self) -> list[str]:
        """The names of the running nodes, as a live node sees them."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            out = node.ctl("cluster_status", "--formatter", "json", check=False, timeout=30)
            if out.returncode == 0:
                return list(json.loads(out.stdout).get("running_nodes", []))
        return []

    def wait_running(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.running()) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"fewer than {count} cluster nodes running after {timeout:g} s: {self.running()}")
            time.sleep(0.5)

    def leaders(self, vhost: str = "/") -> dict[str, str]:
        """Quorum queue name -> the node holding its leader, as a live node sees it (``list_queues name leader``)."""
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                continue
            out = node.ctl("list_queues", "-p", vhost, "name", "type", "leader", "--formatter", "json",
                           check=False, timeout=30)
            if out.returncode == 0:
                return {q["name"]: q["leader"] for q in json.loads(out.stdout) if q.get("type") == "quorum" and q.get("leader")}
        return {}

    def by_name(self, node_name: str) -> PrivateRabbit:
        return next(node for node in self.nodes if node.node == node_name)

    def stop(self) -> None:
        for node in self.nodes:
            node.kill()  # a cluster's nodes wait for each other on a clean stop; the data folders go with the test
            node.release_ports()

    def __enter__(self) -> "PrivateCluster":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

