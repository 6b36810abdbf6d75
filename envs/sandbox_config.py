"""What a sandbox is configured with, and the errors and warnings it raises.

:class:`SandboxConfig` is the ``env.sandbox`` section of a run (read by
:mod:`tunix_agentic.config` and the ``sandbox`` CLI command), so it lives apart from the
machinery in :mod:`tunix_agentic.envs.sandbox` and its helper modules, all of which import
it; nothing here touches the host. :mod:`tunix_agentic.envs.sandbox` re-exports every name.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

SANDBOX_WORKDIR = "/workspace"
BACKENDS = ("auto", "bwrap", "process")
UID_SLOTS = 4096
# Paths the sandbox itself provides; a read-only bind there would shadow or break them.
_RESERVED = ("/proc", "/dev", SANDBOX_WORKDIR)


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
    may run at once (see the :mod:`tunix_agentic.envs.sandbox` docstring for how that is
    enforced). ``file_size_mb``: largest file a process may write (``RLIMIT_FSIZE``; total
    disk use is not limited).
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
