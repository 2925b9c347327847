"""Confining the plugin worker before any plugin runs (standard library only).

:func:`confine` runs in the worker at start, in its main thread and before it
starts any other thread, in this order:

1. resource limits (address space, files, file size, core dumps);
2. when running as root: switch to the plugin user (setgroups, setgid,
   setuid), or, only with ``allow_root``, stay root without capabilities;
3. drop every capability (ambient, effective, permitted, inheritable);
   no_new_privs; the process-count limit (it counts the plugin user's processes);
4. Landlock: read-only plugins folder and Python installation, one private
   writable temporary directory, TCP off unless the network is on, signals
   and abstract sockets scoped to the worker's own processes;
5. seccomp (see :mod:`vmsched.runtime.worker.seccomp`).

Each step that cannot apply is reported, with the reason, in the returned
report; the pool logs it and shows it in ``/v1/units`` and a metric.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import sys
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field

from vmsched.runtime.types import Confinement, Limits
from vmsched.runtime.worker import landlock, seccomp

PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 4, 36, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
_CAP_VERSION_3 = 0x20080522
_SYS_CAPSET = 126

FEATURES = ("user", "capabilities", "no_new_privs", "landlock", "seccomp", "no_network", "limits")


class SandboxError(RuntimeError):
    """The worker cannot run plugins as configured (e.g. it would stay root)."""


@dataclass
class Report:
    """Which confinement is active ("on ...") and which is not ("off: why")."""

    features: dict[str, str] = field(default_factory=dict)
    tmp_dir: str = ""

    def on(self, feature: str, detail: str = "") -> None:
        self.features[feature] = f"on ({detail})" if detail else "on"

    def off(self, feature: str, why: str) -> None:
        self.features[feature] = f"off: {why}"


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, arg: int = 0) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def make_non_dumpable() -> None:
    """No core dumps, no same-uid ptrace, /proc/<pid>/environ and mem root-owned."""
    _prctl(PR_SET_DUMPABLE, 0)


def confine(plugins_dirs: list[str], limits: Limits, confinement: Confinement, tmp_parent: str) -> Report:
    """Confine this process as the pool asks (``plugins_dirs``: the first is the worker's own folder; the
    private temporary directory is made under ``tmp_parent``)."""
    report = Report()
    _limits(limits)
    _switch_user(confinement, plugins_dirs[0], report)
    _drop_capabilities(report)
    _prctl(seccomp.PR_SET_NO_NEW_PRIVS, 1)
    report.on("no_new_privs")
    resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_procs, limits.max_procs))
    report.tmp_dir = tempfile.mkdtemp(prefix="vmsched-plugin-", dir=tmp_parent)
    for name in ("TMPDIR", "HOME"):
        os.environ[name] = report.tmp_dir
    tempfile.tempdir = report.tmp_dir
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the plugin come back to us, to be killed
    signals_scoped = _landlock(plugins_dirs, confinement, report)
    _seccomp(confinement.network, report, signals_scoped)
    report.on(
        "limits",
        f"memory {limits.memory_mb} MiB, {limits.max_procs} processes, {limits.max_files} files, "
        f"file size {limits.max_file_mb} MiB",
    )
    return report


def _limits(limits: Limits) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core files in the plugins folder
    if limits.memory_mb > 0:
        _lower(resource.RLIMIT_AS, limits.memory_mb << 20)
    _lower(resource.RLIMIT_NOFILE, limits.max_files)
    _lower(resource.RLIMIT_FSIZE, limits.max_file_mb << 20)
    if limits.nice > 0:
        os.nice(limits.nice)


def _lower(which: int, value: int) -> None:
    hard = resource.getrlimit(which)[1]
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


def _switch_user(confinement: Confinement, plugins_dir: str, report: Report) -> None:
    if os.geteuid() != 0:
        report.on("user", f"uid {os.geteuid()}: the service's own user")
        return
    why = _try_switch(confinement.user, plugins_dir)
    if why is None:
        report.on("user", f"{confinement.user} (uid {os.getuid()}), switched from root")
        return
    if not confinement.allow_root:
        raise SandboxError(
            f"the service runs as root and cannot switch plugin workers to user {confinement.user!r}: {why}; "
            "choose another --plugin-user, or run plugins as root (without capabilities) with --allow-root-plugins"
        )
    report.off("user", f"root (--allow-root-plugins): cannot switch to {confinement.user!r}: {why}")


def _try_switch(user: str, plugins_dir: str) -> str | None:
    """Switch to ``user``; None when done, else why not (nothing changed then)."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        return f"no user {user!r}"
    if entry.pw_uid == 0:
        return f"user {user!r} is root"
    needed = unreadable_by(entry, plugins_dir)
    if needed:
        return f"it cannot read {needed} (Python and the plugins folder must be readable by that user)"
    os.setgroups([])
    os.setgid(entry.pw_gid)
    os.setuid(entry.pw_uid)
    return None


