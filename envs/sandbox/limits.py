"""Per-sandbox totals: a size-capped scratch filesystem, and memory and process cgroups.

Resource limits (``RLIMIT_*``) bound one process each; what a sandbox holds *in total* is
bounded here, and :class:`SandboxTotals` says which bound holds on this host.

Disk
    As root, the sandbox's host directory (which holds its ``/workspace`` and ``/tmp``) is
    a tmpfs of ``disk_mb`` (``size=``, and ``disk_mb * 128`` inodes), mounted at start and
    lazily unmounted at close; :func:`~tunix_agentic.envs.sandbox.host.sweep_orphans`
    unmounts a dead owner's. Every bwrap instance of the sandbox binds that one directory,
    so the cap holds across its shell, interpreter and set-up commands, and a write past it
    fails with ENOSPC inside. Its pages are memory (swappable), charged to the sandbox's
    memory cgroup when the sandbox writes them: ``disk_mb`` is part of the memory total, not
    added to it. Without root nothing can be mounted, and only ``RLIMIT_FSIZE`` (per file)
    holds.
Memory and processes
    One cgroup per sandbox, named like its directory, with ``total_memory_mb`` (swap
    included where the kernel accounts it) and ``pids.max = max_procs`` plus
    :data:`PIDS_SLACK` for bwrap's own two processes per command. Cgroup v1 (a memory or
    pids hierarchy of its own): under ``tunix-sandboxes-<euid>`` in this process's own cgroup,
    so a bound the host puts on the trainer covers its sandboxes too. Cgroup v2: under the
    nearest ancestor of this process's cgroup that already hands ``memory`` and ``pids`` to
    its children, or the hierarchy's root (v2 lets no cgroup with processes of its own do
    that, so the trainer's own cgroup cannot be the parent). A command joins the cgroup
    before it starts: bwrap's argv begins with ``sh -c 'echo $$ > .../cgroup.procs && exec
    "$@"'`` (as this process's uid, before bwrap and the privilege drop), and the process
    backend's pre-exec step writes the child's pid. Where no hierarchy is writable (not
    root, nothing delegated), memory is bounded per process only (``memory_mb`` each) and
    processes by ``RLIMIT_NPROC``. Either fallback warns once per process
    (:class:`SandboxLimitWarning`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tunix_agentic.envs.sandbox.config import SandboxConfig

PIDS_SLACK = 16  # bwrap's monitor and namespace init, two per command, for 8 commands at once
_WANTED = ("memory", "pids")
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH, _UMOUNT_NOFOLLOW = 2, 8


class SandboxLimitWarning(RuntimeWarning):
    """A per-sandbox total cannot be enforced here; only the per-process limit holds."""


@dataclass(frozen=True)
class SandboxTotals:
    """Which bound holds a sandbox's totals on this host (see the module docstring).

    ``disk``: ``"tmpfs"`` (``disk_mb`` for ``/workspace`` and ``/tmp`` together) or
    ``"per-file"`` (``file_size_mb`` per file only). ``memory``: ``"cgroup-v1"`` /
    ``"cgroup-v2"`` (``total_memory_mb`` for all its processes) or ``"per-process"``
    (``memory_mb`` each). ``processes``: ``"cgroup-v1"`` / ``"cgroup-v2"`` (``pids.max``, and
    under root also ``RLIMIT_NPROC`` on the sandbox's own uid), ``"per-uid"`` (that rlimit
    only) or ``"per-user"`` (``RLIMIT_NPROC`` on the user's own count, see
    :mod:`tunix_agentic.envs.sandbox`). ``cgroups``: host paths of its cgroups.
    """

    disk: Literal["tmpfs", "per-file"]
    memory: Literal["cgroup-v1", "cgroup-v2", "per-process"]
    processes: Literal["cgroup-v1", "cgroup-v2", "per-uid", "per-user"]
    cgroups: tuple[str, ...] = ()


def total_memory_mb(config: SandboxConfig) -> int:
    """The memory bound of all of a sandbox's processes together (default: 4 x memory_mb)."""
    return config.total_memory_mb or 4 * config.memory_mb


_WARNED = False


def warn_unbounded(totals: SandboxTotals) -> None:
    """Warns once per process when a total falls back to a per-process bound."""
    global _WARNED
    lost = []
    if totals.disk == "per-file":
        lost.append("disk use only per file (file_size_mb; a size-capped tmpfs needs root)")
    if totals.memory == "per-process":
        lost.append("memory only per process (memory_mb; no writable memory cgroup)")
    if lost and not _WARNED:
        _WARNED = True
        warnings.warn(
            f"sandbox totals are not bounded on this host: {'; '.join(lost)}",
            SandboxLimitWarning,
            stacklevel=3,
        )


