"""Serve a :class:`JaxEngine` over HTTP with SGLang's native API.

The endpoints are the subset of SGLang's that RL rollout needs, with the same
wire format, so :class:`~tunix_agentic.serving.client.SGLangEngine` talks to
this server and to a real SGLang server alike:

- ``POST /generate``: ``input_ids`` (one prompt, or a list of prompts answered
  by a list of results), ``sampling_params``, ``return_logprob``, ``rid``, and
  our extension ``session_id`` (per-session KV reuse). The answer carries
  ``output_ids`` and ``meta_info`` (finish reason, token counts, logprobs as
  ``[logprob, token_id, null]`` triples, and our extension
  ``output_token_versions``: the policy version of every token). With
  ``"stream": true`` (one prompt) the answer is SGLang's server-sent events: a chunk
  per collected decode chunk with the new ``output_ids`` (``meta_info``:
  ``completion_tokens`` so far, ``finish_reason`` null), then the whole result as
  above (cut at a ``stop`` string: the ids streamed before it are provisional),
  then ``data: [DONE]``; a failure after the first chunk is a last
  ``{"error": {...}}`` event.
- Stopping as SGLang does: at the model's end-of-sequence ids (read from its
  Hugging Face directory: ``generation_config.json`` / ``tokenizer_config.json``)
  unless ``ignore_eos`` is true; at ``stop`` strings; ``text`` decoded with or
  without special tokens (``skip_special_tokens``) when the tokenizer is known
  (:mod:`tunix_agentic.serving.stops`).
- ``GET /health``, ``GET /get_model_info``, ``GET /get_server_info`` (what
  sglang-router reads when it registers a worker; also under SGLang's newer names
  ``/model_info`` and ``/server_info``), ``POST /abort_request``,
  ``POST /update_weights_from_disk`` (a directory written by
  :func:`tunix_agentic.checkpoint.save_params`).

A malformed request gets HTTP 400 with ``{"error": {"message": ...}}`` (every
field is checked against its bounds: ``top_k`` within the vocabulary, seeds
within 64 bits, finite temperatures, stop ids within the vocabulary, a cap on
prompts and tokens per request), and fails that request only; a closed engine
gets 503. Large bodies are parsed off the event loop, so ``/health`` stays
responsive; a body over ``MAX_BODY_BYTES`` gets a JSON 413, a slow one a JSON 408
(:class:`~tunix_agentic.serving.timeouts.ServerTimeouts`). With an API key every
route but ``/health`` requires ``Authorization: Bearer KEY`` (401 otherwise);
``/update_weights_from_disk`` loads only from directories named when the server
was built (403 otherwise), reading through a descriptor of the directory it checked
(a link swapped after the check changes nothing).
Run the app with ``handler_cancellation=True`` (as :func:`start_server` does)
so that a client hanging up aborts its generation.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from tunix_agentic.inference.base import EngineError, TokenOutput
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.serving import weight_load
from tunix_agentic.serving.generate_request import GenerateRequest, parse_generate, parse_version
from tunix_agentic.serving.http import (
    ServerTimeouts,
    api_key_guard,
    check_exposure,
    json_error,
    off_loop_if_large,
    read_json,
    serve_app,
    serve_until_signal,
    url,
)
from tunix_agentic.serving.prom import EngineCollector, add_prometheus
from tunix_agentic.serving.stops import ModelText, cut_off_loop, output_text
from tunix_agentic.serving.validation import NonEmpty, Strict, validate_body

MAX_BODY_BYTES = 64 * 1024 * 1024  # a batch of long prompts is far past aiohttp's 1 MiB default
_SHUTDOWN_TIMEOUT_S = 5.0


# ----------------------------------------------------------------- handlers
class _ServerState:
    """What the handlers share besides the engine."""

    def __init__(
        self,
        engine: JaxEngine,
        model_info: dict[str, Any],
        *,
        api_key: str | None = None,
        weight_dirs: tuple[Path, ...] = (),
        text: ModelText | None = None,
    ):
        self.engine = engine
        self.model_info = model_info
        self.text = text or ModelText()
        self.api_key = api_key
        self.weight_dirs = weight_dirs
        self.weights_lock = asyncio.Lock()
        # The last version handed to the engine: the engine applies it at its next
        # chunk boundary, so ``engine.version`` may still show the previous one.
        self.requested_version = engine.version
        self._rid_prefix = f"srv-{uuid.uuid4().hex[:8]}"  # never a client's rid by accident
        self._rid_counter = itertools.count()

    def new_rid(self) -> str:
        return f"{self._rid_prefix}-{next(self._rid_counter)}"


_STATE = web.AppKey("state", _ServerState)


def _error(status: int, message: str) -> web.Response:
    return json_error(status, message)


def format_output(
    out: TokenOutput,
    *,
    rid: str,
    return_logprob: bool,
    weight_version: int,
    e2e_latency: float,
    text: str | None = None,
    matched_string: str | None = None,
) -> dict[str, Any]:
    """One ``/generate`` result in SGLang's shape (plus ``output_token_versions``);
    ``text`` when the server knows the tokenizer, ``matched_string`` a stop string's."""
    n = len(out.token_ids)
    if out.finish_reason == "stop":
        matched = matched_string if matched_string is not None else out.matched_stop
        finish: dict[str, Any] = {"type": "stop", "matched": matched}
    elif out.finish_reason == "length":
        finish = {"type": "length", "length": n}
    else:
        finish = {"type": "abort", "message": "request aborted"}
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": finish,
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": n,
        "cached_tokens": out.cached_tokens,
        "weight_version": str(weight_version),
        "output_token_versions": list(out.versions),
        "e2e_latency": e2e_latency,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, None] for lp, tok in zip(out.logprobs, out.token_ids, strict=True)
        ]
    body: dict[str, Any] = {"output_ids": list(out.token_ids), "meta_info": meta}
    if text is not None:
        body = {"text": text, **body}
    return body


