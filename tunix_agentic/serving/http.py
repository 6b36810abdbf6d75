"""What the project's HTTP servers share: the API-key guard, JSON errors, the serve loop.

The engine server (``serve-engine``), the environment server (``serve-env``) and the
rollout node (``serve-rollout``) run in one frame (:func:`run_server_main`), read their
bodies with :func:`read_json`, answer errors in one shape (``{"error": {"message",
"type"?}}``; aiohttp's own, such as 413 for a body over the limit, included), require
``Authorization: Bearer KEY`` on every route but ``/health`` when a key is set, turn an
unexpected exception into a JSON 500, cut off slow clients
(:class:`~tunix_agentic.serving.timeouts.ServerTimeouts`), and serve until SIGINT or
SIGTERM.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from tunix_agentic.serving.timeouts import ServerTimeouts, WatchedSite, connection_watch

API_KEY_ENV = "TUNIX_AGENTIC_API_KEY"
# Set on a request whose Authorization header :func:`api_key_guard` checked against the app's
# keys: only then does the header say who the client is (anyone can send a made-up one).
KEY_CHECKED = "tunix_agentic.api_key_checked"
# Nesting a client's JSON may have (bodies, tool-call arguments): deeper is a 400 naming the
# limit, never a RecursionError (a 500, which OpenAI clients retry) in a later step.
MAX_JSON_DEPTH = 64
TIMEOUTS = web.AppKey("server_timeouts", ServerTimeouts)
_DEFAULT_TIMEOUTS = ServerTimeouts()


def resolve_api_key(given: str | None) -> str | None:
    """The API key a server or client uses: ``given`` when it is one, else
    ``$TUNIX_AGENTIC_API_KEY``, else None (no key)."""
    return given or os.environ.get(API_KEY_ENV) or None


def json_error(
    status: int, message: str, kind: str | None = None, code: str | None = None
) -> web.Response:
    """``{"error": {"message": ..., "type": kind, "code": code}}`` with ``status`` (``type``
    and ``code`` when given)."""
    error: dict[str, Any] = {"message": message}
    if kind is not None:
        error["type"] = kind
    if code is not None:
        error["code"] = code
    return web.json_response({"error": error}, status=status)


class JSONDepthError(ValueError):
    """A client's JSON nested deeper than :data:`MAX_JSON_DEPTH` (a 400)."""


def json_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((x, depth + 1) for x in item if isinstance(x, dict | list))
    return deepest


def load_json(raw: str | bytes, where: str = "request body", max_depth: int = MAX_JSON_DEPTH):
    """``json.loads`` of a client's text: ValueError naming ``where`` when it is not JSON,
    :class:`JSONDepthError` naming the limit when it nests deeper than ``max_depth``."""
    try:
        value = json.loads(raw)
    except RecursionError:
        how = "too deep for the parser"
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError both are
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    else:
        depth = json_depth(value)
        if depth <= max_depth:
            return value
        how = f"{depth} levels deep"
    raise JSONDepthError(f"{where} nests lists and objects {how}; the limit is {max_depth} levels")


# Bodies larger than this are parsed on a worker thread: the loop keeps answering /health
# and other requests meanwhile.
OFF_LOOP_BYTES = 256 * 1024
_NO_DEFAULT: Any = object()


async def off_loop_if_large(size: int, fn: Callable[[], Any]) -> Any:
    """``fn()`` here for a small body (``size`` up to :data:`OFF_LOOP_BYTES`), on a worker
    thread for a large one (the loop keeps answering ``/health`` and other requests
    meanwhile)."""
    if size <= OFF_LOOP_BYTES:
        return fn()
    return await asyncio.get_running_loop().run_in_executor(None, fn)


async def read_json(
    request: web.Request, *, if_empty: Any = _NO_DEFAULT, object_only: bool = False
) -> Any:
    """A request's body as JSON (:func:`load_json`: ValueError when it is not JSON or nests
    too deep), parsed off the event loop when over :data:`OFF_LOOP_BYTES`. ``if_empty``:
    what an empty body stands for (by default it is not JSON); ``object_only``: anything
    but a JSON object is a ValueError too."""
    raw = await request.read()
    if if_empty is not _NO_DEFAULT and not raw.strip():
        return if_empty
    value = await off_loop_if_large(len(raw), lambda: load_json(raw))
    if object_only and not isinstance(value, dict):
        raise ValueError("request body must be a JSON object")
    return value


