"""A guard in front of a vLLM server that listens on loopback, for serving it beyond the
machine (a Ray engine actor does; see :mod:`tunix_agentic.cluster.vllm_actor`).

vLLM's ``--api-key`` guards ``/v1`` and ``/inference`` only: its weight routes answer
anyone, and ``POST /collective_rpc`` runs any method of its workers with any arguments
(``reload_weights`` from any path among them). The guard serves only the routes
:class:`~tunix_agentic.serving.vllm_client.VLLMEngine` uses, each behind the run's API key
(``/health`` excepted, as on our own servers), and of ``/collective_rpc`` only
``reload_weights`` with a ``weights_path`` inside the directories named at start
(``weight_dirs``, the run's ``rollout.service.weights_dir``). The path vLLM is given is the
one checked, with its links resolved. Every other route is a 404; nothing reaches vLLM
unchecked. Nothing here imports vLLM or JAX.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import aiohttp
from aiohttp import web

from tunix_agentic.serving.http import api_key_guard, json_error, load_json, serve_app
from tunix_agentic.serving.timeouts import ServerTimeouts
from tunix_agentic.serving.weights_dir import inside

# What VLLMEngine calls, and nothing else.
ROUTES = frozenset(
    {
        ("POST", "/inference/v1/generate"),
        ("POST", "/inference/v1/abort_requests"),
        ("GET", "/v1/models"),
        ("GET", "/weight_info"),
        ("GET", "/health"),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/update_weight_version"),
        ("POST", "/collective_rpc"),
    }
)
MAX_BODY_BYTES = 64 * 1024 * 1024  # a long prompt's ids
_CONNECT_S = 10.0
_SHUTDOWN_S = 5.0


@dataclasses.dataclass
class _Upstream:
    url: str  # the vLLM server on loopback
    key: str | None  # its --api-key (VLLM_API_KEY), sent on every forwarded request
    roots: tuple[Path, ...]  # where reload_weights may read
    session: aiohttp.ClientSession | None = None


_UPSTREAM = web.AppKey("vllm_upstream", _Upstream)


def reload_request(raw: bytes, roots: tuple[Path, ...]) -> tuple[int, str | bytes]:
    """``/collective_rpc``'s body checked: ``(200, body to forward)`` for
    ``{"method": "reload_weights", "kwargs": {"weights_path": P}}`` with ``P`` inside one of
    ``roots`` (forwarded with ``P``'s links resolved), else ``(status, why)``: 400 for a
    malformed body, 403 for another method, other arguments, or a path outside."""
    try:
        body = load_json(raw or b"null")
    except ValueError as exc:
        return 400, f"request body is not JSON: {exc}"
    if not isinstance(body, dict) or body.get("method") != "reload_weights":
        return 403, "only collective_rpc's reload_weights is served here"
    if set(body) != {"method", "kwargs"}:
        return 403, f"reload_weights takes kwargs only, got {sorted(body)}"
    kwargs = body["kwargs"]
    if not isinstance(kwargs, dict) or set(kwargs) != {"weights_path"}:
        return 403, "reload_weights takes kwargs {weights_path} only"
    path = kwargs["weights_path"]
    if not isinstance(path, str) or not path or "\x00" in path:
        return 400, "weights_path must be a non-empty string"
    real = Path(os.path.realpath(path))
    if not inside(real, roots):
        named = ", ".join(map(str, roots)) or "none was named"
        return 403, f"{path!r} is outside the weight directories named at start: {named}"
    forwarded = {"method": "reload_weights", "kwargs": {"weights_path": str(real)}}
    return 200, json.dumps(forwarded).encode()


async def _forward(request: web.Request) -> web.StreamResponse:
    up = request.app[_UPSTREAM]
    if (request.method, request.path) not in ROUTES:
        return json_error(404, f"not served here: {request.method} {request.path}", "NotFound")
    body = await request.read()  # already in memory (the guard read it within its timeout)
    if request.path == "/collective_rpc":
        status, checked = reload_request(body, up.roots)
        if status != 200:
            kind = "Forbidden" if status == 403 else "BadRequest"
            return json_error(status, str(checked), kind)
        body = checked
    headers = {"Content-Type": "application/json"} if body else {}
    if up.key:
        headers["Authorization"] = f"Bearer {up.key}"
    assert up.session is not None
    try:
        async with up.session.request(  # the path checked above, not the raw one
            request.method,
            up.url + request.path,
            params=list(request.query.items()),
            data=body or None,
            headers=headers,
        ) as resp:
            data = await resp.read()
            return web.Response(
                status=resp.status,
                body=data,
                content_type=resp.content_type or "application/octet-stream",
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        return json_error(502, f"vLLM at {up.url} did not answer: {exc}", "BadGateway")


async def _open(app: web.Application) -> None:
    # No total timeout: a generation takes as long as the client allows (it hangs up,
    # the handler is cancelled, and vLLM sees the connection close).
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_S)
    app[_UPSTREAM].session = aiohttp.ClientSession(timeout=timeout)


async def _close(app: web.Application) -> None:
    session = app[_UPSTREAM].session
    if session is not None:
        await session.close()


def build_guard_app(
    upstream: str,
    *,
    api_key: str,
    weight_dirs: list[str | Path] | tuple[str | Path, ...],
    upstream_key: str | None = None,
) -> web.Application:
    """The guard's application: ``api_key`` on every route but ``/health``; requests
    forwarded to ``upstream`` (vLLM's URL) with ``upstream_key`` (vLLM's own key);
    ``reload_weights`` only from inside ``weight_dirs``."""
    if not api_key:
        raise ValueError("the vLLM guard needs an API key (it serves beyond loopback)")
    roots = tuple(Path(os.path.realpath(d)) for d in weight_dirs)
    app = web.Application(
        client_max_size=MAX_BODY_BYTES, middlewares=[api_key_guard(lambda _: api_key)]
    )
    app[_UPSTREAM] = _Upstream(upstream.rstrip("/"), upstream_key, roots)
    app.on_startup.append(_open)
    app.on_cleanup.append(_close)
    app.router.add_route("*", "/{tail:.*}", _forward)  # ROUTES forwarded, the rest a 404
    return app


async def start_guard(
    upstream: str,
    *,
    host: str,
    port: int,
    api_key: str,
    weight_dirs: list[str | Path] | tuple[str | Path, ...],
    upstream_key: str | None = None,
    timeouts: ServerTimeouts | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve the guard of ``upstream`` on ``host:port`` (0: a free one) on the running
    loop; ``(runner, port)``, stopped by ``await runner.cleanup()``."""
    app = build_guard_app(
        upstream, api_key=api_key, weight_dirs=weight_dirs, upstream_key=upstream_key
    )
    return await serve_app(
        app, host, port, timeouts=timeouts or ServerTimeouts(), shutdown_timeout_s=_SHUTDOWN_S
    )
