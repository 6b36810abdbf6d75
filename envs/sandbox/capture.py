"""Reading sandboxed processes: bounded output capture and an asyncio process wrapper.

:class:`OutputCapture` keeps the head and tail of a stream whatever its size and
:func:`truncate_middle` cuts text to a budget (the terminal tools use both too);
:class:`SandboxProcess` is an asyncio process whose exit can be awaited without waiting for
pipes a background child still holds. Kept apart from :mod:`~tunix_agentic.envs.sandbox.core`
because none of it knows about isolation: it is what any caller of a subprocess needs to
read it safely.
"""

from __future__ import annotations

import asyncio
import signal


# ------------------------------------------------------------------ bounded output capture
class OutputCapture:
    """Keeps the first and last ``limit_bytes`` of a stream and counts what fell in between.

    A command that prints gigabytes must not take gigabytes of the host's memory; the head
    and tail are what a reader of the output needs.
    """

    def __init__(self, limit_bytes: int):
        self.limit = max(1, int(limit_bytes))
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, data: bytes) -> None:
        room = self.limit - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if not data:
            return
        self.tail += data
        excess = len(self.tail) - self.limit
        if excess > 0:
            del self.tail[:excess]
            self.dropped += excess

    def text(self, max_chars: int) -> str:
        """The captured text, middle-truncated to ``max_chars`` with a marker."""
        head = self.head.decode("utf-8", "replace")
        tail = self.tail.decode("utf-8", "replace")
        return truncate_middle(head, max_chars, dropped=self.dropped, tail=tail)


def truncate_middle(text: str, max_chars: int, *, dropped: int = 0, tail: str = "") -> str:
    """``text + tail`` cut to about ``max_chars`` characters by removing the middle.

    The cut is marked ``[... N characters truncated ...]`` (``N`` counts ``dropped`` too:
    characters a capture already discarded, counted as bytes).
    """
    joined_len = len(text) + len(tail)
    if joined_len <= max_chars and not dropped:
        return text + tail
    full = text + tail
    keep = max(0, max_chars)
    head_n = keep // 2
    tail_n = keep - head_n
    if joined_len <= max_chars:
        head_part, tail_part = text, tail
    else:
        head_part = full[:head_n]
        tail_part = full[len(full) - tail_n :] if tail_n else ""
    cut = joined_len - len(head_part) - len(tail_part) + dropped
    return f"{head_part}\n[... {cut} characters truncated ...]\n{tail_part}"


# ------------------------------------------------------------------------- processes
class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, plus a future set as soon as the process exits.

    ``Process.wait()`` (Python 3.11) also waits for every pipe to close, which a background
    process that inherited stdout can delay for as long as it lives.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop):
        super().__init__(limit=limit, loop=loop)
        self.exit_future: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exit_future.done():
            self.exit_future.set_result(None)


class SandboxProcess(asyncio.subprocess.Process):
    """An asyncio process whose :meth:`exited` does not wait for its pipes to close."""

    async def exited(self) -> int:
        """Waits until the process has exited (and was reaped); returns its exit status."""
        await asyncio.shield(self._protocol.exit_future)
        return self.returncode if self.returncode is not None else -signal.SIGKILL

    def close_pipes(self) -> None:
        """Closes this process's pipes and transport (idempotent; kills it if still running)."""
        self._transport.close()
