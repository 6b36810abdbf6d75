"""``SGLangEngine``: the engine interface over SGLang's native HTTP API.

It talks to a real SGLang server or to ``tunix-agentic serve-engine`` alike
(``POST /generate`` with ``input_ids``, logprobs on), and maps the answer back
to a :class:`TokenOutput`, so agents cannot tell it from an in-process engine.

Errors are sorted for a pool: a request the server rejects (HTTP 400) raises
``ValueError`` (the caller's fault; retrying elsewhere will not help), while a
refused connection, a timeout or a 5xx raises :class:`EngineError` (fail over).

Weight updates run in the background, as on every engine: ``update_weights``
returns at once; the parameters are written to disk and the server is told to
load them in a background task; the returned handle resolves when the server
has applied them (``await wait_weights()`` awaits every update sent). The
server must see ``weights_dir`` (a shared filesystem). Several clients may share one
``weights_dir`` (a pool, one client per server, in one process or several): each
writes its own directories, ``v{version}-{writer_id}`` with a name unique to the
client, and removes only its own (on close, at interpreter exit, or after a crash at the
next client's first write: :mod:`~tunix_agentic.serving.weights_dir`); the clients of one
process write one at a time (concurrent orbax saves in a process break each other).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from tunix_agentic.inference.base import EngineError, TokenCallback, TokenOutput, WeightUpdate
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.serving.weights_dir import WeightsDirs

_MAX_CONNECTIONS = 1024  # one per in-flight request; aiohttp's default of 100 would queue
# orbax saves running at once in one process break each other (shared temporary state),
# even to different directories: this process's clients write weights one at a time.
_SAVE_LOCK = threading.Lock()
_ABORT_TIMEOUT_S = 5.0
# An idle connection is closed on our side after this long, before the server's own
# keep-alive ends it (uvicorn's default, SGLang's and vLLM's, is 5 s): a request sent on a
# connection the server is closing fails as "Server disconnected", after the server may
# have read it.
_KEEPALIVE_S = 4.0


def sampling_to_json(sampling: SamplingParams) -> dict[str, Any]:
    """SGLang ``sampling_params`` with our semantics.

    ``top_k`` off is -1 in SGLang. SGLang keeps the stop token in ``output_ids``, as our
    engines do, and checks ``stop_token_ids`` only while ``ignore_eos`` is false (0.5.23,
    ``Req._check_token_based_finish``), so ``ignore_eos`` stays false: the model's own
    end-of-sequence ids end a request too (a chat template's end of turn is among the
    run's stop ids anyway). ``no_stop_trim`` keeps it in ``text`` as well.
    """
    out: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k > 0 else -1,
        "max_new_tokens": sampling.max_new_tokens,
        "stop_token_ids": list(sampling.stop_token_ids),
        "ignore_eos": False,
        "no_stop_trim": True,
    }
    if sampling.seed is not None:
        out["sampling_seed"] = sampling.seed
    if sampling.constraint is not None:  # SGLang's own fields (json_schema, ebnf, ...)
        out.update(sampling.constraint.to_sglang())
    return out


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


# How far above 0 a reported logprob may be and still count as float noise: a softmax in
# low precision can round log(p ~ 1) up by a few ulps. Such values are kept as reported.
LOGPROB_TOLERANCE = 1e-4


class BadReply(EngineError):
    """An engine answered 200 with a reply that cannot be true (a logprob that is NaN or
    positive, a token id outside the vocabulary, a policy version ahead of the published
    one): an infrastructure error of that backend, never recorded into a trajectory."""


def parse_generate_response(
    body: Any,
    *,
    default_version: int = 0,
    vocab_size: int | None = None,
    max_version: int | None = None,
) -> TokenOutput:
    """An SGLang ``/generate`` answer -> :class:`TokenOutput`; EngineError if malformed,
    :class:`BadReply` if impossible (see :func:`check_reply`).

    Per-token versions come from our ``output_token_versions`` extension, else from
    SGLang's ``weight_versions`` spans (``[{version, start, end}]``), else every token
    gets the answer's ``weight_version`` (``default_version`` for a label that is not an
    integer, as SGLang's "default" is not).
    """
    try:
        ids = [int(t) for t in body["output_ids"]]
        meta = body["meta_info"]
        logprobs = [float(t[0]) for t in meta.get("output_token_logprobs") or []]
        finish = meta.get("finish_reason") or {}
        reason = finish.get("type", "length") if isinstance(finish, dict) else str(finish)
        matched = finish.get("matched") if isinstance(finish, dict) else None
        versions = meta.get("output_token_versions")
        if versions is None:
            last = _as_int(meta.get("weight_version"), default_version)
            versions = versions_of(meta.get("weight_versions"), len(ids), last)
        out = TokenOutput(
            token_ids=ids,
            logprobs=logprobs,
            finish_reason=reason,
            matched_stop=int(matched) if reason == "stop" and isinstance(matched, int) else None,
            versions=[int(v) for v in versions],
            prompt_tokens=int(meta.get("prompt_tokens", 0)),
            cached_tokens=int(meta.get("cached_tokens", 0)),
            latency_s=float(meta.get("e2e_latency", 0.0)),
        )
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise EngineError(f"malformed /generate response: {exc!r}") from exc
    why = check_reply(out, vocab_size=vocab_size, max_version=max_version)
    if why is not None:
        raise BadReply(f"impossible /generate reply: {why}")
    return out


def versions_of(spans: Any, n: int, default: int) -> list[int]:
    """Per-token versions of ``n`` tokens from ``[{"version", "start", "end"}, ...]`` spans
    (SGLang's and vLLM's ``weight_versions``; a label that is not an integer, or a token
    no span covers, is ``default``)."""
    versions = [default] * n
    for span in spans or ():
        v = _as_int(span["version"], default)
        for i in range(max(int(span["start"]), 0), min(int(span["end"]), n)):
            versions[i] = v
    return versions


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


async def _events(content: aiohttp.StreamReader) -> Any:
    """The ``data:`` payloads of a server-sent event stream, up to ``[DONE]`` (read in
    pieces: a last chunk with every logprob is longer than aiohttp's line limit)."""
    buffer = b""
    async for piece in content.iter_any():
        buffer += piece
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                return
            yield data.decode()


def _hand_on(chunk: Any, had: int, on_tokens: TokenCallback) -> int:
    """Give ``on_tokens`` the ids of a streamed ``/generate`` chunk that it has not had;
    returns how many it has had now (a malformed chunk gives nothing: the last one is
    checked whole)."""
    try:
        ids = [int(t) for t in chunk["output_ids"]]
        total = int(chunk["meta_info"].get("completion_tokens", len(ids)))
    except (KeyError, TypeError, ValueError, AttributeError):
        return had
    fresh = ids[had:] if len(ids) == total else ids
    if fresh:
        on_tokens(fresh)
    return had + len(fresh)


def check_reply(
    out: TokenOutput, *, vocab_size: int | None = None, max_version: int | None = None
) -> str | None:
    """Why ``out`` cannot be a true reply (the first field at fault), or None: logprobs
    finite and <= :data:`LOGPROB_TOLERANCE`, one per token when given; token ids in
    ``[0, vocab_size)``; versions one per token, in ``[0, max_version]``."""
    ids, logprobs, versions = out.token_ids, out.logprobs, out.versions
    if logprobs and len(logprobs) != len(ids):
        return f"output_token_logprobs: {len(logprobs)} for {len(ids)} tokens"
    for i, lp in enumerate(logprobs):
        if not (math.isfinite(lp) and lp <= LOGPROB_TOLERANCE):
            return f"output_token_logprobs[{i}] is {lp!r} (must be finite and <= 0)"
    for i, t in enumerate(ids):
        if t < 0 or (vocab_size is not None and t >= vocab_size):
            return f"output_ids[{i}] is {t}, outside the vocabulary [0, {vocab_size})"
    if versions and len(versions) != len(ids):
        return f"output_token_versions: {len(versions)} for {len(ids)} tokens"
    for i, v in enumerate(versions):
        if v < 0 or (max_version is not None and v > max_version):
            return f"output_token_versions[{i}] is {v}, " + (
                "negative" if v < 0 else f"ahead of the published version {max_version}"
            )
    return None


def _save_alone(path: Path, params: Any, cfg: Any = None, dtype: str | None = None) -> None:
    """``save_params`` (or with the model's ``cfg``, ``save_hf_weights``), never at the
    same time as another client's of this process."""
    # Imported here: writing weights needs orbax and JAX, a client that only generates
    # (a CPU-only rollout node) does not.
    from tunix_agentic.checkpoint import save_params
    from tunix_agentic.models.hf import save_hf_weights

    with _SAVE_LOCK:
        if cfg is None:
            save_params(path, params)
        else:
            save_hf_weights(params, cfg, path, dtype=dtype)


def _error_message(data: Any, text: str) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
        if "message" in data:
            return str(data["message"])
    return text[:1000]


class _HttpCalls:
    """The HTTP calls of a server client, each marking what it saw in the client's health:
    one ``aiohttp.ClientSession`` per event loop, a call's answer (a 5xx is an EngineError)
    or its transport failure (an EngineError). The client sets ``base_url``, ``name``,
    ``request_timeout_s``, ``_headers``, ``_sessions`` and ``_health``."""

    base_url: str
    name: str
    request_timeout_s: float
    _headers: dict[str, str]
    _sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession]
    _health: dict[str, Any]

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            self._sessions = {k: v for k, v in self._sessions.items() if not k.is_closed()}
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=_MAX_CONNECTIONS, keepalive_timeout=_KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(total=self.request_timeout_s),
                headers=self._headers,
            )
            self._sessions[loop] = session
        return session

    def _mark(self, ok: bool, **extra: Any) -> None:
        self._health = {**self._health, "ok": ok, "checked_at": time.time(), **extra}
        if ok:
            self._health.pop("error", None)

    async def _request(
        self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None
    ) -> tuple[int, Any, str]:
        """One HTTP call; returns ``(status, json or None, text)``; EngineError on transport."""
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.request_timeout_s)
        try:
            async with self._session().request(
                method, self.base_url + path, json=payload, timeout=timeout
            ) as resp:
                text = await resp.text()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._transport_error(path, timeout, exc) from exc
        return self._answered(path, status, _json_or_none(text), text)

    async def _stream(
        self, path: str, payload: Any, on_tokens: TokenCallback
    ) -> tuple[int, Any, str]:
        """A streamed ``/generate``: ``(status, last chunk, text)`` as :meth:`_request`
        answers, the ids of each chunk handed to ``on_tokens`` meanwhile. A chunk's
        ``output_ids`` are all so far when they are ``meta_info.completion_tokens`` long
        (SGLang's default), else the new ones."""
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with self._session().post(
                self.base_url + path, json=payload, timeout=timeout
            ) as resp:
                if resp.status != 200 or resp.content_type != "text/event-stream":
                    text = await resp.text()
                    status, data = resp.status, _json_or_none(text)
                    if status == 200 and isinstance(data, dict):
                        _hand_on(data, 0, on_tokens)
                else:
                    status, data, text = 200, None, ""
                    had = 0
                    async for event in _events(resp.content):
                        text, data = event, _json_or_none(event)
                        if isinstance(data, dict) and "error" in data:
                            status = 500  # a failure after the stream began
                            break
                        had = _hand_on(data, had, on_tokens)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise self._transport_error(path, timeout, exc) from exc
        return self._answered(path, status, data, text)

    def _transport_error(self, path: str, timeout: Any, exc: BaseException) -> EngineError:
        """The EngineError of a call that got no answer (marked in :meth:`health`)."""
        if isinstance(exc, TimeoutError):
            self._mark(False, status="timeout", error=f"{path} timed out")
            return EngineError(f"{self.name}: {path} timed out after {timeout.total}s")
        self._mark(False, status="unreachable", error=repr(exc))
        return EngineError(f"{self.name}: {path} failed: {exc!r}")

    def _answered(self, path: str, status: int, data: Any, text: str) -> tuple[int, Any, str]:
        """``(status, data, text)`` of an answer; EngineError for a 5xx (marked in
        :meth:`health`, as an answer is)."""
        if status >= 500:
            message = _error_message(data, text)
            self._mark(False, status=f"http {status}", error=message)
            raise EngineError(f"{self.name}: {path} answered HTTP {status}: {message}")
        self._mark(True, status="ok")
        return status, data, text


