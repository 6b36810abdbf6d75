"""Rootless per-episode sandboxes: a private working directory, resource limits, no network.

One :class:`Sandbox` per episode. It owns a host directory (``workdir``) that its commands see
as :data:`SANDBOX_WORKDIR` (their cwd and ``$HOME``) and a ``/tmp`` of its own; every command,
long-lived shell and interpreter it starts runs under the limits of its :class:`SandboxConfig`,
and :meth:`Sandbox.close` kills them all and removes the directory. Each command is its own
bwrap instance (about 10 ms), so ``/tmp`` is a host directory of the sandbox bound in, not a
tmpfs of bwrap's: that would be private to one command, and the agent's shell, its
interpreter and the task's set-up commands must see the same files.

Totals
    Under root the directory (``/workspace`` and ``/tmp``) is a tmpfs of ``disk_mb``, and a
    cgroup bounds the memory and tasks of all the sandbox's processes together;
    :attr:`Sandbox.totals` says which bounds hold (:mod:`~tunix_agentic.envs.sandbox.limits`:
    where and how). A read-only path under ``/tmp`` is bound so that no link the sandbox
    plants in its ``/tmp`` can steer bwrap (see ``launch._bwrap_prefix``).

Backends
    ``"bwrap"`` (bubblewrap) starts every command in fresh mount, PID, IPC, UTS (and, unless
    ``network``, network) namespaces: the host's filesystem is invisible but for the read-only
    ``ro_paths``, and this package's own folders are empty there even when a bound prefix
    holds them (a regular ``pip install``: swe_lite's reference solutions are among its
    sources); ``/proc``, ``/dev`` and ``/dev/shm`` are private; ``--die-with-parent`` kills
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
    (claimed with an ``flock`` in ``/run/tunix-sandbox-uids``, one directory per host whatever
    the ``TMPDIR``, that dies with its holder, so concurrent trainers on one host never share
    one) and ``max_procs`` bounds that sandbox alone. bwrap then runs
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
    recognised and removed by :func:`sweep_orphans` (with its tmpfs and cgroups), which a new
    sandbox runs (at most every 5 s per process). Processes need no sweep: bwrap's die with
    this process, and under root a process-backend sandbox's leftovers are killed by uid
    when the uid is next leased.

Modules
    This package's API is what it exports here; its modules are private.
    :mod:`~tunix_agentic.envs.sandbox.core` holds :class:`Sandbox`, and beside it:
    :mod:`~tunix_agentic.envs.sandbox.config` (:class:`SandboxConfig`, errors, constants),
    :mod:`~tunix_agentic.envs.sandbox.run` (one command run to completion:
    :class:`CommandResult`), :mod:`~tunix_agentic.envs.sandbox.host` (the sandboxes' root,
    orphan sweeping, uid leases, killing by uid), :mod:`~tunix_agentic.envs.sandbox.launch`
    (the bwrap probe, limits, environment and command prefixes of both backends),
    :mod:`~tunix_agentic.envs.sandbox.seccomp` (the seccomp filter),
    :mod:`~tunix_agentic.envs.sandbox.capture` (output capture, the asyncio process wrapper),
    :mod:`~tunix_agentic.envs.sandbox.resources` (taking what a sandbox holds at start;
    killing, reaping and releasing it), :mod:`~tunix_agentic.envs.sandbox.paths`
    (symlink-safe host access to the working directory) and
    :mod:`~tunix_agentic.envs.sandbox.limits` (the per-sandbox totals: tmpfs and cgroups).
"""

from tunix_agentic.envs.sandbox.capture import OutputCapture, SandboxProcess, truncate_middle
from tunix_agentic.envs.sandbox.config import (
    BACKENDS,
    SANDBOX_WORKDIR,
    UID_SLOTS,
    SandboxConfig,
    SandboxError,
    SandboxIsolationWarning,
    isolated,
    load_sandbox_config,
    unisolated_refusal,
)
from tunix_agentic.envs.sandbox.core import Sandbox
from tunix_agentic.envs.sandbox.host import check_uid_range, sweep_orphans
from tunix_agentic.envs.sandbox.launch import bwrap_problem
from tunix_agentic.envs.sandbox.limits import SandboxLimitWarning, SandboxTotals
from tunix_agentic.envs.sandbox.run import CommandResult

__all__ = [
    "BACKENDS",
    "SANDBOX_WORKDIR",
    "UID_SLOTS",
    "CommandResult",
    "OutputCapture",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxIsolationWarning",
    "SandboxLimitWarning",
    "SandboxProcess",
    "SandboxTotals",
    "bwrap_problem",
    "check_uid_range",
    "isolated",
    "load_sandbox_config",
    "sweep_orphans",
    "truncate_middle",
    "unisolated_refusal",
]
