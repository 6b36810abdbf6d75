"""Rootless per-episode sandboxes: a private working directory, resource limits, no network.

One :class:`Sandbox` per episode. It owns a host directory (``workdir``) that its commands see
as :data:`SANDBOX_WORKDIR` (their cwd and ``$HOME``) and a ``/tmp`` of its own; every command,
long-lived shell and interpreter it starts runs under the limits of its :class:`SandboxConfig`,
and :meth:`Sandbox.close` kills them all and removes the directory. Each command is its own
bwrap instance (about 10 ms), so ``/tmp`` is a host directory of the sandbox bound in, not a
tmpfs: a tmpfs would be private to one command, and the agent's shell, its interpreter and
the task's set-up commands must see the same files.

Backends
    ``"bwrap"`` (bubblewrap) starts every command in fresh mount, PID, IPC, UTS (and, unless
    ``network``, network) namespaces: the host's filesystem is invisible but for the read-only
    ``ro_paths``; ``/proc``, ``/dev`` and ``/dev/shm`` are private; ``--die-with-parent`` kills
    the sandbox when this process dies, even by SIGKILL. ``"process"`` is a plain subprocess
    with the same resource limits, uid and working directory, a new session and
    ``PR_SET_PDEATHSIG``: no network or filesystem isolation. ``"auto"`` uses bwrap when a
    probe run works (probed once per process) and otherwise falls back to ``"process"`` with
    one :class:`SandboxIsolationWarning`.

Processes, uids and fork bombs
    ``RLIMIT_NPROC`` counts every process (thread) of a *real uid*, and the kernel exempts
    uid 0 from it entirely, so under root a limit alone stops no fork bomb; and if all
    sandboxes shared one uid, one episode's bomb would use up the others' budget. So, when
    this process is root, each sandbox takes its own uid from ``uid_base .. uid_base+4095``
    (claimed with an ``flock`` that dies with its holder, so concurrent trainers on one host
    never share one) and ``max_procs`` bounds that sandbox alone. bwrap then runs
    *privileged* (no user namespace) so that it can bind any host path, even one under a
    ``0700`` directory such as ``/root/.pyenv``, and the sandboxed command drops to the
    sandbox's uid through ``setpriv`` (all capabilities dropped, ``no_new_privs``) before
    ``prlimit`` applies the limits. Two alternatives were rejected: bwrap's own ``--uid``
    needs a user namespace that maps the sandbox uid to the *caller's* uid, which for root is
    uid 0 again (exempt); and running bwrap unprivileged as the sandbox uid cannot bind paths
    that uid cannot reach. As a non-root user, sandboxed processes keep the user's uid (bwrap
    makes an unprivileged user namespace), and ``RLIMIT_NPROC`` is set to the user's task count
    at start plus ``max_procs``: a fork bomb is stopped, but until its command times out it can
    keep this user's other sandboxes (and the trainer) from starting processes. Run as root or
    give the trainer its own user when that matters.

Leaks
    Directories are named ``<pid>.<start time>-<random>`` under one root per user
    (``$TMPDIR/tunix-sandboxes-<euid>``), so a directory whose owner died (even by SIGKILL) is
    recognised and removed by :func:`sweep_orphans`, which a new sandbox runs (at most every
    5 s per process). Processes need no sweep: bwrap's die with this process, and under root
    a process-backend sandbox's leftovers are killed by uid when the uid is next leased.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import os
import re
import resource
import secrets
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ptyprocess

SANDBOX_WORKDIR = "/workspace"
BACKENDS = ("auto", "bwrap", "process")
UID_SLOTS = 4096
# Paths the sandbox itself provides; a read-only bind there would shadow or break them.
_RESERVED = ("/proc", "/dev", SANDBOX_WORKDIR)
_STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHM_BYTES = 64 << 20
_KILL_GRACE_S = 2.0  # how long output may still arrive after a command's tree was killed


class SandboxError(RuntimeError):
    """The sandbox cannot do what was asked: it is closed, or its backend cannot run."""


class SandboxIsolationWarning(RuntimeWarning):
    """Commands run without bwrap: resource limits only, no network or filesystem isolation."""


def _default_ro_paths() -> tuple[str, ...]:
    """System directories plus the running Python's prefixes, so ``sys.executable`` runs inside."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]
    for prefix in (sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)):
        if prefix and prefix not in paths:
            paths.append(prefix)
    return tuple(paths)