def unreadable_by(entry: pwd.struct_passwd, plugins_dir: str) -> str | None:
    """The first path a plugin worker needs (Python, the worker's code, the plugins folder) that the
    user ``entry`` cannot read, else None."""
    return next((p for p in [*_python_paths(), plugins_dir] if not _readable_by(p, entry.pw_uid, entry.pw_gid)), None)


def _readable_by(path: str, uid: int, gid: int) -> bool:
    """Whether ``uid``/``gid`` (no supplementary groups) can reach and read ``path``."""
    parts = os.path.abspath(path).split(os.sep)
    current = os.sep
    for part in parts[1:]:
        current = os.path.join(current, part)
        try:
            st = os.stat(current)
        except OSError:
            return True  # absent paths need nothing
        need = 0o5 if os.path.isdir(current) else 0o4
        if st.st_uid == uid:
            mode = (st.st_mode >> 6) & 0o7
        elif st.st_gid == gid:
            mode = (st.st_mode >> 3) & 0o7
        else:
            mode = st.st_mode & 0o7
        want = need if current == os.path.abspath(path) else 0o1
        if mode & want != want:
            return False
    return True


def _python_paths() -> list[str]:
    import encodings  # noqa: PLC0415  (already imported by the interpreter)

    stdlib = os.path.dirname(os.path.dirname(os.path.abspath(encodings.__file__)))
    return [stdlib, os.path.dirname(os.path.abspath(__file__))]


def _drop_capabilities(report: Report) -> None:
    with suppress(OSError):  # kernel < 4.3: no ambient set
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if os.geteuid() == 0:  # still root (allow_root): empty the bounding set too
        last = int(open("/proc/sys/kernel/cap_last_cap").read())
        for cap in range(last + 1):
            try:
                _prctl(PR_CAPBSET_DROP, cap)
            except OSError:
                break
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()
    if _libc.syscall(ctypes.c_long(_SYS_CAPSET), header, data) != 0:
        report.off("capabilities", f"capset failed: {os.strerror(ctypes.get_errno())}")
        return
    effective = _status_field("CapEff")
    if effective != 0:
        raise SandboxError(f"capabilities remain after dropping them: CapEff={effective:x}")
    report.on("capabilities", "none: CapEff=0")


def _status_field(name: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1], 16)
    raise SandboxError(f"no {name} in /proc/self/status")


def read_paths(plugins_dirs: list[str], network: bool) -> list[str]:
    """What the plugins may read: their folders, Python, shared libraries, a few files."""
    paths = [*plugins_dirs, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    paths += [p for p in sys.path if p and os.path.isabs(p)]
    paths += [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]  # the vmsched package
    paths += ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime", "/etc/passwd", "/etc/group",
              "/dev/urandom", "/dev/random", "/dev/zero", f"/proc/{os.getpid()}"]
    if network:
        paths += ["/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/etc/hosts", "/etc/resolv.conf",
                  "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf"]
    return paths


def _landlock(plugins_dirs: list[str], confinement: Confinement, report: Report) -> bool:
    """Apply Landlock; whether signals are scoped by it."""
    write = [report.tmp_dir, "/dev/null", "/dev/full", *confinement.write_dirs]
    try:
        result = landlock.restrict(read_paths(plugins_dirs, confinement.network), write,
                                   deny_tcp=not confinement.network)
    except OSError as exc:
        report.off("landlock", f"{exc.strerror or exc} (needs Linux >= 5.13 with the landlock LSM)")
        return False
    detail = f"ABI {result.abi}: plugins folder and Python read-only, {report.tmp_dir} writable"
    if result.network_denied:
        detail += ", TCP denied"
    detail += ", signals scoped to the worker" if result.signals_scoped else ", signals not scoped (ABI < 6)"
    report.on("landlock", detail)
    return result.signals_scoped


def _seccomp(network: bool, report: Report, signals_scoped: bool) -> None:
    try:
        seccomp.install(network, not signals_scoped, os.getpid(), os.getppid())
    except OSError as exc:
        report.off("seccomp", str(exc))
        report.off("no_network", "network allowed (--plugin-network)" if network else "seccomp unavailable")
        return
    rules = "ptrace, mount, modules, keys refused"
    rules += ", signals to the parent and other groups refused" if not signals_scoped else ""
    report.on("seccomp", rules)
    if network:
        report.off("no_network", "network allowed (--plugin-network)")
    else:
        report.on("no_network", "AF_INET/AF_INET6/AF_PACKET sockets refused")