async def _generate_one(
    engine: JaxEngine,
    req: GenerateRequest,
    t0: float,
    model_text: ModelText | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> dict[str, Any]:
    model_text = model_text or ModelText()
    out = await engine.generate(
        req.input_ids,
        req.sampling,
        session_id=req.session_id,
        request_id=req.rid,
        on_tokens=on_tokens,
    )
    match = await cut_off_loop(out, req.stop, model_text)
    if match is not None:
        out = match.output
    matched = None if match is None else match.matched
    return format_output(
        out,
        rid=req.rid,
        return_logprob=req.return_logprob,
        weight_version=engine.version,
        e2e_latency=time.perf_counter() - t0,
        text=output_text(
            out, model_text, skip_special_tokens=req.skip_special_tokens, matched=matched
        ),
        matched_string=matched,
    )


async def _generate_all(
    engine: JaxEngine,
    reqs: list[GenerateRequest],
    t0: float,
    model_text: ModelText | None = None,
) -> list[dict[str, Any]]:
    """Run a batch concurrently; the first failure cancels (aborts) the rest."""
    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(_generate_one(engine, r, t0, model_text)) for r in reqs]
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None
    return [t.result() for t in tasks]


async def _event_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    return response


async def _event(response: web.StreamResponse, body: Any) -> None:
    await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")