def _under(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it (both normalised absolute paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class SandboxConfig:
    """Limits and visibility of one episode's sandbox (the ``env.sandbox`` section of a run).

    ``cpu_s``: CPU seconds per process (``RLIMIT_CPU``; a long-lived shell or interpreter is
    one process for the whole episode, its commands each get their own). ``memory_mb``:
    address space per process (``RLIMIT_AS``). ``max_procs``: processes and threads the sandbox
    may run at once (see the module docstring for how that is enforced). ``file_size_mb``:
    largest file a process may write (``RLIMIT_FSIZE``; total disk use is not limited).
    ``timeout_s``: default wall-clock limit of one command. ``network``: keep the host's
    network (default: none, only a private loopback). ``ro_paths``: host paths visible
    read-only at the same path (missing ones are skipped; default: system directories and
    this Python's prefixes). ``backend``: ``"auto"``, ``"bwrap"`` or ``"process"``.
    ``uid_base``: first uid of the range sandboxes run as when this process is root.
    """

    cpu_s: int = 30
    memory_mb: int = 2048
    max_procs: int = 64
    file_size_mb: int = 64
    timeout_s: float = 30.0
    network: bool = False
    ro_paths: tuple[str, ...] = field(default_factory=_default_ro_paths)
    backend: str = "auto"
    uid_base: int = 200_000

    def __post_init__(self) -> None:
        for name in ("cpu_s", "memory_mb", "max_procs", "file_size_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxConfig.{name} must be a positive integer, got {value!r}")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise ValueError(f"SandboxConfig.timeout_s must be a positive number, got {timeout!r}")
        if not isinstance(self.network, bool):
            raise ValueError(f"SandboxConfig.network must be true or false, got {self.network!r}")
        if self.backend not in BACKENDS:
            raise ValueError(
                f"SandboxConfig.backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        base = self.uid_base
        if (
            isinstance(base, bool)
            or not isinstance(base, int)
            or not (1000 <= base and base + UID_SLOTS < 2**32 - 2)
        ):
            raise ValueError(
                f"SandboxConfig.uid_base must be an integer >= 1000 with room for {UID_SLOTS} "
                f"uids below 2**32 - 2, got {base!r}"
            )
        paths = self.ro_paths
        if isinstance(paths, str) or not isinstance(paths, Sequence):
            raise ValueError(f"SandboxConfig.ro_paths must be a list of paths, got {paths!r}")
        clean: list[str] = []
        for path in paths:
            if not isinstance(path, str) or not path.startswith("/"):
                raise ValueError(
                    f"SandboxConfig.ro_paths entries must be absolute paths, got {path!r}"
                )
            if ".." in path.split("/"):
                raise ValueError(f"SandboxConfig.ro_paths entry {path!r} must not contain '..'")
            norm = os.path.normpath(path)
            if norm in ("/", "/tmp") or any(_under(norm, r) for r in _RESERVED):
                raise ValueError(
                    f"SandboxConfig.ro_paths entry {path!r} collides with a path the sandbox "
                    f"provides itself (/, /tmp, {', '.join(_RESERVED)})"
                )
            if norm not in clean:
                clean.append(norm)
        object.__setattr__(self, "ro_paths", tuple(clean))


@dataclass(frozen=True)
class CommandResult:
    """The outcome of :meth:`Sandbox.run`.

    ``exit_code``: the command's exit status; negative ``-N`` when it was killed by signal
    ``N`` (a timeout kills with SIGKILL, and bwrap reports a signalled command as ``128+N``).
    ``output``: stdout and stderr interleaved, decoded as UTF-8 (invalid bytes replaced), with
    the middle cut out past ``max_output`` characters. ``timed_out``: the wall-clock limit
    killed it. ``seconds``: wall-clock time from start to exit.
    """

    exit_code: int
    output: str
    timed_out: bool
    seconds: float


# ------------------------------------------------------------------ bounded output capture
class OutputCapture:
    """Keeps the first and last ``limit_bytes`` of a stream and counts what fell in between.

    A command that prints gigabytes must not take gigabytes of the host's memory; the head
    and tail are what a reader of the output needs.
    """

    def __init__(self, limit_bytes: int):
        self.limit = max(1, int(limit_bytes))
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.limit
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self, max_chars: int) -> str:
        """The captured text, middle-truncated to ``max_chars`` with a marker."""
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        return truncate_middle(head, max_chars, dropped=self.dropped, tail=tail)


def truncate_middle(text: str, max_chars: int, *, dropped: int = 0, tail: str = "") -> str:
    """``text + tail`` cut to about ``max_chars`` characters by removing the middle.

    The cut is marked ``[... N characters truncated ...]`` (``N`` counts ``dropped`` too:
    characters a capture already discarded, counted as bytes).
    """
    joined_len = len(text) + len(tail)
    if joined_len <= max_chars and not dropped:
        return text + tail
    full = text + tail
    keep = max(0, max_chars)
    head_n = keep // 2
    tail_n = keep - head_n
    if joined_len <= max_chars:
        head_part, tail_part = text, tail
    else:
        head_part = full[:head_n]
        tail_part = full[len(full) - tail_n :] if tail_n else ""
    cut = joined_len - len(head_part) - len(tail_part) + dropped
    return f"{head_part}\n[... {cut} characters truncated ...]\n{tail_part}"


# ------------------------------------------------------------------------ host helpers
_LIBC: Any = None
_PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _start_time(pid: int) -> int | None:
    """The start time (clock ticks since boot) of ``pid``, None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    try:
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (ValueError, IndexError):
        return None


def _uid_tasks(uid: int) -> tuple[list[int], int]:
    """Pids whose real uid is ``uid``, and their total thread count (what RLIMIT_NPROC counts)."""
    pids: list[int] = []
    threads = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return pids, threads
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                status = f.read()
        except OSError:
            continue
        real_uid = count = None
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                count = int(line.split()[1])
        if real_uid == uid:
            pids.append(int(name))
            threads += count or 1
    return pids, threads


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (root only; ``uid`` must not be 0).

    A child drops to ``uid`` and calls ``kill(-1, SIGKILL)``, which reaches exactly that
    uid's processes (never the caller itself), repeated until none is left, so that even a
    fork bomb racing the kill runs out.
    """
    if uid == 0 or os.geteuid() != 0 or not _uid_tasks(uid)[0]:
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the forked child
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(1000):
                try:
                    os.kill(-1, signal.SIGKILL)
                except ProcessLookupError:
                    break
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _sandboxes_root() -> Path:
    """``$TMPDIR/tunix-sandboxes-<euid>``: created ``0711``, and refused if someone else owns it."""
    root = Path(tempfile.gettempdir()) / f"tunix-sandboxes-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        root.mkdir(mode=0o711)
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise SandboxError(
            f"{root} is not a directory owned by uid {os.geteuid()} and writable only by it; "
            "remove it or set TMPDIR"
        )
    return root


_DIR_NAME = re.compile(r"^(\d+)\.(\d+)-[0-9a-f]+$")


def _rmtree(path: Path) -> None:
    """Removes a tree whose sandboxed owner may have chmod-ed parts of it to 000."""

    def fix(func: Callable[..., Any], p: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, ignore_errors=True)
            else:
                func(p)

    shutil.rmtree(path, onerror=fix)


def sweep_orphans(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Removes sandbox directories whose owning process has died; returns the removed paths.

    A directory's owner is alive when a process with its pid and start time exists, so a
    reused pid does not keep a dead owner's directory. Under root, processes still running
    as a dead sandbox's uid (possible only with the ``process`` backend) are killed first.
    Safe to run from several processes at once (a directory is renamed before removal).
    """
    base = Path(root) if root is not None else _sandboxes_root()
    removed: list[Path] = []
    alive: dict[int, int | None] = {}
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.name.startswith(".trash-"):  # a sweeper died mid-way, or is removing it now
            _rmtree(Path(entry.path))
            continue
        match = _DIR_NAME.match(entry.name)
        if not match:
            continue
        pid, started = int(match.group(1)), int(match.group(2))
        if pid not in alive:  # many directories share an owner: read its start time once
            alive[pid] = _start_time(pid)
        if alive[pid] == started:
            continue
        trash = base / f".trash-{secrets.token_hex(6)}"
        try:
            os.rename(entry.path, trash)
        except OSError:  # another sweeper took it
            continue
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                uid = (trash / "work").lstat().st_uid
                _reclaim_uid(base, uid)
        _rmtree(trash)
        removed.append(Path(entry.path))
    return removed


_SWEEP_EVERY_S = 5.0  # a new sandbox sweeps when the last sweep is older than this
_LAST_SWEEP = -float("inf")


# --------------------------------------------------------------------------- uid leases
_HELD_UIDS: set[int] = set()
_UID_LOCK = threading.Lock()


def _lock_uid(base: Path, uid: int) -> int | None:
    """An fd holding the exclusive lock of ``uid``, or None if someone holds it."""
    locks = base / ".uids"
    with contextlib.suppress(FileExistsError):
        locks.mkdir(mode=0o700)
    fd = os.open(locks / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _reclaim_uid(base: Path, uid: int) -> None:
    """Kills leftover processes of a sandbox uid nobody holds (a dead owner's)."""
    if uid == 0 or uid in _HELD_UIDS:
        return
    fd = _lock_uid(base, uid)
    if fd is None:
        return
    try:
        _kill_uid(uid)
    finally:
        os.close(fd)


def _lease_uid(base: Path, first: int) -> tuple[int, int]:
    """Claims a free uid in ``first .. first+UID_SLOTS-1``: ``(uid, lock fd)``.

    The lock is an ``flock`` on ``<root>/.uids/<uid>``: the kernel drops it when its holder
    dies, so a crashed trainer's uids are free again; a claimed uid's leftover processes
    (from such a crash) are killed before it is used.
    """
    with _UID_LOCK:
        for uid in range(first, first + UID_SLOTS):
            if uid in _HELD_UIDS:
                continue
            fd = _lock_uid(base, uid)
            if fd is None:
                continue
            _HELD_UIDS.add(uid)
            break
        else:
            raise SandboxError(f"all {UID_SLOTS} sandbox uids from {first} are in use")
    _kill_uid(uid)
    return uid, fd


# ------------------------------------------------------------------------ bwrap probe
_PROBE: dict[str, str | None] = {}
_PROBE_LOCK = threading.Lock()


def _tool(name: str) -> str | None:
    return shutil.which(name, path=_STANDARD_PATH)


def bwrap_problem() -> str | None:
    """Why the bwrap backend cannot run here (None: it can). Probed once per process.

    The probe runs ``true`` in a sandbox with the same options as a real one (as root:
    privileged bwrap, then ``setpriv`` to a non-root uid, then ``prlimit``).
    """
    with _PROBE_LOCK:
        if "result" in _PROBE:
            return _PROBE["result"]
        _PROBE["result"] = result = _probe_bwrap()
        return result


def _probe_bwrap() -> str | None:
    missing = [
        t for t in ("bwrap", "prlimit") + (("setpriv",) if _is_root() else ()) if not _tool(t)
    ]
    if missing:
        return f"{' and '.join(missing)} not found on {_STANDARD_PATH}"
    with tempfile.TemporaryDirectory(prefix="tunix-bwrap-probe-") as tmp:
        work, scratch = Path(tmp) / "work", Path(tmp) / "tmp"
        work.mkdir()
        scratch.mkdir()
        uid = 65534 if _is_root() else None
        if uid is not None:
            os.chown(work, uid, uid)
            os.chown(scratch, uid, uid)
        prefix = _bwrap_prefix(SandboxConfig(), work, scratch, uid, nproc=16, pty=False)
        try:
            done = subprocess.run(
                [*prefix, "true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                env={"PATH": _STANDARD_PATH},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the bwrap probe failed: {exc}"
    if done.returncode != 0:
        text = (done.stdout + done.stderr).decode("utf-8", "replace").strip()
        return f"the bwrap probe exited {done.returncode}: {text[:500]}"
    return None


def _is_root() -> bool:
    return os.geteuid() == 0


# ------------------------------------------------------------------- command building
def _sandbox_env(config: SandboxConfig, tmpdir: str, home: str) -> dict[str, str]:
    """The environment of sandboxed processes: nothing of the host's but what is listed here."""
    python_bin = os.path.dirname(sys.executable)
    covered = any(_under(python_bin, p) for p in config.ro_paths)
    return {
        "PATH": f"{python_bin}:{_STANDARD_PATH}" if covered else _STANDARD_PATH,
        "HOME": home,
        "TMPDIR": tmpdir,
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        # Thread pools sized to the host's cores would blow max_procs (threads count too).
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        # An edit within the same second as a run keeps a file's mtime and size: a cached
        # .pyc would then hide the edit from the next run.
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _limits(config: SandboxConfig, nproc: int) -> list[tuple[int, tuple[int, int]]]:
    """(resource, (soft, hard)) pairs; CPU's hard limit is a second later (SIGXCPU, then KILL).

    Without root no limit can exceed this process's own hard limit, so they are capped there.
    """
    mb = 1 << 20
    wanted = [
        (resource.RLIMIT_CPU, (config.cpu_s, config.cpu_s + 1)),
        (resource.RLIMIT_AS, (config.memory_mb * mb, config.memory_mb * mb)),
        (resource.RLIMIT_FSIZE, (config.file_size_mb * mb, config.file_size_mb * mb)),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    if _is_root():
        return wanted
    out = []
    for res, (soft, hard) in wanted:
        cap = resource.getrlimit(res)[1]
        if cap != resource.RLIM_INFINITY:
            soft, hard = min(soft, cap), min(hard, cap)
        out.append((res, (soft, hard)))
    return out


def _bwrap_prefix(
    config: SandboxConfig, work: Path, scratch: Path, uid: int | None, *, nproc: int, pty: bool
) -> list[str]:
    """The host argv before the sandboxed command: ``bwrap ... -- [setpriv ...] prlimit ... --``."""
    argv = [_tool("bwrap") or "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc"]
    argv += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox"]
    if not config.network:
        argv.append("--unshare-net")
    if not pty:
        # A new session: the command cannot reach a terminal it inherited (TIOCSTI). The
        # tools' pseudo-terminal is the sandbox's own, and job control needs it as the
        # controlling terminal, so a pty keeps its session.
        argv.append("--new-session")
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--perms", "1777", "--size", str(_SHM_BYTES), "--tmpfs", "/dev/shm"]
    argv += ["--bind", str(work), SANDBOX_WORKDIR, "--bind", str(scratch), "/tmp"]
    bound: list[str] = []  # binds and symlinks: they cover everything below them
    dirs: set[str] = set()  # directories made for binds below them
    for path in sorted(config.ro_paths, key=lambda p: (p.count("/"), p)):
        if any(_under(path, b) for b in bound):
            continue
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
            bound.append(path)
            continue
        if not os.path.exists(path):
            continue
        # bwrap would make a missing parent with the parent's host mode (/root: 0700), which
        # hides the bind from the sandbox uid: parents are made world-searchable explicitly.
        parent = os.path.dirname(path)
        ancestors: list[str] = []
        while parent not in ("/", ""):
            ancestors.append(parent)
            parent = os.path.dirname(parent)
        for anc in reversed(ancestors):
            if anc not in dirs and not any(_under(anc, b) for b in bound):
                argv += ["--perms", "0755", "--dir", anc]
                dirs.add(anc)
        argv += ["--ro-bind", path, path]
        bound.append(path)
    argv += ["--chdir", SANDBOX_WORKDIR, "--clearenv"]
    for key, value in _sandbox_env(config, "/tmp", SANDBOX_WORKDIR).items():
        argv += ["--setenv", key, value]
    argv.append("--")
    if uid is not None:
        argv += [_tool("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={uid}"]
        argv += ["--clear-groups", "--inh-caps=-all", "--no-new-privs", "--"]
        # bwrap keeps root's capabilities for setpriv: only those it needs (and, to chdir into
        # the sandbox uid's 0700 working directory, read-search). Dropping to a non-zero uid
        # clears them all before the command runs.
        caps = ("CAP_SETUID", "CAP_SETGID", "CAP_DAC_READ_SEARCH")
        argv[1:1] = ["--cap-drop", "ALL", *[a for c in caps for a in ("--cap-add", c)]]
    argv.append(_tool("prlimit") or "prlimit")
    names = {
        resource.RLIMIT_CPU: "--cpu",
        resource.RLIMIT_AS: "--as",
        resource.RLIMIT_FSIZE: "--fsize",
        resource.RLIMIT_NPROC: "--nproc",
        resource.RLIMIT_CORE: "--core",
    }
    for res, (soft, hard) in _limits(config, nproc):
        argv.append(f"{names[res]}={soft}:{hard}")
    argv.append("--")
    return argv


def _process_preexec(
    limits: list[tuple[int, tuple[int, int]]], uid: int | None
) -> Callable[[], None]:
    """The child-side set-up of the ``process`` backend: limits, uid, parent-death signal.

    Runs between fork and exec, so it only makes system calls on values prepared here.
    The parent-death signal is set last: a uid change clears it.
    """
    libc = _libc()
    parent = os.getpid()

    def preexec() -> None:
        for res, value in limits:
            resource.setrlimit(res, value)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return preexec


# ------------------------------------------------------------------------- processes
class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus a future set as soon as the process exits.

    ``Process.wait()`` (Python 3.11) also waits for every pipe to close, which a background
    process that inherited stdout can delay for as long as it lives.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=limit, loop=loop)
        self.exit_future: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit_future.done():
            self.exit_future.set_result(None)


class SandboxProcess(asyncio.subprocess.Process):
    """An asyncio process whose :meth:`exited` does not wait for its pipes to close."""

    async def exited(self) -> int:
        """Waits until the process has exited (and was reaped); returns its exit status."""
        await asyncio.shield(self._protocol.exit_future)
        return self.returncode if self.returncode is not None else -signal.SIGKILL

    def close_pipes(self) -> None:
        """Closes this process's pipes and transport (idempotent; kills it if still running)."""
        self._transport.close()


# ------------------------------------------------------------------------- resources
class _Resources:
    """What a sandbox must release: its processes, directory and uid lease.

    Kept apart from :class:`Sandbox` so a finalizer can release them when a sandbox is
    dropped without :meth:`Sandbox.close` (at the latest at interpreter exit).
    """

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.uid: int | None = None
        self.uid_fd: int | None = None
        self.kill_uid = False
        self.procs: dict[int, Any] = {}  # pid -> asyncio Process | PtyProcess | Popen
        self.dying: set[int] = set()  # inits of killed sandboxes' PID namespaces
        self.released = False

    def kill(self, pid: int) -> None:
        """SIGKILLs a tracked process's group, and the PID namespace its bwrap made.

        bwrap's first child is the namespace's init, whose death kills every process in the
        namespace; the kernel lets that init exit only once they are all gone, so waiting for
        it (:meth:`wait_dying`) waits for the whole sandboxed tree.
        """
        self.prune()
        handle = self.procs.get(pid)
        if handle is None or not _running(handle):
            return
        for child in _children(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
            self.dying.add(child)
        _killpg(pid)

    def prune(self) -> None:
        """Forgets inits that are gone (soon after a kill), before their pids can be reused."""
        if self.dying:
            self.dying = {pid for pid in self.dying if not _gone(pid)}

    def wait_dying(self, timeout: float) -> None:
        """Waits (blocking) until the namespaces of killed processes are gone."""
        deadline = time.monotonic() + timeout
        while self.dying and time.monotonic() < deadline:
            self.dying = {pid for pid in self.dying if not _gone(pid)}
            if self.dying:
                time.sleep(0.005)

    async def wait_dying_async(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.dying and time.monotonic() < deadline:
            self.dying = {pid for pid in self.dying if not _gone(pid)}
            if self.dying:
                await asyncio.sleep(0.005)

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        for pid in list(self.procs):
            self.kill(pid)
        for pid, handle in list(self.procs.items()):
            _reap(handle)
            self.procs.pop(pid, None)
        self.wait_dying(5.0)
        if self.kill_uid and self.uid is not None:
            _kill_uid(self.uid)
        if self.dir is not None:
            _rmtree(self.dir)
        if self.uid_fd is not None:
            _HELD_UIDS.discard(self.uid or -1)
            os.close(self.uid_fd)
            self.uid_fd = None


def _children(pid: int) -> list[int]:
    """The children of ``pid`` (of its main thread, which is where bwrap forks)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (no such process, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return True
    return data[data.rindex(b")") + 2 : data.rindex(b")") + 3] in (b"Z", b"X")


def _killpg(pgid: int) -> None:
    """SIGKILLs a process group; a pgid is not reused while any member of the group lives."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _running(handle: Any) -> bool:
    if isinstance(handle, ptyprocess.PtyProcess):
        return not handle.terminated
    return handle.returncode is None


def _reap(handle: Any) -> None:
    """Collects a killed process (asyncio's own watcher collects asyncio processes)."""
    if isinstance(handle, ptyprocess.PtyProcess):
        with contextlib.suppress(Exception):
            if not handle.terminated:
                handle.wait()
        _close_pty(handle)
    elif isinstance(handle, subprocess.Popen):
        with contextlib.suppress(Exception):
            handle.wait(timeout=5)


def _unwatch(handle: ptyprocess.PtyProcess) -> None:
    """Removes the running loop's reader and writer of a pty before its fd is closed.

    A callback left on a closed fd number would fire for whatever file reuses it.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if not handle.closed and handle.fd >= 0:
        loop.remove_reader(handle.fd)
        loop.remove_writer(handle.fd)


def _close_pty(handle: ptyprocess.PtyProcess) -> None:
    """Closes a pty's master side without ptyprocess's close(), which sleeps and re-signals."""
    if not handle.closed:
        with contextlib.suppress(OSError):
            handle.fileobj.close()
        handle.fd = -1
        handle.closed = True


# ---------------------------------------------------------------------------- sandbox
class Sandbox:
    """One episode's sandbox; see the module docstring for what it isolates and how.

    ``Sandbox(config)`` allocates nothing; ``await sandbox.start()`` (or ``await
    Sandbox.create(config)``, or ``async with Sandbox(config) as sandbox``) makes its
    directory and picks the backend. After that: :attr:`workdir` (host path of the working
    directory), :attr:`cwd` (the same directory as the sandbox's commands see it),
    :attr:`backend` (``"bwrap"`` or ``"process"``), :attr:`uid` (the uid commands run as;
    None: this process's), :attr:`python` (an interpreter that runs inside, None if none:
    this process's own when the sandbox can reach it, else the system's ``python3``, as for
    the process backend under root, whose sandbox uid cannot enter ``/root``), :attr:`start_s`
    (seconds :meth:`start` took). ``await close()`` kills everything the sandbox started,
    waits until it is gone and removes the directory; it is idempotent. A sandbox dropped
    without ``close`` is released at garbage collection or interpreter exit.

    Processes are started from the calling thread, and the kernel's parent-death signal
    (bwrap's ``--die-with-parent``, the process backend's ``PR_SET_PDEATHSIG``) fires when
    *that thread* exits: start them from the event loop's thread (as the async methods do)
    or another thread that lives as long as the sandbox.
    """

    def __init__(self, config: SandboxConfig | None = None):
        self.config = config if config is not None else SandboxConfig()
        if not isinstance(self.config, SandboxConfig):
            raise TypeError(f"config must be a SandboxConfig, got {type(self.config).__name__}")
        self.backend: str | None = None
        self.workdir: Path | None = None
        self.cwd: str | None = None
        self.uid: int | None = None
        self.python: str | None = None
        self.start_s: float | None = None
        self._tmp: Path | None = None
        self._nproc = self.config.max_procs
        self._prefix: dict[bool, list[str]] = {}
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.release)
        self._closing = False

    # ---------------------------------------------------------------- lifecycle
    @classmethod
    async def create(cls, config: SandboxConfig | None = None) -> Sandbox:
        """A started sandbox (see :meth:`start`)."""
        return await cls(config).start()

    async def start(self) -> Sandbox:
        """Chooses the backend, sweeps orphans, makes the directory; returns ``self``.

        Raises :class:`SandboxError` when ``backend="bwrap"`` cannot run here, and warns
        (:class:`SandboxIsolationWarning`) when commands will run without bwrap.
        """
        if self._closing:
            raise SandboxError("the sandbox is closed")
        if self.backend is not None:
            return self
        t0 = time.perf_counter()
        wanted = self.config.backend
        problem = None
        if wanted != "process":
            problem = await asyncio.get_running_loop().run_in_executor(None, bwrap_problem)
            if problem is not None and wanted == "bwrap":
                raise SandboxError(f"the bwrap sandbox backend is unavailable: {problem}")
        backend = "bwrap" if wanted != "process" and problem is None else "process"
        if backend == "process":
            reason = f"bwrap is unavailable ({problem})" if problem else "backend='process'"
            warnings.warn(
                f"sandboxed commands run as plain subprocesses because {reason}: resource "
                "limits apply, but there is NO network or filesystem isolation",
                SandboxIsolationWarning,
                stacklevel=1,  # one location: shown once per process by default
            )
        # Off the loop: a sweep may remove a dead episode's large tree.
        await asyncio.get_running_loop().run_in_executor(None, self._setup_dirs, backend)
        self.backend = backend
        self.cwd = SANDBOX_WORKDIR if backend == "bwrap" else str(self.workdir)
        self.python = self._find_python()
        self.start_s = time.perf_counter() - t0
        return self

    def _setup_dirs(self, backend: str) -> None:
        root = _sandboxes_root()
        global _LAST_SWEEP
        if time.monotonic() - _LAST_SWEEP > _SWEEP_EVERY_S:
            _LAST_SWEEP = time.monotonic()
            sweep_orphans(root)
        res = self._res
        if _is_root():
            res.uid, res.uid_fd = _lease_uid(root, self.config.uid_base)
            self.uid = res.uid
            # Escapees of a process-backend command (a new session) are found by their uid.
            res.kill_uid = backend == "process"
        else:
            # RLIMIT_NPROC counts all of this user's tasks: allow max_procs more than now.
            self._nproc = _uid_tasks(os.getuid())[1] + self.config.max_procs
        name = f"{os.getpid()}.{_start_time(os.getpid()) or 0}-{secrets.token_hex(6)}"
        res.dir = root / name
        res.dir.mkdir(mode=0o711)
        self.workdir = res.dir / "work"
        self._tmp = res.dir / "tmp"
        for sub in (self.workdir, self._tmp):
            sub.mkdir(mode=0o700)
            if self.uid is not None:
                os.chown(sub, self.uid, self.uid)

    def _find_python(self) -> str | None:
        """An interpreter the sandbox can run: this one if visible and reachable, else python3."""
        candidates = [sys.executable, shutil.which("python3", path=_STANDARD_PATH)]
        for path in candidates:
            if not path:
                continue
            real = os.path.realpath(path)
            if self.backend == "bwrap":
                roots = self.config.ro_paths
                if any(_under(path, r) for r in roots) and any(_under(real, r) for r in roots):
                    return path
            elif self.uid is None or (_world_reachable(path) and _world_reachable(real)):
                return path
        return None

    async def __aenter__(self) -> Sandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closing

    async def close(self) -> None:
        """Kills every process this sandbox started and removes its directory. Idempotent."""
        if self._closing and self._res.released:
            return
        self._closing = True
        res = self._res
        spawned = [h for h in res.procs.values() if isinstance(h, SandboxProcess)]
        for handle in res.procs.values():
            if isinstance(handle, ptyprocess.PtyProcess):
                _unwatch(handle)
        for pid in list(res.procs):
            res.kill(pid)
        # asyncio's child watcher collects what was just killed; then its pipes can close.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await asyncio.gather(*(h.exited() for h in spawned))
        for handle in spawned:
            handle.close_pipes()
        await res.wait_dying_async(5.0)
        await asyncio.get_running_loop().run_in_executor(None, self._finalizer)

    def close_sync(self) -> None:
        """:meth:`close` for code without an event loop (the CLI, a finalizer)."""
        self._closing = True
        self._finalizer()

    # ---------------------------------------------------------------- commands
    def _check(self) -> None:
        if self._closing:
            raise SandboxError("the sandbox is closed")
        if self.backend is None:
            raise SandboxError("the sandbox is not started (await sandbox.start())")

    def command(self, argv: Sequence[str] | str, *, pty: bool = False) -> list[str]:
        """The full host argv that runs ``argv`` in this sandbox (a str runs with ``/bin/sh -c``).

        For bwrap this is self-contained (limits, uid and environment are in it), so running
        it is running what the tools run; the ``process`` backend also needs
        :meth:`popen`'s environment, working directory and pre-exec step.
        """
        self._check()
        args = ["/bin/sh", "-c", argv] if isinstance(argv, str) else [str(a) for a in argv]
        if not args:
            raise ValueError("empty command")
        if self.backend == "process":
            exe = shutil.which(args[0], path=self._env()["PATH"]) or args[0]
            return [exe, *args[1:]]
        if pty not in self._prefix:
            assert self.workdir is not None and self._tmp is not None
            self._prefix[pty] = _bwrap_prefix(
                self.config, self.workdir, self._tmp, self.uid, nproc=self._nproc, pty=pty
            )
        return [*self._prefix[pty], *args]

    def _env(self) -> dict[str, str]:
        if self.backend == "bwrap":  # bwrap sets the sandbox's own (--clearenv, --setenv)
            return {"PATH": _STANDARD_PATH, "LANG": "C.UTF-8"}
        return _sandbox_env(self.config, str(self._tmp), str(self.workdir))

    def _launch_kwargs(self) -> dict[str, Any]:
        """Popen keyword arguments shared by every launch (environment, cwd, pre-exec)."""
        if self.backend == "bwrap":
            return {"env": self._env(), "cwd": "/"}
        preexec = _process_preexec(_limits(self.config, self._nproc), self.uid)
        return {"env": self._env(), "cwd": str(self.workdir), "preexec_fn": preexec}

    def popen(self, argv: Sequence[str] | str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Starts ``argv`` in the sandbox with :class:`subprocess.Popen` (stdio as given).

        The process is tracked: :meth:`close` kills it. Used by the ``sandbox`` CLI command.
        """
        host = self.command(argv)
        proc = subprocess.Popen(host, start_new_session=True, **self._launch_kwargs(), **kwargs)
        self._res.procs[proc.pid] = proc
        return proc

    async def spawn(
        self,
        argv: Sequence[str] | str,
        *,
        stdin: int | None = subprocess.PIPE,
        stdout: int | None = subprocess.PIPE,
        stderr: int | None = subprocess.STDOUT,
        limit: int = 1 << 20,
    ) -> SandboxProcess:
        """Starts a long-lived process in the sandbox with asyncio pipes; tracked until close.

        Stop it early with :meth:`kill`. Raises :class:`SandboxError` if the sandbox is closed
        or the launch fails.
        """
        host = self.command(argv)
        try:
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.subprocess_exec(
                lambda: _ExitProtocol(limit=limit, loop=loop),
                *host,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                **self._launch_kwargs(),
            )
            proc = SandboxProcess(transport, protocol, loop)
        except OSError as exc:
            raise SandboxError(f"cannot start {shlex.join(host[-3:])}: {exc}") from exc
        self._res.procs[proc.pid] = proc
        if self._closing:  # closed while starting
            self.kill(proc)
        return proc

    def spawn_pty(
        self, argv: Sequence[str], *, dimensions: tuple[int, int] = (40, 200)
    ) -> ptyprocess.PtyProcess:
        """Starts ``argv`` in the sandbox on a new pseudo-terminal (its controlling terminal).

        Tracked until :meth:`close`; stop it early with :meth:`kill`. Raises
        :class:`SandboxError` if the sandbox is closed or the launch fails.
        """
        host = self.command(argv, pty=True)
        kwargs = self._launch_kwargs()
        try:
            proc = ptyprocess.PtyProcess.spawn(
                host,
                cwd=kwargs["cwd"],
                env=kwargs["env"],
                preexec_fn=kwargs.get("preexec_fn"),
                dimensions=dimensions,
            )
        except Exception as exc:  # ptyprocess re-raises the child's exec error by name
            raise SandboxError(f"cannot start {shlex.join([str(a) for a in argv])}: {exc}") from exc
        proc.delayafterclose = proc.delayafterterminate = 0.0
        self._res.procs[proc.pid] = proc
        return proc

    def kill(self, proc: Any) -> None:
        """SIGKILLs a process from :meth:`spawn`, :meth:`spawn_pty` or :meth:`popen`, and its tree.

        A pty process is also reaped, its terminal closed and it is forgotten; an asyncio
        process is forgotten once it was reaped (:meth:`terminate` waits for that). Killing a
        finished or unknown process does nothing.
        """
        pid = proc.pid
        self._res.kill(pid)
        if isinstance(proc, ptyprocess.PtyProcess):
            _unwatch(proc)
            _reap(proc)
            self.forget(proc)
        elif not _running(proc):
            self.forget(proc)

    async def terminate(self, proc: SandboxProcess) -> None:
        """Kills a process from :meth:`spawn` and its tree, waits for it and forgets it."""
        self._res.kill(proc.pid)
        await proc.exited()
        self.forget(proc)

    def forget(self, proc: Any) -> None:
        """Stops tracking a process that has exited and was reaped (and closes its pipes)."""
        self._res.procs.pop(proc.pid, None)
        self._res.prune()
        if isinstance(proc, SandboxProcess):
            proc.close_pipes()

    async def run(
        self,
        cmd: Sequence[str] | str,
        *,
        timeout: float | None = None,
        input: bytes | str | None = None,
        max_output: int = 1_000_000,
    ) -> CommandResult:
        """Runs one command to completion; a str runs with ``/bin/sh -c``.

        ``timeout`` (default: the config's ``timeout_s``) bounds the wall-clock time; on
        expiry the command's whole process tree is killed and ``timed_out`` is set. ``input``
        is written to its stdin (default: empty). Output beyond ``max_output`` characters is
        cut from the middle. Background processes a command leaves behind are killed when it
        exits. Raises :class:`SandboxError` if the sandbox is closed or the launch fails.
        """
        limit = self.config.timeout_s if timeout is None else timeout
        start = time.perf_counter()
        proc = await self.spawn(
            cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL
        )
        capture = OutputCapture(max(4 * max_output, 4096))

        async def pump() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(65536):
                capture.feed(chunk)

        async def feed() -> None:
            assert proc.stdin is not None
            data = input.encode() if isinstance(input, str) else input
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                proc.stdin.write(data or b"")
                await proc.stdin.drain()
                proc.stdin.close()

        reader = asyncio.ensure_future(pump())
        writer = asyncio.ensure_future(feed()) if input is not None else None
        timed_out = False
        try:
            try:
                async with asyncio.timeout(limit):
                    await proc.exited()
            except TimeoutError:
                timed_out = True
            # Kill what is left: the tree on timeout, background leftovers otherwise (bwrap's
            # PID namespace ends with its command; a process group outlives its leader).
            self._res.kill(proc.pid)
            await proc.exited()
            if self.backend == "process":
                _killpg(proc.pid)
            try:
                async with asyncio.timeout(_KILL_GRACE_S):
                    await asyncio.shield(reader)
            except TimeoutError:  # an escaped process still holds the pipe
                pass
        finally:
            self._res.kill(proc.pid)
            for task in (reader, writer):
                if task is not None and not task.done():
                    task.cancel()
            if proc.returncode is not None:
                self.forget(proc)
        code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
        return CommandResult(
            exit_code=code,
            output=capture.text(max_output),
            timed_out=timed_out,
            seconds=time.perf_counter() - start,
        )

    # ------------------------------------------------------------------ files
    def resolve(self, path: str) -> tuple[int, str]:
        """Opens the directory that holds ``path`` inside the working directory, safely.

        Returns ``(dir_fd, name)``: an ``O_PATH`` descriptor of the containing directory (the
        caller closes it) and the last component (which may not exist yet; open it with
        ``dir_fd`` and ``O_NOFOLLOW``; ``"."`` when ``path`` names a directory itself, as
        ``"."`` names the working directory). ``path`` is relative to the working directory or
        absolute under :attr:`cwd`. ``..`` components and symlinks that lead outside are
        rejected with ``ValueError``; symlinks inside are followed (an absolute target is
        read as an in-sandbox path, never the host's), and each directory is opened with
        ``O_NOFOLLOW``, so a link swapped in concurrently cannot redirect the walk outside.
        A missing parent directory raises ``FileNotFoundError`` (:meth:`resolve_for_write`
        creates it).
        """
        return self._resolve(path, make_parents=False)

    def resolve_for_write(self, path: str) -> tuple[int, str]:
        """:meth:`resolve`, creating missing parent directories (owned by the sandbox's uid)."""
        return self._resolve(path, make_parents=True)

    def _resolve(self, path: str, *, make_parents: bool) -> tuple[int, str]:
        self._check()
        assert self.workdir is not None and self.cwd is not None
        parts = self._relative_parts(path) or ["."]  # "." names the working directory itself
        root_fd = os.open(self.workdir, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        stack = [root_fd]
        pending = list(parts)
        hops = 0
        try:
            while True:
                name = pending.pop(0)
                if name in ("", "."):
                    if not pending:
                        return stack.pop(), "."
                    continue
                if name == "..":  # only from a symlink's target: stays lexically inside
                    if len(stack) == 1:
                        raise ValueError(f"{path!r} leads outside the working directory")
                    os.close(stack.pop())
                    continue
                try:
                    st = os.stat(name, dir_fd=stack[-1], follow_symlinks=False)
                except FileNotFoundError:
                    st = None
                if st is not None and stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > 40:
                        raise ValueError(f"{path!r}: too many levels of symbolic links")
                    target = os.readlink(name, dir_fd=stack[-1])
                    if target.startswith("/"):
                        inner = self._inside(target)
                        if inner is None:
                            raise ValueError(
                                f"{path!r} is a link that leads outside the working directory"
                            )
                        for fd in stack[1:]:
                            os.close(fd)
                        del stack[1:]
                        pending = [*inner, *pending]
                    else:
                        pending = [*target.split("/"), *pending]
                    continue
                if not pending:
                    return stack.pop(), name
                if st is None:
                    if not make_parents:
                        raise FileNotFoundError(f"no such directory: {name!r} in {path!r}")
                    os.mkdir(name, 0o755, dir_fd=stack[-1])
                    if self.uid is not None:
                        os.chown(name, self.uid, self.uid, dir_fd=stack[-1], follow_symlinks=False)
                flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
                try:
                    stack.append(os.open(name, flags, dir_fd=stack[-1]))
                except NotADirectoryError:
                    raise NotADirectoryError(f"{name!r} in {path!r} is not a directory") from None
                except OSError as exc:
                    if exc.errno == errno.ELOOP:  # swapped for a link since the stat
                        raise ValueError(f"{path!r} changed while it was resolved") from None
                    raise
        finally:
            for fd in stack:
                os.close(fd)

    def _inside(self, path: str) -> list[str] | None:
        """The components of an absolute in-sandbox path under :attr:`cwd`, else None."""
        assert self.cwd is not None
        norm = os.path.normpath(path)
        if not _under(norm, self.cwd):
            return None
        rest = norm[len(self.cwd) :].strip("/")
        return rest.split("/") if rest else []

    def _relative_parts(self, path: str) -> list[str]:
        if not isinstance(path, str) or not path.strip():
            raise ValueError("path must be a non-empty string")
        if "\0" in path:
            raise ValueError("path must not contain NUL characters")
        raw = path.strip()
        if raw.startswith("/"):
            assert self.cwd is not None
            if ".." in raw.split("/"):
                raise ValueError(f"{path!r} must not contain '..'")
            inner = self._inside(raw)
            if inner is None:
                raise ValueError(f"{path!r} is outside the working directory {self.cwd}")
            return inner
        parts = raw.split("/")
        if ".." in parts:
            raise ValueError(f"{path!r} must not contain '..'")
        return [p for p in parts if p not in ("", ".")]

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """Writes a file in the working directory (parents created), owned by the sandbox's uid.

        For setting up a task before the agent starts; ``path`` as in :meth:`resolve`.
        """
        dir_fd, name = self.resolve_for_write(path)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(name, flags, mode, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "wb") as f:
            if self.uid is not None:
                os.fchown(f.fileno(), self.uid, self.uid)
            f.write(data.encode() if isinstance(data, str) else data)

    def read_file(self, path: str, *, binary: bool = False) -> str | bytes:
        """Reads a regular file of the working directory (``path`` as in :meth:`resolve`)."""
        dir_fd, name = self.resolve(path)
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
            )
        finally:
            os.close(dir_fd)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ValueError(f"{path!r} is not a regular file")
            data = f.read()
        return data if binary else data.decode("utf-8", "replace")


def _world_reachable(path: str) -> bool:
    """Whether a uid with no relation to the owners can execute ``path`` (x on every parent)."""
    try:
        real = os.path.realpath(path)
        if not os.stat(real).st_mode & 0o005 == 0o005:
            return False
        parent = os.path.dirname(real)
        while parent not in ("/", ""):
            if not os.stat(parent).st_mode & 0o001:
                return False
            parent = os.path.dirname(parent)
    except OSError:
        return False
    return True