class SGLangEngine(_HttpCalls):
    """An :class:`~tunix_agentic.inference.base.InferenceEngine` over HTTP.

    One ``aiohttp.ClientSession`` per event loop, made on first use; ``await
    close()`` when done. ``health()`` answers from what the last request or
    :meth:`check_health` saw, without I/O; it starts optimistic (``ok`` True,
    ``status`` "unchecked") so a pool tries the backend before judging it.
    """

    def __init__(
        self,
        base_url: str,
        *,
        request_timeout_s: float = 300.0,
        name: str | None = None,
        weights_dir: str | None = None,
        health_timeout_s: float = 5.0,
        api_key: str | None = None,
        vocab_size: int | None = None,
        max_version: Callable[[], int | None] | None = None,
        model_cfg: Any = None,
        weights_dtype: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        # With the model's config the weights are written as Hugging Face safetensors
        # (what real SGLang and vLLM load, and serve-engine too), else as an orbax
        # checkpoint (serve-engine only). ``weights_dtype``: written as (default: the model's).
        self.model_cfg = model_cfg
        self.weights_dtype = weights_dtype
        # What a reply is checked against (BadReply otherwise): the model's vocabulary,
        # and the newest version it may carry (a rollout node's published one, read per reply).
        self.vocab_size = vocab_size
        self.max_version = max_version
        # Sent as ``Authorization: Bearer KEY`` (the scheme of SGLang's --api-key and ours).
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.name = name or self.base_url
        self.request_timeout_s = request_timeout_s
        self.health_timeout_s = health_timeout_s
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}
        self._in_flight = 0
        self._rid_prefix = f"{uuid.uuid4().hex[:12]}"
        self.writer_id = self._rid_prefix  # names the weights directories this client writes
        self._rid_counter = itertools.count()
        self._health: dict[str, Any] = {"ok": True, "status": "unchecked"}
        self._version: int | None = None  # the last version the server confirmed loading
        # What the answers report (the server's device time is not visible from here).
        self._counters = {"prefill_tokens": 0, "cached_tokens": 0, "generated_tokens": 0}
        self._background: set[asyncio.Task] = set()
        self._weight_tasks: list[asyncio.Task] = []
        self._written: Path | None = None  # our last weights directory, removed when replaced
        # Locked while we live, removed on close or exit, or by the next client after a crash.
        self._weights = WeightsDirs(weights_dir, self.writer_id)

    def use_tokenizer(self, tokenizer: Any, stop_ids: tuple[int, ...] | None = None) -> None:
        """Nothing: the server constrains decoding with its own tokenizer."""

    def move_to(self, base_url: str) -> None:
        """The server is now at ``base_url`` (restarted elsewhere: a Ray actor on another
        machine). Its health is unchecked and its weights unknown until it answers again;
        requests in flight to the old address fail as they would have."""
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"an engine's URL must be http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._version = None
        self._health = {"ok": True, "status": "unchecked"}

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ generate
    async def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        *,
        session_id: str | None = None,
        request_id: str | None = None,
        on_tokens: TokenCallback | None = None,
    ) -> TokenOutput:
        """POST ``/generate``; cancelling the caller aborts the request on the server.
        With ``on_tokens`` the request streams (``"stream": true``, SGLang's server-sent
        chunks) and each chunk's new ids are handed on; a server that answers whole
        (no streaming) hands them on once."""
        rid = request_id or f"{self._rid_prefix}-{next(self._rid_counter)}"
        payload: dict[str, Any] = {
            "input_ids": [int(t) for t in prompt_ids],
            "sampling_params": sampling_to_json(sampling),
            "return_logprob": True,
            "rid": rid,
        }
        if session_id is not None:
            payload["session_id"] = session_id
        if on_tokens is not None:
            payload["stream"] = True
        if on_tokens is None:
            sent = self._request("POST", "/generate", payload)
        else:
            sent = self._stream("/generate", payload, on_tokens)
        status, data, text = await self._sent(rid, sent)
        if status != 200:
            message = _error_message(data, text)
            if 400 <= status < 500 and status not in (404, 405):
                raise ValueError(message)
            raise EngineError(f"{self.name}: /generate answered HTTP {status}: {message}")
        return self._received(parse_generate_response, data)

    async def _sent(self, rid: str, request: Any) -> tuple[int, Any, str]:
        """Await a generate ``request`` (a coroutine of :meth:`_request`'s answer), counted
        in flight; if the caller is cancelled or it fails, the server may still be
        generating (a timeout, a cancelled caller): abort ``rid`` there."""
        self._in_flight += 1
        try:
            return await request
        except (asyncio.CancelledError, EngineError):
            self._spawn(self.abort(rid))
            raise
        finally:
            self._in_flight -= 1

    def _received(self, parse: Callable[..., TokenOutput], data: Any, **kwargs: Any) -> TokenOutput:
        """``parse(data, ...)`` checked against this client's version, vocabulary and
        newest version (a malformed or impossible reply is this backend's fault, named),
        then counted in :attr:`stats`."""
        try:
            out = parse(
                data,
                default_version=self._version or 0,
                vocab_size=self.vocab_size,
                max_version=None if self.max_version is None else self.max_version(),
                **kwargs,
            )
        except EngineError as exc:
            self._mark(False, status="bad reply", error=str(exc))
            raise type(exc)(f"{self.name}: {exc}") from exc
        self._counters["prefill_tokens"] += out.prompt_tokens - out.cached_tokens
        self._counters["cached_tokens"] += out.cached_tokens
        self._counters["generated_tokens"] += len(out.token_ids)
        return out

    async def abort(self, request_id: str) -> bool:
        """Best effort ``POST /abort_request``; False on any failure."""
        try:
            status, data, _ = await self._request(
                "POST", "/abort_request", {"rid": request_id}, timeout_s=_ABORT_TIMEOUT_S
            )
        except EngineError:
            return False
        return status == 200 and (not isinstance(data, dict) or bool(data.get("success", True)))

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._in_flight

    # -------------------------------------------------------------- status
    @property
    def version(self) -> int | None:
        """The weight version this client last had the server load; ``None`` before the
        first update (the server's own is not known here)."""
        return self._version

    @property
    def weights_path(self) -> Path | None:
        """The directory this client last had the server load (:attr:`version`'s), kept
        on disk until the next one is loaded or the client closes."""
        return self._written

    @property
    def stats(self) -> dict[str, float]:
        """Tokens prefilled, reused from the server's cache and generated, summed over the
        answers this client received."""
        return dict(self._counters)

    def clock(self) -> dict[str, float]:
        """Empty: busy and idle time are the server's, which a client cannot measure."""
        return {}

    def health(self) -> dict[str, Any]:
        """The last known health (no I/O), with this client's in-flight count."""
        return {**self._health, "name": self.name, "in_flight": self._in_flight}

    async def check_health(self) -> bool:
        """``GET /health`` with a short timeout; updates :meth:`health`."""
        try:
            status, data, text = await self._request(
                "GET", "/health", timeout_s=self.health_timeout_s
            )
        except EngineError:
            return False
        if status != 200:
            self._mark(False, status=f"http {status}", error=_error_message(data, text))
            return False
        info = data if isinstance(data, dict) else {}
        self._mark(
            True, **{k: v for k, v in info.items() if k not in ("ok", "status")}, status="ok"
        )
        return True

    async def model_info(self) -> dict[str, Any]:
        """``GET /get_model_info``."""
        status, data, text = await self._request("GET", "/get_model_info")
        if status != 200 or not isinstance(data, dict):
            raise EngineError(f"{self.name}: /get_model_info answered HTTP {status}: {text[:200]}")
        return data

    # ------------------------------------------------------------- weights
    async def update_weights_from_disk(self, path: str | Path, version: int) -> None:
        """Tell the server to load ``path`` (written by ``save_params``) as ``version``."""
        status, data, text = await self._request(
            "POST",
            "/update_weights_from_disk",
            {"model_path": str(path), "weight_version": str(int(version))},
        )
        if status != 200 or not (isinstance(data, dict) and data.get("success")):
            raise EngineError(
                f"{self.name}: update_weights_from_disk({path}) failed: {_error_message(data, text)}"
            )
        self._version = int(version)

    def update_weights(self, params: Any, version: int) -> WeightUpdate:
        """Start an asynchronous update: write ``params`` to
        ``weights_dir/v{version}-{writer_id}`` (in an executor; no other client writes
        there), then ``update_weights_from_disk``. Returns at once (call from
        the event loop) a :class:`WeightUpdate` that resolves when the server has loaded
        them, or fails with the server's error. Updates run in order; :meth:`wait_weights`
        awaits all of them."""
        # Keep unfinished tasks and failures (for wait_weights); drop the ones that landed.
        self._weight_tasks = [
            t for t in self._weight_tasks if not t.done() or t.cancelled() or t.exception()
        ]
        previous = self._weight_tasks[-1] if self._weight_tasks else None
        task = asyncio.get_running_loop().create_task(
            self._write_and_load(params, int(version), previous)
        )
        # Retrieve the exception here so an unawaited failure is not logged as lost.
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        self._weight_tasks.append(task)
        return WeightUpdate.of(task, version)

    async def _write_and_load(self, params: Any, version: int, previous: asyncio.Task | None):
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        loop = asyncio.get_running_loop()
        path = await loop.run_in_executor(None, self._weights.path_for, version)
        await loop.run_in_executor(None, self._save_weights, path, params)
        await self.update_weights_from_disk(path, version)
        old, self._written = self._written, path
        if old is not None and old != path:
            await loop.run_in_executor(None, shutil.rmtree, old, True)

    def _save_weights(self, path: Path, params: Any) -> None:
        """Write ``params`` where the server will read them: Hugging Face safetensors
        named as ``model_cfg`` names them, or without it an orbax checkpoint."""
        _save_alone(path, params, self.model_cfg, self.weights_dtype)

    async def wait_weights(self) -> None:
        """Await pending weight updates; re-raise the first failure."""
        tasks, self._weight_tasks = self._weight_tasks, []
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result

    # --------------------------------------------------------------- close
    async def close(self) -> None:
        """Let pending weight updates and aborts finish, then close this loop's session.

        A weights directory this client made itself is removed; in a ``weights_dir`` it
        was given, the last parameters it wrote (the server holds them in memory).
        """
        await asyncio.gather(*self._weight_tasks, *self._background, return_exceptions=True)
        loop = asyncio.get_running_loop()
        session = self._sessions.pop(loop, None)
        if session is not None:
            await session.close()
        await loop.run_in_executor(None, self._weights.close)
        self._written = None