async def _stream_one(
    request: web.Request, engine: JaxEngine, req: GenerateRequest, t0: float, text: ModelText
) -> web.StreamResponse:
    """One prompt answered as server-sent events (the module's docstring). A failure
    before the first chunk raises as an unstreamed request's does (a 400 or 503)."""
    fresh: asyncio.Queue[list[int]] = asyncio.Queue()
    task = asyncio.ensure_future(_generate_one(engine, req, t0, text, fresh.put_nowait))
    response: web.StreamResponse | None = None
    sent = 0
    try:
        while True:
            getter = asyncio.ensure_future(fresh.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            ids = getter.result()
            sent += len(ids)
            response = response or await _event_stream(request)
            meta = {"id": req.rid, "finish_reason": None, "completion_tokens": sent}
            await _event(response, {"output_ids": ids, "meta_info": meta})
        try:
            result = task.result()
        except (ValueError, EngineError) as exc:
            if response is None:
                raise
            result = {"error": {"message": str(exc), "type": type(exc).__name__}}
        response = response or await _event_stream(request)
        await _event(response, result)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    finally:
        task.cancel()  # the client left (this handler was cancelled): abort the request


async def handle_generate(request: web.Request) -> web.StreamResponse:
    t0 = time.perf_counter()
    state = request.app[_STATE]
    engine = state.engine
    try:
        body = await read_json(request)
        reqs, batched = await off_loop_if_large(
            request.content_length or 0,
            lambda: parse_generate(
                body,
                vocab_size=engine.model_config.vocab_size,
                max_seq_len=engine.config.max_seq_len,
                new_rid=state.new_rid,
                eos_ids=state.text.eos_ids,
                can_decode=state.text.tokenizer is not None,
            ),
        )
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise ValueError(f"stream must be true or false, got {stream!r}")
        if stream:
            if batched:
                raise ValueError("stream takes one prompt: send a batch without stream")
            return await _stream_one(request, engine, reqs[0], t0, state.text)
        if batched:
            result: Any = await _generate_all(engine, reqs, t0, state.text)
        else:
            result = await _generate_one(engine, reqs[0], t0, state.text)
    except ValueError as exc:  # PromptTooLongError and a duplicate rid included
        return _error(400, str(exc))
    except EngineError as exc:
        return _error(503, str(exc))
    return web.json_response(result)


_guard = api_key_guard(lambda app: app[_STATE].api_key)


async def handle_health(request: web.Request) -> web.Response:
    health = request.app[_STATE].engine.health()
    if not health.get("ok", False):
        return web.json_response({"status": "closed", **health}, status=503)
    return web.json_response({"status": "ok", **health})


async def handle_model_info(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    return web.json_response({**state.model_info, "weight_version": str(state.engine.version)})


async def handle_server_info(request: web.Request) -> web.Response:
    """SGLang's ``/get_server_info`` (and its newer name ``/server_info``): the server's
    settings under SGLang's names. sglang-router reads a worker's model, tokenizer and
    data-parallel size here when it registers the worker."""
    from tunix_agentic import __version__

    state = request.app[_STATE]
    engine, info = state.engine, state.model_info
    tokenizer = info.get("tokenizer_path") or None
    return web.json_response(
        {
            # Without a tokenizer no model_path: the router would fetch one by that name.
            **({"model_path": info["model_path"]} if tokenizer else {}),
            "served_model_name": info["model_path"],
            "tokenizer_path": tokenizer,
            "skip_tokenizer_init": tokenizer is None,
            "is_generation": True,
            "context_length": info["max_seq_len"],
            "max_running_requests": engine.config.max_slots,
            "max_total_num_tokens": engine.config.max_slots * engine.config.max_seq_len,
            "dp_size": 1,
            "weight_version": str(engine.version),
            "internal_states": [{"in_flight": engine.in_flight, **engine.stats}],
            "version": f"tunix-agentic {__version__}",
        }
    )


class _Abort(Strict, extra="ignore"):
    """``POST /abort_request``: the request to abort (SGLang's other fields are ignored)."""

    rid: str


class _Weights(Strict, extra="ignore"):
    """``POST /update_weights_from_disk``: the directory to load and, optionally, the
    version it is (checked by :func:`parse_version`; SGLang's other fields are ignored)."""

    model_path: NonEmpty
    weight_version: Any = None


async def handle_abort(request: web.Request) -> web.Response:
    try:
        body = await read_json(request)
        rid = validate_body(_Abort, body, shape='{"rid": RID}').rid
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response({"success": request.app[_STATE].engine.abort(rid)})


async def handle_update_weights(request: web.Request) -> web.Response:
    """Load parameters from disk and hand them to the engine between decode chunks."""
    state = request.app[_STATE]
    engine = state.engine

    def fail(message: str) -> web.Response:
        return web.json_response({"success": False, "message": message}, status=400)

    try:
        body = validate_body(_Weights, await read_json(request), shape='{"model_path": DIR}')
    except ValueError as exc:
        return fail(str(exc))
    path = body.model_path
    if not weight_load.inside(os.path.realpath(path), state.weight_dirs):
        return _outside(path, state.weight_dirs)
    async with state.weights_lock:
        try:
            version = parse_version(
                body.weight_version, default=max(engine.version, state.requested_version) + 1
            )
        except ValueError as exc:
            return fail(str(exc))
        try:  # what is loaded is the directory this checks, whatever links change later
            fd = weight_load.open_inside(path, state.weight_dirs)
        except OSError as exc:  # no such directory
            return fail(f"cannot load weights from {path!r}: {type(exc).__name__}: {exc}")
        if fd is None:
            return _outside(path, state.weight_dirs)
        loop = asyncio.get_running_loop()
        params_like = engine.params  # the tree to restore into
        try:
            params = await loop.run_in_executor(
                None,
                weight_load.load_pinned,
                fd,
                params_like,
                engine.model_config,
            )
            update = engine.update_weights(params, version)
        except Exception as exc:  # a mismatched tree, an unreadable checkpoint
            return fail(f"cannot load weights from {path!r}: {type(exc).__name__}: {exc}")
        state.requested_version = version
        try:
            await update  # answered once the engine generates with them
        except EngineError as exc:
            return web.json_response(
                {"success": False, "message": f"the engine did not apply {path!r}: {exc}"},
                status=503,
            )
    return web.json_response(
        {
            "success": True,
            "message": f"loaded {path}; the engine generates with weight version {version}",
            "weight_version": str(version),
            "num_paused_requests": 0,
        }
    )


def _outside(path: str, roots: tuple[Path, ...]) -> web.Response:
    named = ", ".join(map(str, roots)) or "none was named"
    return web.json_response(
        {
            "success": False,
            "message": f"{path!r} is outside the weight directories named at start "
            f"(serve-engine --weights-dir DIR): {named}",
        },
        status=403,
    )


def build_app(
    engine: JaxEngine,
    *,
    model_info: dict[str, Any],
    api_key: str | None = None,
    weight_dirs: tuple[str | Path, ...] | list[str | Path] = (),
) -> web.Application:
    """The aiohttp application serving ``engine``.

    ``model_info`` is answered by ``GET /get_model_info``; ``model_path``,
    ``vocab_size`` and ``max_seq_len`` are filled in when missing, and
    ``weight_version`` is always the engine's current one. ``api_key``: every
    route but ``/health`` requires ``Authorization: Bearer KEY``.
    ``weight_dirs``: the only directories ``/update_weights_from_disk`` loads
    from (none: it loads nothing). ``model_info["tokenizer_path"]`` (a Hugging Face
    model directory) gives the model's end-of-sequence ids, at which every request
    stops unless it sets ``ignore_eos``, and its tokenizer (``stop`` strings and the
    answers' ``text``); ``model_info["eos_token_ids"]`` overrides the ids.
    """
    if api_key is not None and not api_key:
        raise ValueError("api_key must not be empty")
    info = {
        "model_path": "",
        "is_generation": True,
        "vocab_size": engine.model_config.vocab_size,
        "max_seq_len": engine.config.max_seq_len,
        **model_info,
    }
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_guard])
    roots = tuple(Path(os.path.realpath(d)) for d in weight_dirs)
    text = ModelText.from_model_info(info)
    info["eos_token_ids"] = list(text.eos_ids)
    if text.tokenizer is not None:  # constraints (an engine given one already keeps it)
        engine.use_tokenizer(text.tokenizer, text.eos_ids or None)
    app[_STATE] = _ServerState(engine, info, api_key=api_key, weight_dirs=roots, text=text)
    app.router.add_post("/generate", handle_generate)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/get_model_info", handle_model_info)
    app.router.add_get("/model_info", handle_model_info)
    app.router.add_get("/get_server_info", handle_server_info)
    app.router.add_get("/server_info", handle_server_info)
    app.router.add_post("/abort_request", handle_abort)
    app.router.add_post("/update_weights_from_disk", handle_update_weights)
    add_prometheus(app, EngineCollector(engine))  # GET /metrics
    return app


