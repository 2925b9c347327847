"""Helpers of the end-to-end tests on a real libvirtd: OS-level probes, guest
definitions, libvirtd and agent process control, waiting with deadlines.

Imported by conftest.py, the test modules and bench/bench_agent_real.py.
Nothing here asserts timing: deadlines only bound how long a condition is
awaited before the test fails with what was last observed.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from tests.support import waiting
from tests.support.net import free_port
from tests.support.paths import ROOT
from vmsched.messages import CONTRACT_VERSION

HOOK_SRC = ROOT / "services" / "policy_agent" / "surfaces" / "hooks" / "qemu"
URI = "qemu:///system"
PREFIX = "vmsched-e2e-"
QEMU_RUN_DIR = Path("/run/libvirt/qemu")
HOOK_PATH = Path("/etc/libvirt/hooks/qemu")
HOOK_CONF = Path("/etc/vmsched/policy-hook.conf")

DEFAULT_WAIT = float(os.environ.get("VMSCHED_E2E_WAIT", "30"))


# --- waiting ---------------------------------------------------------------------
#: Waiting in these tests: up to VMSCHED_E2E_WAIT seconds (a guest boots under TCG), and an error
#: from a probe racing a starting or stopping process counts as "not yet".
wait_until = functools.partial(waiting.wait_until, timeout=DEFAULT_WAIT, interval=0.02, retry_on=(Exception,))
wait_for = functools.partial(waiting.wait_for, timeout=DEFAULT_WAIT, interval=0.02, retry_on=(Exception,))


# --- cpu lists -------------------------------------------------------------------
def parse_cpus(text: str) -> frozenset[int]:
    """'0-2,5' -> {0, 1, 2, 5}"""
    out: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return frozenset(out)


def host_cpus() -> frozenset[int]:
    return parse_cpus(Path("/sys/devices/system/cpu/online").read_text())


# --- processes and threads -------------------------------------------------------
VCPU_COMM = re.compile(r"^CPU (\d+)/(TCG|KVM)$")


def qemu_pid(name: str) -> int | None:
    """PID of the guest's QEMU process (from libvirt's pid file), if it is alive."""
    try:
        pid = int((QEMU_RUN_DIR / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    if re.search(r"^State:\s+Z", status, re.M):
        return None
    return pid


def threads(pid: int) -> dict[int, str]:
    """{tid: comm} of a process."""
    out = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(t.name)] = (t / "comm").read_text().strip()
        except OSError:
            pass
    return out


def vcpu_threads(pid: int) -> dict[int, int]:
    """{vcpu index: tid} from thread names 'CPU n/TCG' (or /KVM)."""
    out = {}
    for tid, comm in threads(pid).items():
        m = VCPU_COMM.match(comm)
        if m:
            out[int(m.group(1))] = tid
    return out


def allowed_cpus(pid: int, tid: int) -> frozenset[int]:
    """Cpus_allowed_list of one thread, as seen by the kernel scheduler."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
    if not m:
        raise RuntimeError(f"no Cpus_allowed_list in /proc/{pid}/task/{tid}/status")
    return parse_cpus(m.group(1))


def proc_start_ticks(pid: int) -> int:
    """Process start time (clock ticks since boot), field 22 of /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[19])


# --- cgroups ---------------------------------------------------------------------
def _cgroup_mounts() -> tuple[dict[str, Path], Path | None]:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, rest = left.split(), right.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        mnt, fstype, opts = Path(fields[4]), rest[0], rest[2]
        if fstype == "cgroup":
            for opt in opts.split(","):
                v1.setdefault(opt, mnt)
        elif fstype == "cgroup2" and v2 is None:
            v2 = mnt
    return v1, v2


def cpu_cgroup(pid: int, tid: int | None = None) -> tuple[str, Path]:
    """("v1"|"v2", directory) of the cpu-controller cgroup of a process or thread."""
    src = f"/proc/{pid}/task/{tid}/cgroup" if tid else f"/proc/{pid}/cgroup"
    v1, v2 = _cgroup_mounts()
    unified = None
    for line in Path(src).read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if hid != "0" and "cpu" in ctrls.split(","):
            return "v1", v1["cpu"] / path.lstrip("/")
        if hid == "0":
            unified = path
    if unified is not None and v2 is not None:
        d = v2 / unified.lstrip("/")
        root_ctrls = (v2 / "cgroup.controllers").read_text().split()
        if "cpu" in root_ctrls:
            return "v2", d
    raise RuntimeError(f"no cpu cgroup controller found for {src}")


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


class CgroupView:
    """The cpu-controller values libvirt wrote for one guest."""

    def __init__(self, pid: int, vcpu_tid: int):
        self.version, self.vcpu_dir = cpu_cgroup(pid, vcpu_tid)
        # machine/qemu-N-NAME.libvirt-qemu/vcpuK -> the guest's own cgroup is the parent
        if not re.fullmatch(r"vcpu\d+", self.vcpu_dir.name):
            raise RuntimeError(f"vCPU thread {vcpu_tid} is in {self.vcpu_dir}, not a vcpuN cgroup")
        self.guest_dir = self.vcpu_dir.parent

    def shares(self) -> int:
        """cpu_shares: v1 cpu.shares of the guest cgroup (v2: libvirt writes shares to cpu.weight)."""
        if self.version == "v1":
            return _read_int(self.guest_dir / "cpu.shares")
        return _read_int(self.guest_dir / "cpu.weight")

    def vcpu_quota(self) -> tuple[int, int]:
        """(quota, period) of this vCPU's cgroup; quota -1 = unlimited."""
        if self.version == "v1":
            return _read_int(self.vcpu_dir / "cpu.cfs_quota_us"), _read_int(self.vcpu_dir / "cpu.cfs_period_us")
        q, p = (self.vcpu_dir / "cpu.max").read_text().split()
        return (-1 if q == "max" else int(q)), int(p)


