"""A streamed chat completion's content shown while the engine samples it (no JAX).

The engine hands over ids as it collects them (``on_tokens``); :class:`LiveText` turns
them into the part of the content that can already be shown, and :class:`LiveStream`
writes it to the client as it comes. What is shown is a prefix of the content the call
answers in the end, because it holds back what may still change:

- the last id's text (it may merge with the next: a character split over ids, spaces);
- everything from a tool-call block's opening marker on (the block becomes a call, or
  stays as text, only once it is parsed whole) and from a stop string on, and a tail of
  the text that could be the start of either;
- content that is only whitespace so far (a reply of tool calls answers no content);
- an end-of-turn id.

Once a marker or stop string is reached nothing more is shown live: the rest of the
reply (content after it, tool calls, ``finish_reason``, usage) is sent when the call is
recorded, as :func:`~tunix_agentic.rollout.openai_endpoint.reply.stream_chunks` frames it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence

TOOL_CALL_MARKER = "<tool_call>"


def _held_tail(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` could begin ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class LiveText:
    """The showable prefix of a completion's text, as ids arrive (see the module)."""

    def __init__(
        self,
        decode: Callable[[list[int]], str],
        holds: Sequence[str],
        end_ids: Collection[int],
    ):
        self._decode = decode
        self._holds = [h for h in holds if h]
        self._end_ids = frozenset(end_ids)
        self.ids: list[int] = []
        self.shown = ""
        self.stopped = False  # a marker or stop string was reached: nothing more shows

    def add(self, ids: Sequence[int]) -> str:
        """Take new ids; returns the text that can be shown now beyond :attr:`shown`."""
        self.ids.extend(ids)
        if self.stopped:
            return ""
        ids = self.ids[:-1]  # the last id's text may still merge with the next
        while ids and ids[-1] in self._end_ids:
            ids = ids[:-1]
        text = self._decode(ids).rstrip("\ufffd")
        cut = len(text)
        for hold in self._holds:
            at = text.find(hold)
            if at >= 0:
                cut, self.stopped = min(cut, at), True
            else:
                cut = min(cut, len(text) - _held_tail(text, hold))
        safe = text[:cut]
        if not safe.strip():
            return ""
        if not safe.startswith(self.shown):  # decoding changed what was shown: stop here
            self.stopped = True
            return ""
        piece, self.shown = safe[len(self.shown) :], safe
        return piece


class LiveStream:
    """Writes :class:`LiveText`'s pieces with ``write`` (an async callable) as they come,
    without holding the engine's callbacks: :meth:`on_tokens` only queues; a task writes.
    A write that fails (the client left) cancels ``owner`` (the handler's task), which
    aborts the engine's request; :attr:`gone` says so."""

    def __init__(self, text: LiveText, write: Callable[[str], Awaitable[None]]):
        self.text = text
        self._write = write
        self._pending = ""
        self._wake = asyncio.Event()
        self._owner = asyncio.current_task()
        self._closing = False
        self.gone = False
        self._task = asyncio.ensure_future(self._pump())

    @property
    def started(self) -> bool:
        """Whether anything was shown (the client has the stream's first chunks)."""
        return bool(self.text.shown)

    def on_tokens(self, ids: list[int]) -> None:
        piece = self.text.add(ids)
        if piece:
            self._pending += piece
            self._wake.set()

    async def _pump(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            piece, self._pending = self._pending, ""
            if piece:
                try:
                    await self._write(piece)
                except ConnectionError:
                    self.gone = True
                    if self._owner is not None:
                        self._owner.cancel()
                    return
            if self._closing and not self._pending:
                return

    async def close(self) -> None:
        """Write what is queued, then stop (before the rest of the reply is written)."""
        self._closing = True
        self._wake.set()
        await self._task

    def cancel(self) -> None:
        """Stop at once (the call failed or was cut)."""
        self._task.cancel()