async def start_server(
    engine: JaxEngine,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    model_info: dict[str, Any] | None = None,
    api_key: str | None = None,
    weight_dirs: tuple[str | Path, ...] | list[str | Path] = (),
    timeouts: ServerTimeouts | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve ``engine`` on the running loop; returns ``(runner, port)``.

    ``port=0`` picks a free port. Stop with ``await runner.cleanup()``; the
    engine stays open (close it yourself). Refuses (ValueError) to listen
    beyond loopback without an ``api_key``; see :func:`build_app` for
    ``weight_dirs``. ``timeouts``: how long a client may take to send a
    request (default :class:`ServerTimeouts`).
    """
    check_exposure(host, api_key)
    app = build_app(engine, model_info=model_info or {}, api_key=api_key, weight_dirs=weight_dirs)
    return await serve_app(
        app,
        host,
        port,
        timeouts=timeouts or ServerTimeouts(),
        shutdown_timeout_s=_SHUTDOWN_TIMEOUT_S,
    )


async def serve_engine(engine: JaxEngine, host: str, port: int, **options: Any) -> None:
    """Serve ``engine`` (:func:`start_server`'s ``options``) until SIGINT or SIGTERM, then
    close it; prints ``serving on http://HOST:PORT`` once the port is open."""
    await serve_until_signal(
        lambda: start_server(engine, host=host, port=port, **options),
        lambda real_port: f"serving on {url(host, real_port)}",
        before_cleanup=engine.close,  # first, so in-flight requests answer "abort" at once
    )


def serve_forever(
    engine: JaxEngine,
    host: str = "127.0.0.1",
    port: int = 30000,
    model_info: dict[str, Any] | None = None,
    *,
    api_key: str | None = None,
    weight_dirs: tuple[str | Path, ...] | list[str | Path] = (),
    timeouts: ServerTimeouts | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then close the engine (blocking; for the CLI).

    Prints one line, ``serving on http://HOST:PORT``, once the port is open.
    """
    asyncio.run(
        serve_engine(
            engine,
            host,
            port,
            model_info=model_info,
            api_key=api_key,
            weight_dirs=weight_dirs,
            timeouts=timeouts,
        )
    )
