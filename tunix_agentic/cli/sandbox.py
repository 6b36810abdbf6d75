"""``tunix-agentic sandbox [--config PATH] [--backend B] [--timeout S] -- CMD ...``.

Runs one command in exactly the sandbox the ``bash``, ``python`` and ``file_edit`` tools get
(the same :class:`~tunix_agentic.envs.sandbox.SandboxConfig`, read from the ``env.sandbox``
section of a run config), with this terminal's stdin, stdout and stderr, and exits with the
command's exit code: a way to check by hand what an agent's commands can and cannot do. Like
the tools' sandbox it fails closed: without a working bwrap it refuses to run (exit 1)
unless ``--backend process`` (or ``env.sandbox.backend: process``) asks for no isolation.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence

from tunix_agentic.envs.sandbox import (
    Sandbox,
    SandboxConfig,
    SandboxError,
    isolated,
    load_sandbox_config,
)
from tunix_agentic.envs.sandboxed import check_isolation

TIMEOUT_EXIT = 124  # as timeout(1)
INTERRUPT_EXIT = 130  # 128 + SIGINT


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
