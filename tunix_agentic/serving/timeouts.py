"""Deadlines on slow clients: a request head or body that keeps a connection for ever.

aiohttp waits as long as a client likes for the rest of a request's head (a slowloris
client holds a connection, and a file descriptor, per few bytes a minute). The servers
here listen through :class:`WatchedSite`, which puts each connection's aiohttp protocol
behind a :class:`ConnectionWatch`: a connection that opens, or starts a request, must
finish the request's head within ``header_s``, and one idle between requests is closed
after ``idle_s``. The body is read under ``body_s`` by the servers' middleware
(:func:`~tunix_agentic.serving.http.api_key_guard`), which answers a JSON 408.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

from aiohttp import web


@dataclasses.dataclass(frozen=True)
class ServerTimeouts:
    """How long a client may take over a request before the server hangs up.

    ``header_s``: from a connection's opening, or the first byte of its next request, to
    the end of that request's head (trickling bytes does not extend it); the connection
    is closed without an answer. ``body_s``: to read the whole body once the head is in;
    answered with a JSON 408 and the connection closed. ``idle_s``: a keep-alive connection
    between requests (longer than aiohttp clients keep an idle one, 15 s, so a client never
    reuses a connection the server is closing).
    """

    header_s: float = 15.0
    body_s: float = 60.0
    idle_s: float = 75.0

    def __post_init__(self) -> None:
        for name in ("header_s", "body_s", "idle_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"ServerTimeouts.{name} must be a number, got {value!r}")
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"ServerTimeouts.{name} must be finite and > 0, got {value!r}")


class ConnectionWatch(asyncio.Protocol):
    """One connection: aiohttp's protocol for it (``inner``, which gets every event) and
    the deadline for its next request head.

    A head deadline (``header_s``) starts when the connection opens and when the first
    byte of a request arrives on an idle connection; an idle deadline (``idle_s``) when a
    request's handler returns. The server's middleware calls :meth:`request_started` once
    aiohttp has parsed a head (which stops the deadline) and :meth:`request_finished` when
    the handler returns. A deadline that passes with no handler running closes the
    connection.
    """

    def __init__(self, inner: asyncio.Protocol, timeouts: ServerTimeouts):
        self._inner = inner
        self._timeouts = timeouts
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.BaseTransport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._awaiting_head = False
        self._handlers = 0

    # asyncio.Protocol, each passed on to aiohttp's protocol.
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._inner.connection_made(transport)
        self._arm(self._timeouts.header_s, head=True)

    def data_received(self, data: bytes) -> None:
        if self._handlers == 0 and not self._awaiting_head:
            self._arm(self._timeouts.header_s, head=True)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self._transport = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    # The middleware's signals.
    def request_started(self) -> None:
        self._handlers += 1
        self._cancel()

    def request_finished(self) -> None:
        self._handlers -= 1
        if self._handlers == 0 and self._transport is not None:
            self._arm(self._timeouts.idle_s, head=False)

    def _arm(self, delay: float, *, head: bool) -> None:
        self._cancel()
        self._awaiting_head = head
        self._timer = self._loop.call_later(delay, self._expire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._awaiting_head = False

    def _expire(self) -> None:
        self._timer = None
        self._awaiting_head = False
        if self._handlers == 0 and self._transport is not None:
            self._transport.close()


def connection_watch(request: web.BaseRequest) -> ConnectionWatch | None:
    """The watch of the connection ``request`` came on (None outside a :class:`WatchedSite`)."""
    transport = request.transport
    protocol = transport.get_protocol() if transport is not None else None
    return protocol if isinstance(protocol, ConnectionWatch) else None


class WatchedSite(web.BaseSite):
    """A TCP site whose connections are each behind a :class:`ConnectionWatch`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, timeouts: ServerTimeouts):
        super().__init__(runner)
        self._host, self._port, self._timeouts = host, port, timeouts

    @property
    def name(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        make_protocol, timeouts = self._runner.server, self._timeouts
        assert make_protocol is not None  # the runner was set up (BaseSite checks)
        self._server = await asyncio.get_running_loop().create_server(
            lambda: ConnectionWatch(make_protocol(), timeouts),
            self._host,
            self._port,
            backlog=self._backlog,
        )