def api_key_guard(
    key_of: Callable[[web.Application], str | tuple[str, ...] | None], *, typed: bool = False
):
    """A middleware: the app's API key (``key_of(app)``: one key, a tuple of keys any of
    which is accepted, or None: none) on every route but
    ``/health`` (401 otherwise, compared in constant time); the body read within the app's
    :class:`ServerTimeouts` ``body_s`` (408 otherwise; a handler's ``request.read()`` then
    answers from memory); aiohttp's HTTP errors (404, 405, 413...) as JSON; an unexpected
    exception a JSON 500 (with its type name when ``typed``). It tells the connection's
    :class:`~tunix_agentic.serving.timeouts.ConnectionWatch` when a request starts and ends.
    """

    @web.middleware
    async def guard(request: web.Request, handler) -> web.StreamResponse:
        watch = connection_watch(request)
        if watch is not None:
            watch.request_started()
        try:
            key = key_of(request.app)
            if key is not None and request.path != "/health":
                given = request.headers.get("Authorization", "").encode()
                keys = (key,) if isinstance(key, str) else key
                # Every key compared (no early exit): the time says nothing of which matched.
                if not sum(hmac.compare_digest(given, f"Bearer {k}".encode()) for k in keys):
                    message = "missing or wrong API key (send Authorization: Bearer KEY)"
                    return json_error(401, message, "Unauthorized")
                request[KEY_CHECKED] = True  # the credential is one of the app's keys
            try:
                body_s = request.app.get(TIMEOUTS, _DEFAULT_TIMEOUTS).body_s
                try:
                    async with asyncio.timeout(body_s):
                        await request.read()
                except TimeoutError:
                    response = json_error(
                        408,
                        f"the request body did not arrive within {body_s:g}s",
                        "RequestTimeout",
                    )
                    response.force_close()  # the rest of the body must not read as a request
                    return response
                return await handler(request)
            except web.HTTPException as exc:
                if exc.status < 400:
                    raise
                return _http_error(request, exc)
            except Exception as exc:  # a bug of ours: say so in the API's error shape
                kind = type(exc).__name__
                return json_error(500, f"internal error: {kind}: {exc}", kind if typed else None)
        finally:
            if watch is not None:
                watch.request_finished()

    return guard


def client_identity(request: web.Request) -> str:
    """Who a request comes from, for per-client caps and ownership: the API key the app
    checked (hashed), else the peer's address. On an app without keys a header is no
    identity: a client sending a new made-up ``Authorization`` on every call would
    otherwise count as many clients, or pass for another."""
    auth = request.headers.get("Authorization")
    if auth and request.get(KEY_CHECKED):
        return "key:" + hashlib.sha256(auth.encode()).hexdigest()[:32]
    return f"addr:{request.remote}"


def _http_error(request: web.Request, exc: web.HTTPException) -> web.Response:
    """aiohttp's HTTP error (413 too large, 404 no route, ...) in the API's error shape."""
    default = f"{exc.status}: {exc.reason}"
    text = exc.text if exc.text and exc.text != default else None
    message = text or f"{exc.reason}: {request.method} {request.path}"
    response = json_error(exc.status, message, type(exc).__name__.removeprefix("HTTP"))
    for name, value in exc.headers.items():  # Allow (405) and the like
        if name.lower() not in ("content-type", "content-length"):
            response.headers[name] = value
    if exc.status == 413:
        response.force_close()  # the unread rest of the body must not read as a request
    return response


async def serve_app(
    app: web.Application,
    host: str,
    port: int,
    *,
    timeouts: ServerTimeouts,
    shutdown_timeout_s: float,
) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on the running loop through a :class:`WatchedSite`; returns ``(runner,
    port)`` (``port=0``: a free one). ``await runner.cleanup()`` stops it.

    ``handler_cancellation``: a client that hangs up cancels its handler (an aborted
    generation, a freed episode).
    """
    app[TIMEOUTS] = timeouts
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=shutdown_timeout_s
    )
    await runner.setup()
    try:
        await WatchedSite(runner, host, port, timeouts).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, runner.addresses[0][1]


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(host: str, api_key: str | None) -> None:
    """ValueError unless ``host`` is loopback or an API key guards the server."""
    if not is_loopback(host) and not api_key:
        raise ValueError(
            f"refusing to serve on {host} (beyond this machine) without an API key: "
            f"pass --api-key KEY or set {API_KEY_ENV}"
        )


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


def run_server_main(
    host: str,
    port: int,
    api_key: str | None,
    set_up: Callable[[str | None], Callable[[], Awaitable[None]]],
    *,
    refused: tuple[type[Exception], ...] = (),
    refused_serving: tuple[type[Exception], ...] = (),
) -> int:
    """The frame of a server's ``main`` (``serve-engine``, ``serve-env``,
    ``serve-rollout``: each parses its own arguments and gives its own ``set_up``).

    The API key is ``api_key``, else ``$TUNIX_AGENTIC_API_KEY`` (:func:`resolve_api_key`);
    a host beyond loopback needs one (:func:`check_exposure`). ``set_up(key)`` builds what
    is served and returns the coroutine function serving it until SIGINT or SIGTERM
    (through :func:`serve_until_signal`), run here on a fresh event loop. Returns the exit
    status: 0 once stopped; 2, with the error on stderr, for a ``ValueError`` (a refused
    exposure, a bad argument or config) or an error of ``refused`` from ``set_up``, or one
    of ``refused_serving`` while serving (a state dir another node holds); 1 when the
    address cannot be bound (an ``OSError`` while serving)."""
    api_key = resolve_api_key(api_key)
    try:
        check_exposure(host, api_key)
        serve = set_up(api_key)
    except (ValueError, *refused) as exc:
        return _refuse(exc)
    try:
        asyncio.run(serve())
    except refused_serving as exc:
        return _refuse(exc)
    except OSError as exc:  # the port is taken, the host is not ours
        print(f"tunix-agentic: error: cannot serve on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    return 0


def _refuse(exc: Exception) -> int:
    print(f"tunix-agentic: error: {exc}", file=sys.stderr)
    return 2
