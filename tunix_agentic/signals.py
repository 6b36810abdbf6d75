"""Stopping a run cleanly: SIGINT and SIGTERM become a request the run answers at a safe point.

:class:`StopSignals` turns the first signal into a request (a second one falls
through to Python's default, so a user can still force the way out);
:meth:`StopSignals.race` ends a wait early with :class:`Stopped`; the trainer
then checkpoints the last finished step and raises :class:`RunInterrupted`.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from pathlib import Path
from typing import Any


class RunInterrupted(Exception):
    """SIGINT or SIGTERM stopped the run; what was finished is checkpointed.

    ``step`` is the last finished RL step (None before RL began) and
    ``exit_code`` the shell's convention (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, step: int | None, run_dir: Path):
        self.signum, self.step, self.run_dir = signum, step, run_dir
        self.exit_code = 128 + signum
        where = "before the first RL step" if step is None else f"at step {step}"
        super().__init__(
            f"interrupted {where}; resume with: tunix-agentic train --resume {run_dir}"
        )


class Stopped(Exception):
    """A stop signal arrived while the run waited on something (the trainer catches it)."""


class StopSignals:
    """SIGINT and SIGTERM request a clean stop instead of killing the run.

    The first signal sets :attr:`signum` and wakes the event loop; a second one
    falls through to Python's default behaviour (KeyboardInterrupt / exit), so a
    user can still force the way out. Installed only on the main thread.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.signum: int | None = None
        self.event = asyncio.Event()
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        self.request(signum)
        for sig, handler in self._previous.items():  # a second signal is not ours to soften
            signal.signal(sig, handler)

    def request(self, signum: int) -> None:
        """Ask for a clean stop as signal ``signum`` would (callable from any thread)."""
        if self.signum is None:
            self.signum = signum
            self.loop.call_soon_threadsafe(self.event.set)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    async def race(self, aw: Any) -> Any:
        """Await ``aw`` unless a stop is requested first (then cancel it, raise Stopped)."""
        if self.requested:
            raise Stopped
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return task.result()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise Stopped
