"""Host-side state of sandboxes that outlives a sandbox's owner: directories and uids.

The per-user root that holds the sandboxes' directories, the sweep that removes a dead
owner's directory (:func:`sweep_orphans`), and the uid leases under root (``flock``-ed
files, claimed and released across processes) with the kill-by-uid that clears a leased
uid's leftovers. Kept apart from :mod:`~tunix_agentic.envs.sandbox.core` because it is plain
OS plumbing (``/proc``, ``flock``, ``fork`` + ``setuid``) shared by every sandbox of every
process on the host; see the package's docstring ("Processes, uids and fork bombs",
"Leaks") for why it works this way.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import re
import secrets
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tunix_agentic.envs.sandbox.config import UID_SLOTS, SandboxError
from tunix_agentic.envs.sandbox.limits import sweep_cgroups, unmount_scratch


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


def _proc_statuses() -> Iterator[tuple[int, bytes]]:
    """``(pid, /proc/PID/status)`` of every process that can still be read."""
    try:
        entries = os.listdir("/proc")
    except OSError:
        return
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                yield int(name), f.read()
        except OSError:
            continue


def _uid_tasks(uid: int) -> tuple[list[int], int]:
    """Pids whose real uid is ``uid``, and their total thread count (what RLIMIT_NPROC counts)."""
    pids: list[int] = []
    threads = 0
    for pid, status in _proc_statuses():
        real_uid = count = None
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                real_uid = int(line.split()[1])
            elif line.startswith(b"Threads:"):
                count = int(line.split()[1])
        if real_uid == uid:
            pids.append(pid)
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
    as a dead sandbox's uid (possible only with the ``process`` backend) are killed first,
    its tmpfs is unmounted and its cgroups (wherever this process makes them) are removed.
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
        unmount_scratch(entry.path)  # a mount point cannot be renamed
        trash = base / f".trash-{secrets.token_hex(6)}"
        try:
            os.rename(entry.path, trash)
        except OSError:  # another sweeper took it
            continue
        if os.geteuid() == 0:
            with contextlib.suppress(OSError):
                uid = (trash / "work").lstat().st_uid
                _reclaim_uid(uid)
        _rmtree(trash)
        removed.append(Path(entry.path))
    sweep_cgroups(lambda name: _owner_dead(name, alive))
    return removed


def _owner_dead(name: str, alive: dict[int, int | None]) -> bool:
    """Whether ``name`` is a sandbox's name whose owning process has died."""
    match = _DIR_NAME.match(name)
    if not match:
        return False
    pid = int(match.group(1))
    if pid not in alive:
        alive[pid] = _start_time(pid)
    return alive[pid] != int(match.group(2))


# --------------------------------------------------------------------------- uid leases
_HELD_UIDS: set[int] = set()
_UID_LOCK = threading.Lock()


# One directory of uid locks for the whole host, whatever a process's TMPDIR: two jobs whose
# sandboxes' roots differ must still never lease the same uid (a lease kills every process
# of its uid). Leases exist only under root, and /run is root's.
UID_LOCK_DIR = Path("/run/tunix-sandbox-uids")


def _uid_locks() -> Path:
    """:data:`UID_LOCK_DIR`, created ``0700``; refused unless root owns it alone."""
    with contextlib.suppress(FileExistsError):
        UID_LOCK_DIR.mkdir(mode=0o700, parents=True)
    st = UID_LOCK_DIR.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxError(
            f"{UID_LOCK_DIR} (the sandbox uid locks) is not a directory owned by root and "
            "writable only by it; remove it"
        )
    return UID_LOCK_DIR


