"""What a sandbox must release, and how: process trees, PID namespaces, cgroups, directory, uid.

:class:`_Resources` holds a sandbox's tracked processes, its cgroups, its directory (a tmpfs
mount point under root) and its uid lease;
the helpers kill a tracked process's group and the PID namespace its bwrap made, reap it
(asyncio, pty or ``Popen``) and close a pty without ptyprocess's sleeps. Kept apart from
:mod:`tunix_agentic.envs.sandbox` so that a finalizer can release a dropped sandbox without
holding it, and because killing and reaping are one concern however a process was started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import ptyprocess

from tunix_agentic.envs.sandbox_host import _HELD_UIDS, _kill_uid, _rmtree
from tunix_agentic.envs.sandbox_limits import remove_cgroups, unmount_scratch


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
        remove_cgroups(self.cgroups)  # kills what escaped the trees (a new session)
        if self.dir is not None:
            if self.mounted:
                unmount_scratch(self.dir)
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
