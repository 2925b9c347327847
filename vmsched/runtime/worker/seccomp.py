"""A seccomp filter for the plugin worker: a small classic-BPF program, via ctypes.

Standard library only (the worker imports it). x86-64 only; elsewhere
:func:`install` raises and the worker reports seccomp as inactive.

What the filter enforces (errors are EPERM, so Python raises PermissionError):

- any architecture but x86-64 (i386 ``int 0x80``) kills the process; x32
  system calls are refused;
- refused: ptrace, process_vm_readv/writev, mount and the new mount API,
  umount, pivot_root, chroot, unshare, setns, kexec, init/finit/delete_module,
  add_key, request_key, keyctl, bpf, perf_event_open, userfaultfd, io_uring
  (its operations would bypass this filter), reboot, swapon/off;
- with the network off: socket() for AF_INET, AF_INET6 and AF_PACKET
  (AF_UNIX and socketpair stay, Python needs them);
- kill and rt_sigqueueinfo to pid -1 (every process) are refused;
- ``signals`` (used when Landlock cannot scope signals, kernels < 6.12): kill
  and rt_sigqueueinfo may not target the parent (the service), pid -1 or a
  process group other than the worker's own; tgkill and rt_tgsigqueueinfo may
  not target the parent; tkill and pidfd_send_signal are refused. Other
  processes of the same user stay reachable then: BPF sees numbers, not
  process groups (the dedicated plugin user, or Landlock >= 6.12, closes that).
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45
_RET_K = 0x06
_SECCOMP_RET_KILL_PROCESS = 0x80000000
_SECCOMP_RET_ERRNO = 0x00050000
_SECCOMP_RET_ALLOW = 0x7FFF0000
_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; args are u64, little-endian: low word first

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

DENIED = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176,
    "add_key": 248, "request_key": 249, "keyctl": 250,
    "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "reboot": 169, "swapon": 167, "swapoff": 168,
}
_SOCKET = 41
_AF_INET, _AF_INET6, _AF_PACKET = 2, 10, 17
_KILL, _RT_SIGQUEUEINFO, _TGKILL, _RT_TGSIGQUEUEINFO, _TKILL, _PIDFD_SEND_SIGNAL = 62, 129, 234, 297, 200, 424


class _Program:
    """A tiny assembler with forward labels (jump offsets resolved at the end)."""

    def __init__(self) -> None:
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: object = 0, jf: object = 0) -> None:
        self.code.append((code, jt, jf, k & 0xFFFFFFFF))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for i, (code, jt, jf, k) in enumerate(self.code):
            out += struct.pack("=HBBI", code, self._offset(i, jt), self._offset(i, jf), k)
        return bytes(out)

    def _offset(self, i: int, target: object) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[str(target)] - i - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {target} out of range")
        return offset


def build(network: bool, signals: bool, own_pid: int, parent_pid: int) -> bytes:
    """The filter program (see the module docstring)."""
    p = _Program()
    p.op(_LD_W_ABS, _OFF_ARCH)
    p.op(_JEQ_K, AUDIT_ARCH_X86_64, 1, 0)
    p.op(_RET_K, _SECCOMP_RET_KILL_PROCESS)
    p.op(_LD_W_ABS, _OFF_NR)
    p.op(_JGE_K, _X32_BIT, "deny", 0)
    for number in sorted(DENIED.values()):
        p.op(_JEQ_K, number, "deny", 0)
    if not network:
        p.op(_JEQ_K, _SOCKET, "socket", 0)
    p.op(_JEQ_K, _KILL, "kill", 0)
    p.op(_JEQ_K, _RT_SIGQUEUEINFO, "kill", 0)
    if signals:
        p.op(_JEQ_K, _TGKILL, "tgkill", 0)
        p.op(_JEQ_K, _RT_TGSIGQUEUEINFO, "tgkill", 0)
        p.op(_JEQ_K, _TKILL, "deny", 0)
        p.op(_JEQ_K, _PIDFD_SEND_SIGNAL, "deny", 0)
    p.op(_RET_K, _SECCOMP_RET_ALLOW)
    if not network:
        p.label("socket")
        p.op(_LD_W_ABS, _OFF_ARG0)
        for family in (_AF_INET, _AF_INET6, _AF_PACKET):
            p.op(_JEQ_K, family, "deny", 0)
        p.op(_JEQ_K, 0, "allow", "allow")  # always true: a jump
    p.label("kill")  # arg0: pid; 0 = own group, -N = group N, -1 = every process
    p.op(_LD_W_ABS, _OFF_ARG0)
    p.op(_JEQ_K, -1, "deny", 0)
    if not signals:
        p.op(_JEQ_K, 0, "allow", "allow")  # always true: a jump
    else:
        p.op(_JEQ_K, parent_pid, "deny", 0)
        p.op(_JSET_K, 0x80000000, 0, "allow")  # a positive pid other than the parent
        p.op(_JEQ_K, -own_pid, "allow", "deny")  # the worker's own group only
        p.label("tgkill")
        p.op(_LD_W_ABS, _OFF_ARG0)
        p.op(_JEQ_K, parent_pid, "deny", "allow")
    p.label("allow")  # jumps go forward only: the verdicts come last
    p.op(_RET_K, _SECCOMP_RET_ALLOW)
    p.label("deny")
    p.op(_RET_K, _SECCOMP_RET_ERRNO | errno.EPERM)
    return p.assemble()


def install(network: bool, signals: bool, own_pid: int, parent_pid: int) -> None:
    """Install the filter on this thread (and later threads and children).

    Requires no_new_privs (or CAP_SYS_ADMIN) to be set already (:func:`vmsched.runtime.worker.sandbox.confine`
    sets it first).
    """
    if platform.machine() != "x86_64":
        raise OSError(f"no seccomp filter for {platform.machine()}")
    program = build(network, signals, own_pid, parent_pid)
    buffer = ctypes.create_string_buffer(program, len(program))

    class _Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = _Fprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