def _lock_uid(uid: int) -> int | None:
    """An fd holding the host-wide exclusive lock of ``uid``, or None if someone holds it."""
    fd = os.open(_uid_locks() / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _reclaim_uid(uid: int) -> None:
    """Kills leftover processes of a sandbox uid nobody holds (a dead owner's)."""
    if uid == 0 or uid in _HELD_UIDS:
        return
    fd = _lock_uid(uid)
    if fd is None:
        return
    try:
        _kill_uid(uid)
    finally:
        os.close(fd)


_CHECKED_RANGES: set[tuple[Path, int]] = set()


def check_uid_range(base: int, slots: int = UID_SLOTS, *, root: Path | None = None) -> None:
    """Raises :class:`SandboxError` naming the uids of ``base .. base+slots-1`` that are this
    host's: leasing one would let a sandbox signal that user's processes (a lease kills every
    process of its uid) and reach their files.

    A uid is the host's when a user (``pwd.getpwall()``) or, as sandboxes run with gid =
    uid, a group has it, when ``/etc/subuid`` or ``/etc/subgid`` gives it to a user's
    containers, or when a process runs with it (real, effective, saved or filesystem uid)
    and no sandbox on this host ever leased it: a lease leaves ``<UID_LOCK_DIR>/<uid>``
    (one directory per host, whatever the ``TMPDIR``), so the range's own sandboxes, this
    process's or a concurrent trainer's, and a dead trainer's leftovers (killed by the next
    lease) pass. ``root`` is accepted for compatibility and unused. Reads ``/proc`` and the
    user database: call it off the event loop.
    """
    locks = UID_LOCK_DIR
    last = base + slots - 1
    found: list[str] = []
    found += [f"uid {p.pw_uid} ({p.pw_name})" for p in pwd.getpwall() if base <= p.pw_uid <= last]
    found += [f"gid {g.gr_gid} ({g.gr_name})" for g in grp.getgrall() if base <= g.gr_gid <= last]
    for table in ("/etc/subuid", "/etc/subgid"):
        for owner, start, count in _subid_ranges(table):
            if start <= last and start + count > base:
                found.append(f"{table} {start}..{start + count - 1} ({owner})")
    for uid, pid in sorted(_uid_owners(base, last).items()):
        if not (locks / str(uid)).exists():
            found.append(f"uid {uid} (running: pid {pid})")
    if found:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise SandboxError(
            f"sandbox uid_base={base}: its uids {base}..{last} are this host's: {shown}; a "
            f"sandbox would run as them. Choose an env.sandbox.uid_base whose {slots} uids "
            "no user, group or process uses"
        )


def _subid_ranges(path: str) -> list[tuple[str, int, int]]:
    """``(owner, first, count)`` of a subordinate id file; none if it is missing."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def _uid_owners(first: int, last: int) -> dict[int, int]:
    """``{uid: a pid}`` for uids in ``first .. last`` that some process runs with (any of its
    real, effective, saved and filesystem uids)."""
    found: dict[int, int] = {}
    for pid, status in _proc_statuses():
        for line in status.splitlines():
            if line.startswith(b"Uid:"):
                for uid in {int(v) for v in line.split()[1:]}:
                    if first <= uid <= last:
                        found.setdefault(uid, pid)
                break
    return found


def _lease_uid(base: Path, first: int) -> tuple[int, int]:
    """Claims a free uid in ``first .. first+UID_SLOTS-1``: ``(uid, lock fd)``.

    The lock is an ``flock`` on ``<UID_LOCK_DIR>/<uid>``, one per host, so jobs with different
    ``TMPDIR``s never share a uid; the kernel drops it when its holder
    dies, so a crashed trainer's uids are free again; a claimed uid's leftover processes
    (from such a crash) are killed before it is used. The first lease of a range in a
    process checks it (:func:`check_uid_range`) and raises :class:`SandboxError` if the
    host uses one of its uids.
    """
    with _UID_LOCK:
        if (base, first) not in _CHECKED_RANGES:
            check_uid_range(first, UID_SLOTS, root=base)
            _CHECKED_RANGES.add((base, first))
        for uid in range(first, first + UID_SLOTS):
            if uid in _HELD_UIDS:
                continue
            fd = _lock_uid(uid)
            if fd is None:
                continue
            _HELD_UIDS.add(uid)
            break
        else:
            raise SandboxError(f"all {UID_SLOTS} sandbox uids from {first} are in use")
    _kill_uid(uid)
    return uid, fd
