"""One command run to completion: its input, its bounded output, its timeout, its leftovers.

:meth:`Sandbox.run <tunix_agentic.envs.sandbox.core.Sandbox.run>` spawns the command and hands
it to :func:`run_to_completion`, which writes its stdin, captures stdout and stderr (head and
tail, whatever their size), waits for its exit within the timeout, kills what it leaves behind
and returns a :class:`CommandResult`. Kept apart from the :class:`Sandbox` class, which owns
the sandbox's processes, because this is the life of one command: the sandbox only lends it
the means to kill a process tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from tunix_agentic.envs.sandbox.capture import OutputCapture, SandboxProcess
from tunix_agentic.envs.sandbox.resources import _killpg

_KILL_GRACE_S = 2.0  # how long output may still arrive after a command's tree was killed


@dataclass(frozen=True)
class CommandResult:
    """The outcome of :meth:`Sandbox.run <tunix_agentic.envs.sandbox.Sandbox.run>`.

    ``exit_code``: the command's exit status; negative ``-N`` when it was killed by signal
    ``N`` (a timeout kills with SIGKILL, and bwrap reports a signalled command as ``128+N``).
    ``output``: stdout and stderr interleaved, decoded as UTF-8 (invalid bytes replaced), with
    the middle cut out past ``max_output`` characters. ``timed_out``: the wall-clock limit
    killed it. ``seconds``: wall-clock time from start to exit.
    """

    exit_code: int
    output: str
    timed_out: bool
    seconds: float


async def run_to_completion(
    proc: SandboxProcess,
    *,
    timeout: float,
    input: bytes | str | None,
    max_output: int,
    kill_tree: Callable[[int], None],
    kill_group: bool,
    started: float,
) -> CommandResult:
    """Feeds ``input`` to ``proc`` (spawned with a stdin pipe when ``input`` is not None) and
    waits for it, killing its whole tree once ``timeout`` seconds are up.

    ``kill_tree(pid)`` kills the process's tree (its group and PID namespace); it runs again
    after the exit for background leftovers, and then ``kill_group`` also kills the process
    group (a group outlives its leader: the process backend). Output still arriving after that
    is read for at most :data:`_KILL_GRACE_S`. ``started``: the ``time.perf_counter()`` the
    command's ``seconds`` count from. The caller forgets ``proc`` once it was reaped.
    """
    capture = OutputCapture(max(4 * max_output, 4096))

    async def pump() -> None:
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(65536):
            capture.feed(chunk)

    async def feed() -> None:
        assert proc.stdin is not None
        data = input.encode() if isinstance(input, str) else input
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(data or b"")
            await proc.stdin.drain()
            proc.stdin.close()

    reader = asyncio.ensure_future(pump())
    writer = asyncio.ensure_future(feed()) if input is not None else None
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout):
                await proc.exited()
        except TimeoutError:
            timed_out = True
        # Kill what is left: the tree on timeout, background leftovers otherwise (bwrap's
        # PID namespace ends with its command; a process group outlives its leader).
        kill_tree(proc.pid)
        await proc.exited()
        if kill_group:
            _killpg(proc.pid)
        try:
            async with asyncio.timeout(_KILL_GRACE_S):
                await asyncio.shield(reader)
        except TimeoutError:  # an escaped process still holds the pipe
            pass
    finally:
        kill_tree(proc.pid)
        for task in (reader, writer):
            if task is not None and not task.done():
                task.cancel()
    code = proc.returncode if proc.returncode is not None else -signal.SIGKILL
    return CommandResult(
        exit_code=code,
        output=capture.text(max_output),
        timed_out=timed_out,
        seconds=time.perf_counter() - started,
    )
