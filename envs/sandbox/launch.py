"""How a sandboxed command is launched: the bwrap probe and the command prefixes.

The ``bwrap`` backend's host argv (``bwrap ... -- [setpriv ...] prlimit ... --``), the
``process`` backend's pre-exec step (rlimits, uid, parent-death signal), the resource limits
and environment both apply, and :func:`bwrap_problem`, which tries that argv once per
process. Kept apart from :mod:`~tunix_agentic.envs.sandbox.core` because it is pure command
building on a :class:`~tunix_agentic.envs.sandbox.config.SandboxConfig`: it starts nothing
but the probe and holds no sandbox's state.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tunix_agentic.envs.sandbox.config import SANDBOX_WORKDIR, SandboxConfig, _under, interpreter
from tunix_agentic.envs.sandbox.host import _sandboxes_root
from tunix_agentic.envs.sandbox.seccomp import seccomp_loader, seccomp_problem, with_seccomp

_STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SHM_BYTES = 64 << 20
_SKELETON_BYTES = 1 << 20  # the private tmpfs that holds a read-only path under /tmp


_LIBC: Any = None
_PR_SET_PDEATHSIG = 1


def _libc() -> Any:
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


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
    problem = seccomp_problem(_sandboxes_root())  # bwrap never runs without the filter
    if problem is not None:
        return problem
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
    python_bin = os.path.dirname(interpreter())
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


def _hidden_dirs() -> tuple[str, ...]:
    """This package's directories (``tunix_agentic`` and its ``envs``, which live apart in
    an editable install), resolved: what no sandbox may read. Only the outermost: in a
    regular install ``envs`` lies inside ``tunix_agentic``, and bwrap cannot make a mount
    point inside the read-only tmpfs that already hides it."""
    here = Path(__file__).resolve()
    package = Path(sys.modules["tunix_agentic"].__file__ or here).resolve().parent
    dirs = dict.fromkeys((str(package), str(here.parents[1])))
    return tuple(d for d in dirs if not any(o != d and _under(d, o) for o in dirs))


def _bwrap_prefix(
    config: SandboxConfig, work: Path, scratch: Path, uid: int | None, *, nproc: int, pty: bool
) -> list[str]:
    """The host argv before the sandboxed command: ``bwrap ... -- [setpriv ...] prlimit ... --``,
    run through :func:`~tunix_agentic.envs.sandbox.seccomp.with_seccomp` (the seccomp filter)."""
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
    dirs: set[str] = {"/tmp"}  # directories made (or bound) for binds below them
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
                if os.path.dirname(anc) == "/tmp":
                    # bwrap makes a bind's missing directories by following links, and /tmp
                    # is the sandbox's host directory, which it writes: a link planted
                    # there would steer root's mkdir to any host path. So the first
                    # directory below /tmp is a private tmpfs, made and kept a mount point
                    # in every namespace the sandbox runs in (which it cannot rename,
                    # remove or unmount); what lies below is made inside that tmpfs.
                    argv += ["--perms", "0755", "--size", str(_SKELETON_BYTES), "--tmpfs", anc]
                else:
                    argv += ["--perms", "0755", "--dir", anc]
                dirs.add(anc)
        argv += ["--ro-bind", path, path]
        bound.append(path)
    for hidden in _hidden_dirs():
        # Installed under a bound prefix (a regular pip install), this package's sources,
        # reference solutions included, would be readable inside: an empty, read-only tmpfs
        # covers them (sandboxed commands never import this package).
        if any(_under(hidden, b) for b in bound) and os.path.isdir(hidden):
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden]
            argv += ["--remount-ro", hidden]
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
    return with_seccomp(argv, _sandboxes_root())  # see envs/sandbox/seccomp.py


def _process_preexec(
    limits: list[tuple[int, tuple[int, int]]],
    uid: int | None,
    cgroup_procs: Sequence[str] = (),
) -> Callable[[], None]:
    """The child-side set-up of the ``process`` backend: cgroups, limits, uid, death signal.

    Runs between fork and exec, so it only makes system calls on values prepared here.
    The child joins the sandbox's cgroups (``cgroup_procs`` files) while it still may; the
    parent-death signal is set last: a uid change clears it.
    """
    procs = [os.fsencode(p) for p in cgroup_procs]
    libc = _libc()
    parent = os.getpid()
    load_filter = seccomp_loader(libc)  # None without libseccomp: limits only

    def preexec() -> None:
        for path in procs:  # "0": the writing process itself
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")
            finally:
                os.close(fd)
        for res, value in limits:
            resource.setrlimit(res, value)
        if uid is not None:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)
        if load_filter is not None:  # last: it sets no_new_privs
            load_filter()

    return preexec
