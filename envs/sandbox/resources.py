"""What a sandbox holds on the host, and how it is taken and released.

:func:`allocate` takes it when a sandbox starts: a uid lease under root, the directory (a
tmpfs mount point under root) with its ``work`` and ``tmp``, and the cgroups; it sweeps dead
owners' sandboxes first. :class:`_Resources` records what was taken, and the sandbox's
tracked processes, and releases them; the helpers kill a tracked process's group and the PID
namespace its bwrap made, reap it (asyncio, pty or ``Popen``) and close a pty without
ptyprocess's sleeps. Kept apart from :class:`~tunix_agentic.envs.sandbox.Sandbox` so that a
finalizer can release a dropped sandbox without holding it, and because killing and reaping
are one concern however a process was started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ptyprocess

from tunix_agentic.envs.sandbox.config import SandboxConfig, SandboxError
from tunix_agentic.envs.sandbox.host import (
    _HELD_UIDS,
    _kill_uid,
    _lease_uid,
    _rmtree,
    _sandboxes_root,
    _start_time,
    _uid_tasks,
    sweep_orphans,
)
from tunix_agentic.envs.sandbox.launch import _is_root
from tunix_agentic.envs.sandbox.limits import (
    SandboxTotals,
    make_cgroups,
    mount_scratch,
    remove_cgroups,
    unmount_scratch,
)

_SWEEP_EVERY_S = 5.0  # a new sandbox sweeps when the last sweep is older than this
_LAST_SWEEP = -float("inf")


class _Resources:
    """What a sandbox must release: its processes, cgroups, directory and uid lease.

    Kept apart from :class:`Sandbox` so a finalizer can release them when a sandbox is
    dropped without :meth:`Sandbox.close` (at the latest at interpreter exit).
    """

    def __init__(self) -> None:
        self.dir: Path | None = None
        self.mounted = False  # dir is a tmpfs of this sandbox
        self.cgroups: tuple[Path, ...] = ()
        self.uid: int | None = None
        self.uid_fd: int | None = None
        self.kill_uid = False
        self.procs: dict[int, Any] = {}  # pid -> asyncio Process | PtyProcess | Popen
        self.dying: set[int] = set()  # inits of killed sandboxes' PID namespaces
        self.released = False
        # allocate() runs in a worker thread: a release asked for meanwhile (the sandbox was
        # closed, or dropped when its start was cancelled) is left to allocate to carry out
        # once it has taken everything, so nothing it takes after the release is left behind.
        self._lock = threading.RLock()  # re-entrant: a finalizer may run in allocate's thread
        self.allocating = False

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
        """Releases everything; during :func:`allocate`, as soon as it has finished."""
        with self._lock:
            if self.released:
                return
            self.released = True
            if self.allocating:
                return
        self._release()

    def _release(self) -> None:
        for pid in list(self.procs):
            self.kill(pid)
        for pid, handle in list(self.procs.items()):
            _reap(handle)
            self.procs.pop(pid, None)
        self.wait_dying(5.0)
        if self.kill_uid and self.uid is not None:
            _kill_uid(self.uid)
        remove_cgroups(self.cgroups)  # kills what escaped the trees (a new session)
        if self.dir is not None:
            if self.mounted:
                unmount_scratch(self.dir)
            _rmtree(self.dir)
        if self.uid_fd is not None:
            _HELD_UIDS.discard(self.uid or -1)
            os.close(self.uid_fd)
            self.uid_fd = None


@dataclass(frozen=True)
class Allocation:
    """Where a started sandbox lives on the host and what bounds it (see :func:`allocate`).

    ``workdir`` and ``tmp``: host paths of its working directory and ``/tmp``. ``uid``: the
    leased uid its commands run as (None: this process's). ``nproc``: its ``RLIMIT_NPROC``.
    ``cgroup_procs``: the ``cgroup.procs`` files a command joins. ``totals``: which
    per-sandbox totals hold.
    """

    workdir: Path
    tmp: Path
    uid: int | None
    nproc: int
    cgroup_procs: tuple[str, ...]
    totals: SandboxTotals


def allocate(res: _Resources, config: SandboxConfig, backend: str) -> Allocation:
    """Takes what a sandbox of ``backend`` holds on the host, recording each piece in ``res``.

    Sweeps orphans (at most every :data:`_SWEEP_EVERY_S` per process), leases a uid under
    root, makes the directory (a tmpfs of ``disk_mb`` under root) and the cgroups. Blocking:
    run it off the event loop. What was taken before a failure is in ``res``, released with it.
    A release of ``res`` asked for while this runs happens when it returns, which then raises
    :class:`SandboxError`.
    """
    with res._lock:
        if res.released:
            raise SandboxError("the sandbox was closed before it started")
        res.allocating = True
    try:
        return _allocate(res, config, backend)
    finally:
        with res._lock:
            res.allocating = False
            late = res.released
        if late:
            res._release()
            raise SandboxError("the sandbox was closed while it started")


def _allocate(res: _Resources, config: SandboxConfig, backend: str) -> Allocation:
    root = _sandboxes_root()
    global _LAST_SWEEP
    if time.monotonic() - _LAST_SWEEP > _SWEEP_EVERY_S:
        _LAST_SWEEP = time.monotonic()
        sweep_orphans(root)
    uid = None
    nproc = config.max_procs
    if _is_root():
        res.uid, res.uid_fd = _lease_uid(root, config.uid_base)
        uid = res.uid
        # Escapees of a process-backend command (a new session) are found by their uid.
        res.kill_uid = backend == "process"
    else:
        # RLIMIT_NPROC counts all of this user's tasks: allow max_procs more than now.
        nproc = _uid_tasks(os.getuid())[1] + config.max_procs
    name = f"{os.getpid()}.{_start_time(os.getpid()) or 0}-{secrets.token_hex(6)}"
    res.dir = root / name
    res.dir.mkdir(mode=0o711)
    res.mounted = mount_scratch(res.dir, config.disk_mb)
    cgroups = make_cgroups(name, config)
    res.cgroups = cgroups.dirs
    totals = SandboxTotals(
        disk="tmpfs" if res.mounted else "per-file",
        memory=cgroups.memory or "per-process",
        processes=cgroups.pids or ("per-uid" if uid is not None else "per-user"),
        cgroups=tuple(str(d) for d in cgroups.dirs),
    )
    workdir = res.dir / "work"
    tmp = res.dir / "tmp"
    for sub in (workdir, tmp):
        sub.mkdir(mode=0o700)
        if uid is not None:
            os.chown(sub, uid, uid)
    return Allocation(workdir, tmp, uid, nproc, cgroups.procs_files, totals)


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