# --- one guest, seen from the OS --------------------------------------------------
class OSGuest:
    """OS-level facts about a running guest named ``name``."""

    def __init__(self, name: str):
        self.name = name

    def pid(self) -> int:
        pid = qemu_pid(self.name)
        if pid is None:
            raise RuntimeError(f"{self.name} has no live QEMU process")
        return pid

    def running(self) -> bool:
        return qemu_pid(self.name) is not None

    def vcpus(self) -> dict[int, int]:
        return vcpu_threads(self.pid())

    def vcpu_pins(self) -> dict[int, frozenset[int]]:
        """{vcpu: Cpus_allowed_list of its thread}"""
        pid = self.pid()
        return {n: allowed_cpus(pid, tid) for n, tid in sorted(vcpu_threads(pid).items())}

    def emulator_pins(self) -> dict[int, frozenset[int]]:
        """{tid: Cpus_allowed_list} of every non-vCPU thread."""
        pid = self.pid()
        out = {}
        for tid, comm in threads(pid).items():
            if not VCPU_COMM.match(comm):
                try:
                    out[tid] = allowed_cpus(pid, tid)
                except OSError:
                    pass
        return out

    def all_thread_cpus(self) -> frozenset[int]:
        """Union of the Cpus_allowed_list of all the process's threads."""
        pid = self.pid()
        out: set[int] = set()
        for tid in threads(pid):
            try:
                out |= allowed_cpus(pid, tid)
            except OSError:
                pass
        return frozenset(out)

    def cgroup(self, vcpu: int = 0) -> CgroupView:
        pid = self.pid()
        return CgroupView(pid, vcpu_threads(pid)[vcpu])

    def shares(self) -> int:
        return self.cgroup().shares()

    def vcpu_quotas(self) -> dict[int, tuple[int, int]]:
        pid = self.pid()
        return {n: CgroupView(pid, tid).vcpu_quota() for n, tid in sorted(vcpu_threads(pid).items())}

    def start_ticks(self) -> int:
        return proc_start_ticks(self.pid())


def fmt_pins(pins: dict[int, frozenset[int]]) -> str:
    return ", ".join(f"vcpu{n}={','.join(map(str, sorted(c)))}" for n, c in sorted(pins.items()))


# --- guest definitions -----------------------------------------------------------
def guest_xml(name: str, vcpus: int = 2, memory_mib: int = 64, virt_type: str = "qemu") -> str:
    """A disk-less TCG guest: a real QEMU process with real vCPU threads, sitting in SeaBIOS."""
    return f"""<domain type='{virt_type}'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu placement='static'>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <on_reboot>restart</on_reboot>
  <devices>
    <controller type='usb' model='none'/>
    <memballoon model='none'/>
  </devices>
</domain>"""