# ------------------------------------------------------------------------------- disk
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_scratch(path: Path, size_mb: int) -> bool:
    """Mounts a tmpfs of ``size_mb`` on ``path`` (root only); False where that is refused."""
    if os.geteuid() != 0:
        return False
    opts = f"size={size_mb}m,nr_inodes={size_mb * 128},mode=0711"
    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
    rc = libc.mount(
        b"tunix-sandbox", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()
    )
    return rc == 0


def unmount_scratch(path: str | os.PathLike[str]) -> None:
    """Lazily unmounts a sandbox's tmpfs (nothing when ``path`` is no mount point)."""
    if os.geteuid() == 0 and os.path.ismount(path):
        _libc().umount2(os.fsencode(path), _MNT_DETACH | _UMOUNT_NOFOLLOW)


# ----------------------------------------------------------------------------- cgroups
@dataclass(frozen=True)
class _Hierarchy:
    """Where one cgroup hierarchy's per-sandbox cgroups go."""

    version: Literal[1, 2]
    controllers: tuple[str, ...]  # of _WANTED, handled by this hierarchy
    parent: Path  # .../tunix-sandboxes-<euid>


@dataclass(frozen=True)
class _Candidate:
    """A hierarchy found in mountinfo, before anything is created."""

    version: Literal[1, 2]
    controllers: tuple[str, ...]
    mount: Path
    own: str  # this process's cgroup, relative to the mount ("" for the mount's root)


