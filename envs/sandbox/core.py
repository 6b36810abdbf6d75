"""The :class:`Sandbox` class: one episode's sandbox, its processes and its files.

See the package docstring (:mod:`tunix_agentic.envs.sandbox`) for what a sandbox isolates and
how. The class starts, tracks and kills processes and reaches the working directory's files
from the host; what it takes at start and releases at close lives in
:mod:`~tunix_agentic.envs.sandbox.resources`, one command's run to completion in
:mod:`~tunix_agentic.envs.sandbox.run`, the command lines in
:mod:`~tunix_agentic.envs.sandbox.launch`, and the host's way to the working directory's
files in :mod:`~tunix_agentic.envs.sandbox.files`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import subprocess
import time
import warnings
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ptyprocess

from tunix_agentic.envs.sandbox.capture import SandboxProcess, _ExitProtocol
from tunix_agentic.envs.sandbox.config import (
    SANDBOX_WORKDIR,
    SandboxConfig,
    SandboxError,
    SandboxIsolationWarning,
    _under,
    interpreter,
)
from tunix_agentic.envs.sandbox.files import WorkdirFiles
from tunix_agentic.envs.sandbox.launch import (
    _STANDARD_PATH,
    _bwrap_prefix,
    _limits,
    _process_preexec,
    _sandbox_env,
    bwrap_problem,
)
from tunix_agentic.envs.sandbox.limits import SandboxTotals, join_prefix, warn_unbounded
from tunix_agentic.envs.sandbox.resources import _reap, _Resources, _running, _unwatch, allocate
from tunix_agentic.envs.sandbox.run import CommandResult, run_to_completion


# ---------------------------------------------------------------------------- sandbox
class Sandbox(WorkdirFiles):
    """One episode's sandbox; see the package docstring for what it isolates and how.

    ``Sandbox(config)`` allocates nothing; ``await sandbox.start()`` (or ``await
    Sandbox.create(config)``, or ``async with Sandbox(config) as sandbox``) makes its
    directory and picks the backend. After that: :attr:`workdir` (host path of the working
    directory), :attr:`cwd` (the same directory as the sandbox's commands see it),
    :attr:`backend` (``"bwrap"`` or ``"process"``), :attr:`totals` (which per-sandbox totals
    hold: a :class:`SandboxTotals`), :attr:`uid` (the uid commands run as;
    None: this process's), :attr:`python` (an interpreter that runs inside, None if none:
    this process's own when the sandbox can reach it, else the system's ``python3``, as for
    the process backend under root, whose sandbox uid cannot enter ``/root``), :attr:`start_s`
    (seconds :meth:`start` took), :attr:`launches` (processes started in it so far). ``await close()`` kills everything the sandbox started,
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
        self.totals: SandboxTotals | None = None
        self._tmp: Path | None = None
        self._cgroup_procs: tuple[str, ...] = ()
        self._nproc = self.config.max_procs
        self._prefix: dict[bool, list[str]] = {}
        self._res = _Resources()
        self._finalizer = weakref.finalize(self, self._res.release)
        self._closing = False
        # Processes started so far: after the first, what the sandbox holds (its disk, its
        # processes) may be the sandboxed code's doing (see PythonTool's start-up).
        self.launches = 0

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
        loop = asyncio.get_running_loop()
        try:
            taken = await loop.run_in_executor(None, allocate, self._res, self.config, backend)
        except BaseException:
            # Failed or cancelled (the thread goes on: allocate releases once it is done).
            self.close_sync()
            raise
        self.workdir, self._tmp, self.uid = taken.workdir, taken.tmp, taken.uid
        self._nproc, self._cgroup_procs, self.totals = taken.nproc, taken.cgroup_procs, taken.totals
        warn_unbounded(self.totals)
        self.backend = backend
        self.cwd = SANDBOX_WORKDIR if backend == "bwrap" else str(self.workdir)
        self.python = self._find_python()
        self.start_s = time.perf_counter() - t0
        return self

    def _find_python(self) -> str | None:
        """An interpreter the sandbox can run: this one if visible and reachable, else python3."""
        candidates = [interpreter(), shutil.which("python3", path=_STANDARD_PATH)]
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
            self._prefix[pty] = [
                *join_prefix(self._cgroup_procs),
                *_bwrap_prefix(
                    self.config, self.workdir, self._tmp, self.uid, nproc=self._nproc, pty=pty
                ),
            ]
        return [*self._prefix[pty], *args]

    def _env(self) -> dict[str, str]:
        if self.backend == "bwrap":  # bwrap sets the sandbox's own (--clearenv, --setenv)
            return {"PATH": _STANDARD_PATH, "LANG": "C.UTF-8"}
        return _sandbox_env(self.config, str(self._tmp), str(self.workdir))

    def _launch_kwargs(self) -> dict[str, Any]:
        """Popen keyword arguments shared by every launch (environment, cwd, pre-exec)."""
        if self.backend == "bwrap":
            return {"env": self._env(), "cwd": "/"}
        preexec = _process_preexec(_limits(self.config, self._nproc), self.uid, self._cgroup_procs)
        return {"env": self._env(), "cwd": str(self.workdir), "preexec_fn": preexec}

    def popen(self, argv: Sequence[str] | str, **kwargs: Any) -> subprocess.Popen[bytes]:
        """Starts ``argv`` in the sandbox with :class:`subprocess.Popen` (stdio as given).

        The process is tracked: :meth:`close` kills it. Used by the ``sandbox`` CLI command.
        """
        host = self.command(argv)
        proc = subprocess.Popen(host, start_new_session=True, **self._launch_kwargs(), **kwargs)
        self.launches += 1
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
        self.launches += 1
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
        self.launches += 1
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
        try:
            return await run_to_completion(
                proc,
                timeout=limit,
                input=input,
                max_output=max_output,
                kill_tree=self._res.kill,
                kill_group=self.backend == "process",
                started=start,
            )
        finally:
            if proc.returncode is not None:
                self.forget(proc)


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