def with_cputune(xml: str, tune: str) -> str:
    """A manager's edit of a definition: its ``<cputune>`` (the agent's confinement, if any) replaced by its
    own, made of the elements ``tune``."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(xml)
    for old in root.findall("cputune"):
        root.remove(old)
    root.append(ET.fromstring(f"<cputune>{tune}</cputune>"))
    return ET.tostring(root, encoding="unicode")


def remove_guest(conn: Any, name: str) -> None:
    """Destroy (if running) and undefine a guest; quiet when it is already gone."""
    import libvirt

    try:
        dom = conn.lookupByName(name)
    except libvirt.libvirtError:
        return
    try:
        if dom.isActive():
            dom.destroy()
    except libvirt.libvirtError:
        pass
    try:
        dom.undefineFlags(libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    except libvirt.libvirtError:
        try:
            dom.undefine()
        except libvirt.libvirtError:
            pass


def remove_guests(conn: Any, names: list[str]) -> None:
    """remove_guest for several guests in parallel (destroying a TCG guest takes 1-2 s)."""
    ts = [threading.Thread(target=remove_guest, args=(conn, n)) for n in names]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)


# --- libvirt connection with events in this process -------------------------------
_loop_lock = threading.Lock()
_loop_started = False


def start_event_loop() -> None:
    """Register libvirt's default event implementation and run it in a daemon thread (once)."""
    global _loop_started
    import libvirt

    with _loop_lock:
        if _loop_started:
            return
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)  # errors arrive as exceptions
        libvirt.virEventRegisterDefaultImpl()

        def run() -> None:
            while True:
                libvirt.virEventRunDefaultImpl()

        threading.Thread(target=run, name="libvirt-events", daemon=True).start()
        _loop_started = True


class Libvirt:
    """A qemu:///system connection that reopens itself after libvirtd restarts."""

    def __init__(self, uri: str = URI):
        self.uri = uri
        self._conn: Any = None
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[Any], None]] = []

    @property
    def conn(self) -> Any:
        import libvirt

        with self._lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except libvirt.libvirtError:
                    pass
                try:
                    self._conn.close()
                except libvirt.libvirtError:
                    pass
                self._conn = None
            self._conn = libvirt.open(self.uri)
            for cb in self._callbacks:
                cb(self._conn)
            return self._conn

    def on_connect(self, cb: Callable[[Any], None]) -> None:
        """Call ``cb(conn)`` now and after every reconnect (e.g. to register event callbacks)."""
        self._callbacks.append(cb)
        if self._conn is not None:
            cb(self._conn)

    def dom(self, name: str) -> Any:
        return self.conn.lookupByName(name)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                try:
                    self._conn.close()
                except Exception:  # noqa: BLE001
                    pass
                self._conn = None


