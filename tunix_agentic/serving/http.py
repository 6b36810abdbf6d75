"""What the project's HTTP servers share: the API-key guard, JSON errors, the serve loop.

The engine server (``serve-engine``) and the environment server (``serve-env``)
answer errors in one shape (``{"error": {"message", "type"?}}``), require
``Authorization: Bearer KEY`` on every route but ``/health`` when a key is set,
turn an unexpected exception into a JSON 500, and serve until SIGINT or SIGTERM.
"""

from __future__ import annotations

import asyncio
import hmac
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web


def json_error(status: int, message: str, kind: str | None = None) -> web.Response:
    """``{"error": {"message": ..., "type": kind}}`` with ``status`` (``type`` when given)."""
    error: dict[str, Any] = {"message": message}
    if kind is not None:
        error["type"] = kind
    return web.json_response({"error": error}, status=status)


def api_key_guard(key_of: Callable[[web.Application], str | None], *, typed: bool = False):
    """A middleware: the app's API key (``key_of(app)``, None: none) on every route but
    ``/health`` (401 otherwise, compared in constant time); an unexpected exception
    becomes a JSON 500 (with its type name when ``typed``)."""

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        key = key_of(request.app)
        if key is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
                return json_error(401, "missing or wrong API key (send Authorization: Bearer KEY)")
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug of ours: say so in the API's error shape
            kind = type(exc).__name__
            return json_error(500, f"internal error: {kind}: {exc}", kind if typed else None)

    return guard


def url(host: str, port: int) -> str:
    """``http://host:port`` (an IPv6 host in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve_until_signal(
    start: Callable[[], Awaitable[tuple[web.AppRunner, int]]],
    banner: Callable[[int], str],
    *,
    before_cleanup: Callable[[], Awaitable[Any]] | None = None,
) -> None:
    """Start a server (``start()`` returns its runner and bound port), print
    ``banner(port)`` once listening, serve until SIGINT or SIGTERM, then run
    ``before_cleanup`` (e.g. close an engine so in-flight requests answer at once)
    and clean the runner up."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = (signal.SIGINT, signal.SIGTERM)
    runner = None
    try:
        runner, real_port = await start()
        for sig in signals:
            loop.add_signal_handler(sig, stop.set)
        print(banner(real_port), flush=True)
        await stop.wait()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
        try:
            if before_cleanup is not None:
                await before_cleanup()
        finally:
            if runner is not None:
                await runner.cleanup()