def _plan(mountinfo: str, proc_cgroup: str) -> list[_Candidate]:
    """The hierarchies that hold ``memory`` / ``pids``, from ``/proc/self/{mountinfo,cgroup}``.

    A v1 hierarchy names its controllers in its mount options; the v2 one (listed with
    every wanted controller no v1 mount holds) is checked for them later.
    """
    own_v1: dict[str, str] = {}
    own_v2 = None
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            own_v2 = parts[2]
        for ctrl in parts[1].split(","):
            own_v1[ctrl] = parts[2]
    v1: list[_Candidate] = []
    v2_mount: tuple[str, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        root, point = fields[3], fields[4]
        fstype, *rest = line.split(" - ", 1)[1].split()
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = (root, point)
        elif fstype == "cgroup" and rest:
            options = rest[-1].split(",")
            held = tuple(c for c in _WANTED if c in options)
            own = own_v1.get(held[0]) if held else None
            rel = _relative(own, root)
            if held and rel is not None:
                v1.append(_Candidate(1, held, Path(point), rel))
    out = v1
    rest_wanted = tuple(c for c in _WANTED if not any(c in h.controllers for h in v1))
    if rest_wanted and v2_mount is not None:
        rel = _relative(own_v2, v2_mount[0])
        if rel is not None:
            out.append(_Candidate(2, rest_wanted, Path(v2_mount[1]), rel))
    return out


def _relative(own: str | None, root: str) -> str | None:
    """``own`` (a path under the hierarchy's root) relative to a mount of ``root``."""
    if own is None:
        return None
    if root == "/":
        return own.strip("/")
    if own == root or own.startswith(root.rstrip("/") + "/"):
        return own[len(root) :].strip("/")
    return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def _parent_dir(cand: _Candidate, name: str) -> _Hierarchy | None:
    """Creates ``name`` (``tunix-sandboxes-<euid>``) where this hierarchy allows it."""
    if cand.version == 1:
        parent = cand.mount / cand.own / name
        with contextlib.suppress(OSError):
            parent.mkdir(mode=0o755)
        ok = parent.is_dir() and os.access(parent / "cgroup.procs", os.W_OK)
        return _Hierarchy(1, cand.controllers, parent) if ok else None
    try:
        available = (cand.mount / "cgroup.controllers").read_text().split()
    except OSError:
        return None
    wanted = tuple(c for c in cand.controllers if c in available)
    if not wanted:
        return None
    plus = " ".join(f"+{c}" for c in wanted)
    rel = cand.own
    while True:  # from this process's cgroup up to the root
        here = cand.mount / rel
        try:
            given = (here / "cgroup.subtree_control").read_text().split()
        except OSError:
            given = []
        if set(wanted) <= set(given) or (
            rel == "" and _write(here / "cgroup.subtree_control", plus)
        ):
            parent = here / name
            with contextlib.suppress(OSError):
                parent.mkdir(mode=0o755)
            if parent.is_dir() and _write(parent / "cgroup.subtree_control", plus):
                return _Hierarchy(2, wanted, parent)
            return None
        if rel == "":
            return None
        rel = os.path.dirname(rel)


_LAYOUT: tuple[_Hierarchy, ...] | None = None
_LAYOUT_LOCK = threading.Lock()


def _layout() -> tuple[_Hierarchy, ...]:
    """The hierarchies this process can make per-sandbox cgroups in (probed once)."""
    global _LAYOUT
    with _LAYOUT_LOCK:
        if _LAYOUT is None:
            try:
                mountinfo = Path("/proc/self/mountinfo").read_text()
                cgroup = Path("/proc/self/cgroup").read_text()
            except OSError:
                mountinfo = cgroup = ""
            name = f"tunix-sandboxes-{os.geteuid()}"
            found = (_parent_dir(c, name) for c in _plan(mountinfo, cgroup))
            _LAYOUT = tuple(h for h in found if h is not None)
        return _LAYOUT


def _settings(version: int, ctrl: str, config: SandboxConfig) -> list[tuple[str, str, bool]]:
    """(file, value, required) to write into a new cgroup for ``ctrl``."""
    mem = str(total_memory_mb(config) << 20)
    pids = str(config.max_procs + PIDS_SLACK)
    if ctrl == "pids":
        return [("pids.max", pids, True)]
    if version == 1:  # memsw (memory + swap) must not be below the memory limit: set after it
        return [("memory.limit_in_bytes", mem, True), ("memory.memsw.limit_in_bytes", mem, False)]
    return [("memory.max", mem, True), ("memory.swap.max", "0", False)]


@dataclass(frozen=True)
class SandboxCgroups:
    """The cgroups made for one sandbox: their directories and how each is bound."""

    dirs: tuple[Path, ...] = ()
    memory: Literal["cgroup-v1", "cgroup-v2", None] = None
    pids: Literal["cgroup-v1", "cgroup-v2", None] = None

    @property
    def procs_files(self) -> tuple[str, ...]:
        """The ``cgroup.procs`` files a command writes its pid to."""
        return tuple(str(d / "cgroup.procs") for d in self.dirs)


def make_cgroups(name: str, config: SandboxConfig) -> SandboxCgroups:
    """Creates and bounds the cgroups of sandbox ``name`` in every usable hierarchy."""
    dirs: list[Path] = []
    kinds: dict[str, Literal["cgroup-v1", "cgroup-v2"]] = {}
    for hier in _layout():
        path = hier.parent / name
        try:
            path.mkdir(mode=0o755)
        except OSError:
            continue
        ok = all(
            _write(path / file, value) or not required
            for ctrl in hier.controllers
            for file, value, required in _settings(hier.version, ctrl, config)
            if required or (path / file).exists()
        )
        if not ok:
            remove_cgroups([path])
            continue
        dirs.append(path)
        for ctrl in hier.controllers:
            kinds[ctrl] = "cgroup-v1" if hier.version == 1 else "cgroup-v2"
    return SandboxCgroups(tuple(dirs), kinds.get("memory"), kinds.get("pids"))


def join_prefix(procs_files: Sequence[str]) -> list[str]:
    """An argv prefix that moves itself into the cgroups, then execs the rest of the argv."""
    if not procs_files:
        return []
    n = len(procs_files)
    joins = " && ".join(f'echo $$ > "${i}"' for i in range(1, n + 1))
    return ["/bin/sh", "-c", f'{joins} && shift {n} && exec "$@"', "sh", *procs_files]


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_cgroups(dirs: Sequence[Path], timeout: float = 2.0) -> None:
    """Kills what is left in each cgroup and removes it (retried while it empties)."""
    for path in dirs:
        deadline = time.monotonic() + timeout
        while True:
            if (path / "cgroup.kill").exists():
                _write(path / "cgroup.kill", "1")
            for pid in _cgroup_pids(path):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                path.rmdir()
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    break  # left for the sweep once its owner is gone
                time.sleep(0.01)
            else:
                break


def sweep_cgroups(owner_dead: Callable[[str], bool]) -> list[Path]:
    """Removes the cgroups of sandboxes whose owner is dead; returns them.

    ``owner_dead(name)`` is False for a name that is not a sandbox's.
    """
    removed = []
    for hier in _layout():
        try:
            names = [e.name for e in os.scandir(hier.parent) if e.is_dir()]
        except OSError:
            continue
        for name in names:
            if owner_dead(name):
                remove_cgroups([hier.parent / name])
                if not (hier.parent / name).exists():
                    removed.append(hier.parent / name)
    return removed