class EventLog:
    """Lifecycle events of the test guests, in arrival order: (monotonic time, name, event, detail)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, int, int]] = []
        self._cond = threading.Condition()

    def attach(self, conn: Any) -> None:
        import libvirt

        conn.domainEventRegisterAny(None, libvirt.VIR_DOMAIN_EVENT_ID_LIFECYCLE, self._lifecycle, None)

    def _lifecycle(self, conn: Any, dom: Any, event: int, detail: int, opaque: Any) -> None:
        name = dom.name()
        if name.startswith(PREFIX):
            with self._cond:
                self.events.append((time.monotonic(), name, event, detail))
                self._cond.notify_all()

    def since(self, t0: float) -> list[tuple[float, str, int, int]]:
        with self._cond:
            return [e for e in self.events if e[0] >= t0]


def qemu_processes() -> dict[str, int]:
    """{guest name: QEMU pid} of every running QEMU guest on the host."""
    out = {}
    for f in QEMU_RUN_DIR.glob("*.pid"):
        if not (QEMU_RUN_DIR / f"{f.stem}.xml").exists():  # driver.pid is libvirtd's own
            continue
        pid = qemu_pid(f.stem)
        if pid is not None:
            out[f.stem] = pid
    return out


def threads_on(cpus: frozenset[int], exclude_tids: set[int] = frozenset()) -> list[str]:
    """Every QEMU thread on the host allowed to run on any of ``cpus`` (except ``exclude_tids``)."""
    found = []
    for name, pid in qemu_processes().items():
        try:
            tids = threads(pid)
        except OSError:
            continue
        for tid, comm in tids.items():
            if tid in exclude_tids:
                continue
            try:
                allowed = allowed_cpus(pid, tid)
            except OSError:
                continue
            if allowed & cpus:
                found.append(f"{name}:{comm}({tid})={','.join(map(str, sorted(allowed)))}")
    return sorted(found)


# --- the agent process -----------------------------------------------------------
def agent_command_prefix() -> list[str]:
    """``python -m vmsched.cli`` when the main CLI registers the agent, else ``python -m vmsched.services.policy_agent``."""
    override = os.environ.get("VMSCHED_E2E_CLI")
    if override:
        return override.split()
    cli = ROOT / "vmsched" / "cli.py"
    if cli.exists() and "policy_agent" in cli.read_text():
        return [sys.executable, "-m", "vmsched.cli"]
    return [sys.executable, "-m", "vmsched.services.policy_agent"]


class AgentError(RuntimeError):
    pass


class AgentProcess:
    """The real agent, run as a separate process, with kill -9 and restart."""

    def __init__(self, workdir: Path, dedicated_pool: str | None = None, host_id: str = "e2e",
                 reconcile_interval: float | None = None, extra_args: tuple[str, ...] = (),
                 metrics: bool = True):
        self.workdir = Path(workdir)
        self.state_dir = self.workdir / "state"
        self.socket_path = self.workdir / "agent.sock"
        self.log_path = self.workdir / "agent.log"
        self.dedicated_pool = dedicated_pool
        self.host_id = host_id
        self.reconcile_interval = reconcile_interval
        self.extra_args = tuple(extra_args)
        self.metrics_port = free_port() if metrics else None
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def command(self) -> list[str]:
        cmd = [*agent_command_prefix(), "agent", "--libvirt", URI, "--host-id", self.host_id,
               "--state-dir", str(self.state_dir), "--socket", str(self.socket_path), "--log-level", "DEBUG"]
        if self.dedicated_pool is not None:
            cmd += ["--dedicated-pool", self.dedicated_pool]
        if self.reconcile_interval is not None:
            cmd += ["--reconcile-interval", str(self.reconcile_interval)]
        if self.metrics_port is not None:
            cmd += ["--metrics-port", str(self.metrics_port)]
        return cmd + list(self.extra_args)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, timeout: float = 60.0) -> "AgentProcess":
        if self.running():
            raise AgentError("agent already running")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"\n===== start #{self.starts + 1}: {' '.join(self.command())}\n".encode())
        log.flush()
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=str(ROOT),
                                     env=self.env(), start_new_session=True)
        log.close()
        self.starts += 1
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> dict:
        def ready() -> dict | None:
            if self.proc is not None and self.proc.poll() is not None:
                raise AgentError(f"agent exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            if not self.socket_path.exists():
                return None
            try:
                status = self.request("ping", timeout=2)
            except (OSError, AgentError, ValueError):
                return None
            return status if status.get("connected") else None

        deadline = time.monotonic() + timeout
        while True:
            try:
                st = ready()
            except AgentError:
                raise
            if st:
                return st
            if time.monotonic() >= deadline:
                raise AgentError(f"agent not ready after {timeout:.0f} s; log:\n{self.log_tail()}")
            time.sleep(0.05)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def restart(self, timeout: float = 60.0) -> "AgentProcess":
        self.stop()
        return self.start(timeout)

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- talking to it ---
    def request(self, op: str, body: dict | None = None, timeout: float = 30.0) -> dict:
        """One request on the local socket; returns the reply body, raises AgentError on ok=false."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        try:
            s.connect(str(self.socket_path))
            s.sendall((json.dumps({"v": CONTRACT_VERSION, "op": op, "body": body or {}}) + "\n").encode())
            buf = b""
            while b"\n" not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        finally:
            s.close()
        reply = json.loads(buf.split(b"\n", 1)[0])
        if not reply.get("ok"):
            raise AgentError(f"{op}: {reply.get('code')}: {reply.get('error')}")
        return reply.get("body") or {}

    def metrics(self) -> dict[str, float]:
        """The agent's Prometheus metrics: {'name{label="v"}': value} (labels as exported)."""
        if self.metrics_port is None:
            raise AgentError("agent started without a metrics port")
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out

    def metric(self, key: str) -> float:
        """One sample, e.g. 'vmsched_agent_event_to_applied_seconds_count{event="reboot"}'; 0 when absent."""
        return self.metrics().get(key, 0.0)

    def cli(self, *args: str, check: bool = True, timeout: float = 120.0) -> subprocess.CompletedProcess:
        """``vmsched ARGS --socket SOCK`` as a subprocess (the real command line)."""
        cmd = [*agent_command_prefix(), *args, "--socket", str(self.socket_path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), env=self.env(), timeout=timeout)
        if check and proc.returncode != 0:
            raise AgentError(f"{' '.join(args)} -> exit {proc.returncode}\nstdout: {proc.stdout}\n"
                             f"stderr: {proc.stderr}\nagent log:\n{self.log_tail()}")
        return proc

    def cli_json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)


def virsh(*args: str, check: bool = False, timeout: float = 120.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(["virsh", "-c", URI, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"virsh {' '.join(args)} -> exit {proc.returncode}: {proc.stderr.strip()}")
    return proc
