"""``tunix-agentic sandbox [--config PATH] [--backend B] [--timeout S] -- CMD ...``.

Runs one command in exactly the sandbox the ``bash``, ``python`` and ``file_edit`` tools get
(the same :class:`~tunix_agentic.envs.sandbox.SandboxConfig`, read from the ``env.sandbox``
section of a run config), with this terminal's stdin, stdout and stderr, and exits with the
command's exit code: a way to check by hand what an agent's commands can and cannot do. Like
the tools' sandbox it fails closed: without a working bwrap it refuses to run (exit 1)
unless ``--backend process`` (or ``env.sandbox.backend: process``) asks for no isolation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig, SandboxError, isolated
from tunix_agentic.envs.sandboxed import check_isolation

TIMEOUT_EXIT = 124  # as timeout(1)
INTERRUPT_EXIT = 130  # 128 + SIGINT


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


def run_in_sandbox(
    argv: Sequence[str], config: SandboxConfig, *, timeout: float | None = None
) -> int:
    """Runs ``argv`` in a fresh sandbox with this process's stdio; returns its exit code.

    ``timeout`` (default: ``config.timeout_s``; 0: none) kills the command and returns 124;
    Ctrl-C kills it and returns 130. The sandbox is removed in every case. Raises
    :class:`SandboxError` when the sandbox cannot start, or when bwrap cannot run and
    ``config.backend`` is not ``"process"`` (as for the tools: :func:`isolated`).
    """
    import asyncio

    check_isolation(config)
    config = isolated(config)
    sandbox = Sandbox(config)
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(sandbox.start())
        proc = sandbox.popen(list(argv))
        limit = config.timeout_s if timeout is None else timeout
        try:
            return proc.wait(timeout=limit or None)
        except subprocess.TimeoutExpired:
            print(f"tunix-agentic sandbox: timed out after {limit:g}s", file=sys.stderr)
            return TIMEOUT_EXIT
        except KeyboardInterrupt:
            return INTERRUPT_EXIT
    finally:
        sandbox.close_sync()
        loop.close()


def main(
    command: Sequence[str], *, config: str | None, backend: str | None, timeout: float | None
) -> int:
    """The ``sandbox`` subcommand: 2 on a usage or config error, else the command's code."""
    args = list(command)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print("tunix-agentic: error: sandbox needs a command after --", file=sys.stderr)
        return 2
    try:
        cfg = load_sandbox_config(config, backend)
    except ValueError as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    try:
        return run_in_sandbox(args, cfg, timeout=timeout)
    except KeyboardInterrupt:  # before the command started; the sandbox is removed
        return INTERRUPT_EXIT
    except SandboxError as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:  # the process backend could not find the command
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 127
