"""What a sandbox is configured with, and the errors and warnings it raises.

:class:`SandboxConfig` is the ``env.sandbox`` section of a run (read by
:mod:`tunix_agentic.config` and the ``sandbox`` CLI command), so it lives apart from the
machinery in the other modules of :mod:`tunix_agentic.envs.sandbox`, all of which import
it; nothing here touches the host. The package re-exports every public name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

SANDBOX_WORKDIR = "/workspace"
SandboxBackend = Literal["auto", "bwrap", "process"]
BACKENDS: tuple[SandboxBackend, ...] = get_args(SandboxBackend)
UID_SLOTS = 4096
# Paths the sandbox itself provides; a read-only bind there would shadow or break them.
_RESERVED = ("/proc", "/dev", SANDBOX_WORKDIR)


class SandboxError(RuntimeError):
    """The sandbox cannot do what was asked: it is closed, or its backend cannot run."""


class SandboxIsolationWarning(RuntimeWarning):
    """Commands run without bwrap: resource limits only, no network or filesystem isolation."""


def interpreter() -> str:
    """This process's ``sys.executable`` as a normalised absolute path.

    Started as ``../venv/bin/python``, Python reports ``/cwd/../venv/bin/python``: compared
    with the normalised ``ro_paths`` it would seem outside them, and the sandbox's ``PATH``
    would lose the virtual environment. ``abspath`` (not ``realpath``) keeps a venv's
    ``bin/python`` link, which is what selects the venv.
    """
    return os.path.abspath(sys.executable) if sys.executable else ""


def _default_ro_paths() -> tuple[str, ...]:
    """System directories plus the running Python's prefixes, so ``sys.executable`` runs inside."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"]
    for prefix in (sys.prefix, sys.base_prefix, os.path.realpath(sys.base_prefix)):
        prefix = os.path.abspath(prefix) if prefix else prefix
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
    may run at once (see the :mod:`tunix_agentic.envs.sandbox` docstring for how that is
    enforced). ``file_size_mb``: largest file a process may write (``RLIMIT_FSIZE``).
    ``disk_mb``: what ``/workspace`` and ``/tmp`` may hold together (a tmpfs of that size;
    needs root, else only ``file_size_mb`` holds). ``total_memory_mb``: memory of all the
    sandbox's processes together, its tmpfs files included (a cgroup; None: 4 x
    ``memory_mb``). :mod:`tunix_agentic.envs.sandbox.limits` says where each total holds.
    ``timeout_s``: default wall-clock limit of one command. ``network``: keep the host's
    network (default: none, only a private loopback). ``ro_paths``: host paths visible
    read-only at the same path (missing ones are skipped; default: system directories and
    this Python's prefixes). ``backend``: ``"auto"``, ``"bwrap"`` or ``"process"``; where
    model-written code runs (every :class:`~tunix_agentic.envs.sandboxed.SandboxedEnv`, the
    ``sandbox`` CLI command) ``"auto"`` means bwrap or nothing (:func:`isolated`), and only an
    explicit ``"process"`` runs commands unisolated. ``uid_base``: first uid of the range
    sandboxes run as when this process is root (none of its uids may be the host's: see
    :func:`~tunix_agentic.envs.sandbox.host.check_uid_range`).
    """

    cpu_s: int = 30
    memory_mb: int = 2048
    max_procs: int = 64
    file_size_mb: int = 64
    disk_mb: int = 512
    total_memory_mb: int | None = None
    timeout_s: float = 30.0
    network: bool = False
    ro_paths: tuple[str, ...] = field(default_factory=_default_ro_paths)
    backend: SandboxBackend = "auto"
    uid_base: int = 200_000

    def __post_init__(self) -> None:
        total = self.total_memory_mb
        if total is not None and (
            isinstance(total, bool) or not isinstance(total, int) or total < 1
        ):
            raise ValueError(
                f"SandboxConfig.total_memory_mb must be a positive integer or null, got {total!r}"
            )
        for name in ("cpu_s", "memory_mb", "max_procs", "file_size_mb", "disk_mb"):
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


def isolated(config: SandboxConfig) -> SandboxConfig:
    """``config`` for model-written code: ``backend="auto"`` becomes ``"bwrap"``.

    A plain :class:`~tunix_agentic.envs.sandbox.Sandbox` with ``"auto"`` falls back to the
    ``process`` backend (no isolation) when bwrap cannot run; code an agent wrote must not
    end up there by accident, so its sandboxes refuse to start instead
    (:func:`unisolated_refusal` says how to fix that), and running it unisolated takes an
    explicit ``backend="process"``.
    """
    return replace(config, backend="bwrap") if config.backend == "auto" else config


def unisolated_refusal(problem: str) -> SandboxError:
    """The error of a sandbox for model-written code on a host where bwrap cannot run."""
    return SandboxError(
        f"bwrap cannot run here ({problem}), and model-written code is not run without "
        "isolation unless asked: install bubblewrap (apt-get install bubblewrap), or set "
        "env.sandbox.backend: process (the sandbox CLI: --backend process) to run it as plain "
        "subprocesses WITHOUT isolation, where the host's files, network and other processes' "
        "command lines are within its reach"
    )


def load_sandbox_config(
    path: str | os.PathLike[str] | None, backend: str | None = None
) -> SandboxConfig:
    """The ``env.sandbox`` section of a run config YAML as a :class:`SandboxConfig`.

    No file, or no such section: the defaults. ``backend``, if given, replaces the file's.
    The YAML is read directly (not through the run-config loader), so only this section
    matters. Raises ``ValueError`` for an unreadable file, a malformed section or a bad field.
    """
    section: dict[str, Any] = {}
    if path is not None:
        import yaml

        try:
            with open(path) as f:
                doc = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ValueError(f"cannot read config {path}: {exc}") from exc
        env = doc.get("env") if isinstance(doc, dict) else None
        found = env.get("sandbox") if isinstance(env, dict) else None
        if found is not None and not isinstance(found, dict):
            raise ValueError(f"env.sandbox in {path} must be a mapping, got {found!r}")
        section = dict(found or {})
    if backend is not None:
        section["backend"] = backend
    try:
        return SandboxConfig(**section)
    except TypeError as exc:  # an unknown key
        raise ValueError(f"env.sandbox: {exc}") from None
