"""The system calls a sandboxed process is refused: one seccomp filter, built once per process.

bwrap's namespaces hide the host, but a sandboxed process still talks to the whole kernel,
and the kernel's less used surfaces are where container escapes start. The filter closes
the ones an agent's commands never need (the list is :data:`REFUSED`):

* new namespaces: ``unshare`` and ``clone`` with a ``CLONE_NEW*`` flag, and ``setns``.
  An unprivileged user namespace would hand the process a full capability set (of that
  namespace) and with it mount, netfilter and more kernel code to attack. ``clone3`` passes
  its flags in memory, which a filter cannot read, so it is refused with ``ENOSYS``: libc
  then falls back to ``clone``, whose flags are checked (threads and ``fork`` still work).
* kernel programs and debugging interfaces: ``bpf``, ``perf_event_open``, ``userfaultfd``
  (a favourite of exploits for stretching a race), ``io_uring_*``, the key retention
  service (``keyctl``, ``add_key``, ``request_key``).
* other processes' memory: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``.
* mounts (``mount``, ``umount2``, ``pivot_root`` and the new mount API), kernel modules,
  ``kexec_*``, ``open_by_handle_at`` and a few calls that only an administrator makes.
  These already need a capability the sandbox does not hold; refusing them keeps it so if
  one leaks.
* ``ioctl(TIOCSTI)`` / ``ioctl(TIOCLINUX)``: pushing input into a terminal.
* socket families but those of :data:`SOCKET_FAMILIES` (an allow-list): ``AF_VSOCK``, for
  one, is not network-namespaced and would reach the VM host's vsock ports;
  ``AF_PACKET``, ``AF_BLUETOOTH``, netlink protocols other than ``NETLINK_ROUTE`` and the
  rest are kernel code an agent's commands never need. ``socketpair`` takes ``AF_UNIX`` only.

A refused call fails with ``EPERM`` (``clone3``: ``ENOSYS``), as it would without the
privilege, so programs report an ordinary error. The filter covers this machine's own
system call ABI only: a call through another one (``int 0x80`` or x32 on x86_64) kills the
process, so no rule is bypassed through a second system call table. ``personality`` is not
filtered: its risky flags (``ADDR_NO_RANDOMIZE``, ``READ_IMPLIES_EXEC``) only weaken the
process's own user-space hardening, and an exact rule (allow just the query and the plain
personas) needs a default-deny filter.

How it is applied
    ``bwrap`` backend: bwrap's ``--seccomp FD`` installs the filter just before it executes
    the sandbox's first program (``setpriv``, ``prlimit``: neither makes a refused call);
    every process below inherits it and none can remove it. The compiled program is written
    once to ``<sandboxes root>/.seccomp-<digest>.bpf`` (the root is writable by its owner
    only) and each launch opens it as fd 9 through ``/bin/sh -c 'exec "$@" 9<"$0"'`` (bwrap
    reads the fd to its end and closes it), so a sandbox's host argv stays self-contained.
    ``process`` backend: the pre-exec step loads the same filter last, with
    ``no_new_privs``, when it can be built (that backend is explicitly unisolated; see
    :mod:`tunix_agentic.envs.sandbox`).

The program is compiled by libseccomp (``libseccomp.so.2``, Debian ``libseccomp2``)
through ``pyseccomp``; :func:`seccomp_problem` says why it cannot be, and the bwrap probe
reports that, so the bwrap backend never runs without the filter.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import secrets
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunix_agentic.envs.sandbox.config import SandboxError

# Namespace flags of clone(2) and unshare(2) (linux/sched.h).
NAMESPACE_FLAGS: dict[str, int] = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
# unshare(2) only: in legacy clone(2) the low byte is the exit signal.
_CLONE_NEWTIME = 0x00000080

# Refused outright with EPERM (names as libseccomp knows them).
REFUSED: tuple[str, ...] = (
    "setns",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "mount",
    "umount2",
    "pivot_root",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fsconfig",
    "fspick",
    "mount_setattr",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "open_by_handle_at",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "iopl",
    "ioperm",
    "uselib",
)
_TERMINAL_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}
# Socket families a sandboxed process may open (an allow-list: a family the kernel gains
# later stays closed). AF_INET and AF_INET6 reach only the sandbox's own loopback unless
# ``network`` keeps the host's namespace; AF_NETLINK only with NETLINK_ROUTE (glibc's
# getaddrinfo and ``ip`` ask it about the namespace's own interfaces).
SOCKET_FAMILIES: dict[str, int] = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
_NETLINK_ROUTE = 0
SECCOMP_FD = 9  # the fd bwrap reads the program from (opened by the launcher's shell)

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def seccomp_program() -> bytes:
    """The filter as a classic BPF program (``struct sock_filter`` array), built once.

    Raises :class:`SandboxError` when libseccomp or ``pyseccomp`` is missing or does not
    know one of the refused calls (a libseccomp older than the kernel API it must cover).
    """
    with _LOCK:
        if "program" not in _STATE:
            try:
                _STATE["program"] = _build()
            except SandboxError as exc:
                _STATE["program"] = exc
        found = _STATE["program"]
    if isinstance(found, SandboxError):
        raise found
    return found


def _build() -> bytes:
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:
        raise SandboxError(
            f"the seccomp filter cannot be built: {exc} (pip install pyseccomp; "
            "apt-get install libseccomp2)"
        ) from exc
    native = sc.system_arch()
    unknown = [
        n
        for n in (*REFUSED, "clone", "clone3", "unshare", "ioctl", "socket", "socketpair")
        if _nr(sc, n) == -1
    ]
    if unknown:
        raise SandboxError(
            f"the seccomp filter cannot be built: libseccomp does not know {', '.join(unknown)} "
            "(upgrade libseccomp2 to 2.5 or later)"
        )
    filt = sc.SyscallFilter(sc.ALLOW)
    refuse = sc.ERRNO(errno.EPERM)
    for name in REFUSED:
        filt.add_rule(refuse, name)
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    # s390 passes clone's flags second (its stack pointer comes first).
    clone_flags = 1 if native in (sc.Arch.S390, sc.Arch.S390X) else 0
    for flag in NAMESPACE_FLAGS.values():
        filt.add_rule(refuse, "clone", sc.Arg(clone_flags, sc.MASKED_EQ, flag, flag))
    for flag in (*NAMESPACE_FLAGS.values(), _CLONE_NEWTIME):
        filt.add_rule(refuse, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in _TERMINAL_IOCTLS.values():
        # The kernel reads the request as 32 bits: compare only those, so set high bits
        # do not slip past.
        filt.add_rule(refuse, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    _refuse_socket_families(sc, filt, refuse)
    with tempfile.TemporaryFile() as out:
        filt.export_bpf(out)
        out.seek(0)
        program = out.read()
    if not program or len(program) % 8:
        raise SandboxError(f"libseccomp exported a malformed filter ({len(program)} bytes)")
    return program


def _refuse_socket_families(sc: Any, filt: Any, refuse: Any) -> None:
    """``socket`` refused for every family but :data:`SOCKET_FAMILIES`, ``socketpair`` for
    every family but AF_UNIX. A rule compares all 64 bits of an argument the kernel reads as
    an ``int``, so a value with high bits set is refused, never let through."""
    allowed = sorted(SOCKET_FAMILIES.values())
    filt.add_rule(refuse, "socket", sc.Arg(0, sc.LT, allowed[0]))
    filt.add_rule(refuse, "socket", sc.Arg(0, sc.GT, allowed[-1]))
    for family in range(allowed[0], allowed[-1]):
        if family not in allowed:
            filt.add_rule(refuse, "socket", sc.Arg(0, sc.EQ, family))
    netlink = SOCKET_FAMILIES["AF_NETLINK"]
    filt.add_rule(refuse, "socket", sc.Arg(0, sc.EQ, netlink), sc.Arg(2, sc.NE, _NETLINK_ROUTE))
    unix = SOCKET_FAMILIES["AF_UNIX"]
    filt.add_rule(refuse, "socketpair", sc.Arg(0, sc.LT, unix))
    filt.add_rule(refuse, "socketpair", sc.Arg(0, sc.GT, unix))


def _nr(sc: Any, name: str) -> int:
    return int(sc.resolve_syscall(sc.Arch.NATIVE, name))


def seccomp_file(root: Path) -> Path:
    """The compiled filter as a file in the sandboxes' ``root`` (written when missing).

    Named by its digest, so processes (of any version of this code) share one file per
    filter; written to a temporary name and renamed, so a reader never sees half of it.
    """
    program = seccomp_program()
    path = root / f".seccomp-{hashlib.sha256(program).hexdigest()[:16]}.bpf"
    try:
        if path.read_bytes() == program:
            return path
    except OSError:
        pass
    tmp = root / f".seccomp-tmp-{secrets.token_hex(6)}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(program)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def seccomp_problem(root: Path) -> str | None:
    """Why the filter cannot be built or stored in ``root`` (None: it can)."""
    try:
        seccomp_file(root)
    except (SandboxError, OSError) as exc:
        return str(exc)
    return None


def with_seccomp(argv: list[str], root: Path) -> list[str]:
    """A bwrap argv (``bwrap ...``) made to install the filter: ``sh -c ... bwrap --seccomp 9 ...``.

    The first element named ``bwrap`` gets ``--seccomp``; the shell opens the filter's file
    on that fd and execs the rest (same pid, nothing left between the caller and bwrap).
    """
    at = next(i for i, a in enumerate(argv) if os.path.basename(a) == "bwrap")
    bwrap = [*argv[: at + 1], "--seccomp", str(SECCOMP_FD), *argv[at + 1 :]]
    script = f'exec "$@" {SECCOMP_FD}<"$0"'
    return ["/bin/sh", "-c", script, str(seccomp_file(root)), *bwrap]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


def seccomp_loader(libc: Any) -> Callable[[], None] | None:
    """For a pre-exec step (the ``process`` backend): a callable that sets ``no_new_privs``
    and loads the filter into the calling process, or None when the filter cannot be built.

    ``libc`` is a ``ctypes.CDLL`` made with ``use_errno=True``. Everything the callable needs
    is prepared here, so the child only makes two ``prctl`` calls; if the kernel refuses, it
    raises ``OSError`` (the launch then fails in the parent).
    """
    try:
        program = seccomp_program()
    except SandboxError:
        return None
    with _LOCK:  # made once: the kernel copies the program, but it must live until then
        if "fprog" not in _STATE:
            buffer = ctypes.create_string_buffer(program, len(program))
            _STATE["fprog"] = (buffer, _SockFprog(len(program) // 8, ctypes.addressof(buffer)))
        fprog = _STATE["fprog"][1]
    ul = ctypes.c_ulong
    calls = (
        (ul(_PR_SET_NO_NEW_PRIVS), ul(1), ul(0), ul(0), ul(0)),
        (ul(_PR_SET_SECCOMP), ul(_SECCOMP_MODE_FILTER), ul(ctypes.addressof(fprog)), ul(0), ul(0)),
    )

    def load() -> None:
        for args in calls:
            if libc.prctl(*args) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"cannot load the seccomp filter: {os.strerror(err)}")

    return load
