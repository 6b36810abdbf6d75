"""An OpenAI-compatible chat endpoint that records tokens, so any agent can be trained.

Routes (JSON; errors ``{"error": {"message", "type"}}`` with a 4xx naming the field, and
``code`` where OpenAI gives one):

* ``POST /v1/chat/completions``: ``messages`` (roles system, developer (as system), user,
  assistant, tool), ``tools``, ``tool_choice`` ("auto" or "none"), ``temperature``,
  ``top_p``, ``top_k``, ``max_tokens`` / ``max_completion_tokens``, ``n``, ``seed``,
  ``stop``, ``logprobs``, ``stream`` and ``stream_options`` (what else is accepted or
  refused: :mod:`~tunix_agentic.rollout.openai_endpoint.schema`). The conversation is
  rendered with the model's chat template and tokenised once; the reply is OpenAI's
  ``chat.completion`` (tool calls parsed into ``tool_calls`` with the agent loop's parser,
  ``finish_reason`` "stop" | "tool_calls" | "length", ``usage`` counted in tokens;
  :mod:`~tunix_agentic.rollout.openai_endpoint.reply`). Only calls to a tool the request
  offered are returned: a call to any other tool stays in the content as text and is
  counted (``unoffered_tool_calls`` in the recording and in :attr:`ChatCompletions.counts`).
  ``tool_choice`` "none" hides the tools and parses no calls. ``stop`` (a string or up
  to 4): the completion is cut after the token that completes the first stop string
  found in its text (:func:`~tunix_agentic.serving.stops.cut_at_stop_string`, as
  ``serve-engine`` cuts SGLang's ``stop``; the engine decodes on to its end-of-turn token
  or ``max_tokens`` meanwhile): the content ends before the stop string, the recorded
  ids end with that token (the learner trains on them, the stop's tokens included, and
  an episode's next call continues from them, the template's end-of-turn id after them).
  ``logprobs``: each choice's ``logprobs.content`` (one entry per id of its text).
  ``stream``: server-sent ``chat.completion.chunk`` events, then ``data: [DONE]``: the
  same reply (same sampling, same recording) framed as deltas. One choice without
  ``logprobs`` shows its content while the engine samples it (the engine streams its ids:
  ``on_tokens``; what may still change is held back: :mod:`.live`); tool calls, what
  follows a tool-call block or a stop string, ``finish_reason`` and the rest come once the
  call is recorded, and ``n`` > 1 or ``logprobs`` replies are framed then, whole. With
  ``stream_options.include_usage`` a last chunk holds ``usage``; an engine failure after
  the stream began is a last ``{"error": ...}`` event. A client that closes its
  connection before it has the reply (streamed or not) aborts the engine's request (on a
  server that cancels a gone client's handler, as
  :func:`~tunix_agentic.serving.http.serve_app` does), and its call is recorded as
  ``cut``: shown in ``GET /v1/episodes/{id}``, never trained on.
* ``GET /v1/models`` (and ``/v1/models/{id}``): the served policy, ``id`` the
  configured ``model_name`` (``"policy"`` unless configured) and ``policy_version`` the
  weights' version now. A chat or Responses call may leave ``model`` out or send that
  name; another is a 404 as OpenAI answers it (``invalid_request_error``, code
  ``model_not_found``, the message naming the model), before anything is recorded.
* ``POST /v1/responses``: the Responses API subset agent frameworks send (not stateful),
  translated into a chat request and served by the same call path (:meth:`serve_call`):
  see :mod:`~tunix_agentic.rollout.openai_endpoint.responses`.
* A call with an ``X-Episode-Id: ID`` header is recorded (prompt ids, completion ids,
  logprobs, per-token policy versions) into the episode of that id and its
  ``X-Episode-Token`` (the client's own, 16-200 characters, or, when the call sends none,
  a fresh one the server makes; the answer's ``X-Episode-Token`` header holds it): only the
  token's holder continues, reads, rewards or closes it, and the same id with another
  token is another client's episode (see
  :mod:`~tunix_agentic.rollout.openai_endpoint.episodes`). A call that fails opens nothing.
  The recording keeps
  the calls' tokens exactly: when its messages continue an earlier call of
  the episode (that call's messages, then the assistant message it returned, then new
  ones), the prompt ids are that call's prompt + completion ids followed by the template's
  ids for the new messages: what the model generated is never re-tokenised, so the calls
  chain into one learner row. Otherwise the whole conversation is rendered. Episodes are
  bounded (:class:`~tunix_agentic.rollout.openai_endpoint.episodes.EpisodeLimits`: 429 when
  too many are open, 413 past an episode's calls or tokens, 409 on a closed one; an
  idle one expires). ``call_defaults(episode_key, calls)`` may supply sampling values
  (``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``seed``) for the fields a
  recorded call omits: a rollout node sets it to the group's sampling for the members of
  its ``"agent": "external"`` groups.
* ``POST /v1/episodes/{id}/reward`` ``{"reward": r, "task_id"?: str, "info"?: {...}}``
  closes the episode; ``GET /v1/episodes/{id}`` returns what was recorded (and, once
  closed, ``trajectory``: the learner's trajectory in the rollout wire format). Both
  need the episode's ``X-Episode-Token`` (401 without; 404 with another).

Mounting (the rollout node does this on its aiohttp app)::

    from tunix_agentic.rollout.openai_endpoint.api import add_openai_routes
    api = add_openai_routes(app, engine=pool, chat_format=template, version_of=lambda: v)
    # api.store: the EpisodeStore; episode_trajectory(ep) / ExternalEpisodes(api.store, ...)

``engine``: any :class:`~tunix_agentic.inference.base.InferenceEngine` (an EnginePool, a
JaxEngine, an SGLang client). ``chat_format``: the run's template (the built-in
:class:`~tunix_agentic.agent.chat.ChatTemplate` is served through its Jinja twin
``BUILTIN_CHAT_TEMPLATE``). A conversation renders as the agent loop frames its prompts
(:mod:`~tunix_agentic.rollout.openai_endpoint.prompt`): tools the template drops go to the
system prompt when its ``tools_fallback`` is ``"system"``, and assistant tool calls a
template drops are written after the content in
:func:`~tunix_agentic.agent.tool_parser.format_tool_call`'s form.
``version_of()``: the policy version now (recorded per call; per-token versions come
from the engine). The app's API-key guard and error middleware
(:func:`tunix_agentic.serving.http.api_key_guard`) apply as to its other routes.
Host-side only: nothing here imports JAX.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from tunix_agentic.agent.chat import (
    ChatFormat,
    TemplateError,
)
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    PromptTooLongError,
    TokenOutput,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.rollout.config import check_reward_limit
from tunix_agentic.rollout.openai_endpoint.episodes import (
    TOKEN_PATTERN,
    Call,
    Completion,
    EpisodeLimits,
    EpisodeStore,
    episode_key,
    episode_trajectory,
    new_token,
)
from tunix_agentic.rollout.openai_endpoint.live import TOOL_CALL_MARKER, LiveStream, LiveText
from tunix_agentic.rollout.openai_endpoint.prompt import (
    Prompt,
    PromptRenderer,
    jinja_format,
)
from tunix_agentic.rollout.openai_endpoint.reply import (
    Answer,
    LiveChunks,
    Reply,
    completion_json,
    parse_reply,
    send_chunks,
    write_event,
)
from tunix_agentic.rollout.openai_endpoint.responses import Responses
from tunix_agentic.rollout.openai_endpoint.schema import (
    ChatRequest,
    RequestError,
    message_key,
    parse_chat_request,
)
from tunix_agentic.rollout.rewards import RewardError, check_reward
from tunix_agentic.serving.http import client_identity, json_error, load_json
from tunix_agentic.serving.stops import ModelText, cut_off_loop

EPISODE_HEADER = "X-Episode-Id"
TOKEN_HEADER = "X-Episode-Token"
# A request body past this is rendered and tokenised in a worker thread (an 8 MB conversation
# held the loop for seconds: every other client's call and /health waited).
OFF_LOOP_BODY_BYTES = 256 << 10
_EPISODE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,200}")


def completion_head(model: str) -> dict[str, Any]:
    """A completion's ``id``, ``created`` and (the default) ``model``."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}


class ClientGone(Exception):
    """The client closed its connection while its reply was being sent."""


class _Decoder:
    """The tokenizer as :class:`~tunix_agentic.serving.stops.ModelText` reads one."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids)  # (the project's tokenizers keep special tokens)


@dataclasses.dataclass(frozen=True)
class OpenAIConfig:
    """Limits and defaults of the endpoint (episode bounds in ``episodes``)."""

    model_name: str = "policy"  # the only model a call may name (GET /v1/models)
    default_max_tokens: int = 512
    max_n: int = 16
    max_messages: int = 1024
    max_body_bytes: int = 8 << 20
    parser: str = "qwen3"
    episodes: EpisodeLimits = EpisodeLimits()
    reward_limit: float = 1e6  # rewards outside [-limit, limit] are a 400 (rollout.reward_limit)

    def __post_init__(self):
        for name in ("default_max_tokens", "max_n", "max_messages", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"openai.{name} must be >= 1, got {getattr(self, name)}")
        get_parser(self.parser)
        check_reward_limit(self.reward_limit, "openai.reward_limit")


@dataclasses.dataclass(frozen=True)
class ServedCall:
    """One call served: its checked request, prompt, the engine's outputs and the parsed
    assistant messages (one per choice)."""

    chat: ChatRequest
    prompt: Prompt
    outs: list[TokenOutput]
    messages: list[dict[str, Any]]
    replies: list[Reply] = dataclasses.field(default_factory=list)


def episode_token(request: web.Request, *, required: bool) -> str | None:
    """The request's ``X-Episode-Token`` (checked; None when absent and not required)."""
    token = request.headers.get(TOKEN_HEADER)
    if token is None:
        if required:
            raise RequestError(
                f"{TOKEN_HEADER}: required (the token the episode's first call answered, "
                "or its claim gave)",
                401,
            )
        return None
    if not TOKEN_PATTERN.fullmatch(token):
        raise RequestError(
            f"{TOKEN_HEADER}: must be 16-200 characters of letters, digits and ._~+/=-"
        )
    return token


def check_model(model: str | None, served: str) -> None:
    """RequestError 404 as OpenAI answers it (code ``model_not_found``) unless ``model`` is
    None (not named) or ``served``."""
    if model is not None and model != served:
        raise RequestError(
            f"The model {model!r:.100} does not exist: this endpoint serves {served!r} "
            "(GET /v1/models)",
            404,
            "model_not_found",
        )


def with_defaults(
    chat: ChatRequest, body: Collection[str], defaults: dict[str, Any]
) -> ChatRequest:
    """``chat`` with ``defaults`` for the sampling fields its body omitted."""
    given = set(body)
    if "max_completion_tokens" in given:
        given.add("max_tokens")
    changes = {k: v for k, v in defaults.items() if k not in given and v is not None}
    return dataclasses.replace(chat, **changes) if changes else chat


def recorded_call(
    chat: ChatRequest,
    prompt: Prompt,
    outs: list[TokenOutput],
    replies: list[Reply],
    stop_ids: Collection[int],
    version: int | None,
    model_s: float,
) -> Call:
    """What the episode records of a served call: its prompt ids and every choice's ids,
    logprobs, per-token versions (the call's ``version`` where the engine gives none)."""
    completions = []
    for out, reply in zip(outs, replies, strict=True):
        ids = list(out.token_ids)
        versions = list(out.versions) or [version if version is not None else -1] * len(ids)
        completions.append(
            Completion(
                token_ids=ids,
                logprobs=[float(x) for x in out.logprobs],
                versions=[int(v) for v in versions],
                finish_reason=out.finish_reason,
                message_key=message_key(reply.message),
                ended_turn=bool(ids) and ids[-1] in stop_ids,
                unoffered_tool_calls=reply.unoffered,
                constrained=chat.constrained,
            )
        )
    return Call(
        message_keys=[message_key(m) for m in chat.messages],
        prompt_ids=prompt.ids,
        completions=completions,
        policy_version=version,
        model_s=model_s,
    )


def reward_body(body: Any, limit: float) -> tuple[float, str | None, dict[str, Any]]:
    """``POST /v1/episodes/{id}/reward``'s body checked: ``(reward, task_id, info)``; a
    :class:`RequestError` naming the field otherwise. The reward is a JSON number (no
    string), finite and within ``rollout.reward_limit`` (:mod:`tunix_agentic.rollout.rewards`)."""
    if not isinstance(body, dict):
        raise RequestError('the body must be a JSON object {"reward": r}')
    unknown = sorted(set(body) - {"reward", "task_id", "info"})
    if unknown:
        raise RequestError(f"{unknown[0]}: is not a field of a reward")
    try:  # (JSON holds no numpy scalars: check_reward's other reals cannot come here)
        reward = check_reward(body.get("reward"), limit, "reward")
    except RewardError as exc:
        raise RequestError(f"reward: {str(exc).removeprefix('reward ')}") from None
    task_id = body.get("task_id")
    if task_id is not None and (not isinstance(task_id, str) or not task_id):
        raise RequestError("task_id: must be a non-empty string")
    info = body.get("info") or {}
    if not isinstance(info, dict):
        raise RequestError("info: must be a JSON object")
    return reward, task_id, info


class ChatCompletions:
    """The endpoint over one engine and chat template (see the module docstring)."""

    def __init__(
        self,
        *,
        engine: InferenceEngine,
        chat_format: ChatFormat,
        version_of: Callable[[], int | None] | None = None,
        config: OpenAIConfig = OpenAIConfig(),
    ):
        self.engine = engine
        self.template = jinja_format(chat_format)
        self.tokenizer = self.template.tokenizer
        self.prompts = PromptRenderer(self.template)
        self.version_of = version_of or (lambda: engine.version)
        self.config = config
        self.parse = get_parser(config.parser)
        self.store = EpisodeStore(config.episodes)
        # Sampling values for a recorded call that omits them: (episode key, calls so far)
        # -> {temperature, top_p, top_k, max_tokens, seed} (a rollout node's external groups).
        self.call_defaults: Callable[[str, int], dict[str, Any]] = lambda key, calls: {}
        self.text = ModelText(tokenizer=_Decoder(self.tokenizer))
        self.created = int(time.time())
        # Calls to tools a request did not offer (left as text); calls cut by their client.
        self.counts = {"unoffered_tool_calls": 0, "cut_calls": 0}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/v1/models", self.handle_models),
            web.get("/v1/models/{model_id}", self.handle_models),
            web.post("/v1/chat/completions", self.handle_chat),
            web.post("/v1/episodes/{episode_id}/reward", self.handle_reward),
            web.get("/v1/episodes/{episode_id}", self.handle_episode),
        ]

    def render_ids(self, request: ChatRequest) -> list[int]:
        """The whole conversation's prompt ids (see :class:`PromptRenderer`)."""
        return self.prompts.render_ids(request)

    def reply(self, request: ChatRequest, out: TokenOutput, stop: str | None = None) -> Reply:
        """One completion's :class:`Reply` (``stop``: the stop string it was cut at)."""
        ids = out.token_ids
        ended = bool(ids) and ids[-1] in self.template.stop_ids
        text_ids = ids[:-1] if ended else ids
        text = self.tokenizer.decode(text_ids)
        if stop is not None and stop in text:
            text = text[: text.index(stop)]
        reply = parse_reply(text, text_ids, parse=self.parse, offered=request.offered)
        self.counts["unoffered_tool_calls"] += reply.unoffered
        return reply

    def reply_message(self, request: ChatRequest, out: TokenOutput) -> dict[str, Any]:
        """The assistant message of one completion (OpenAI's shape)."""
        return self.reply(request, out).message

    # ------------------------------------------------------------------ handlers
    async def _body(self, request: web.Request) -> Any:
        if (request.content_length or 0) > self.config.max_body_bytes:
            raise RequestError(f"the body is over {self.config.max_body_bytes} bytes", 413)
        raw = await request.read()
        if len(raw) > self.config.max_body_bytes:
            raise RequestError(f"the body is over {self.config.max_body_bytes} bytes", 413)
        try:  # a large body is parsed off the event loop
            return load_json(raw) if len(raw) < 1 << 20 else await asyncio.to_thread(load_json, raw)
        except ValueError as exc:  # not JSON, or nested past MAX_JSON_DEPTH
            raise RequestError(str(exc)) from None

    def _episode_id(self, request: web.Request) -> str | None:
        eid = request.headers.get(EPISODE_HEADER)
        if eid is None:
            return None
        if not _EPISODE_ID.fullmatch(eid):
            raise RequestError(
                f"{EPISODE_HEADER}: must be 1-200 characters of letters, digits and ._:@/+=-"
            )
        return eid

    async def handle_models(self, request: web.Request) -> web.Response:
        model = {
            "id": self.config.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "tunix-agentic",
            "policy_version": self.version_of(),
        }
        wanted = request.match_info.get("model_id")
        if wanted is None:
            return web.json_response({"object": "list", "data": [model]})
        try:
            check_model(wanted, self.config.model_name)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error", exc.code)
        return web.json_response(model)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        headers: dict[str, str] = {}
        sent: list[web.StreamResponse] = []
        head = completion_head(self.config.model_name)
        live: list[tuple[LiveStream, LiveChunks]] = []

        def show_live(chat: ChatRequest) -> LiveStream | None:
            if not chat.stream:
                return None
            chunks = LiveChunks(
                request, headers, {**head, "model": chat.model or head["model"]}, chat.include_usage
            )
            shown = self.live_stream(chat, chunks.write)
            if shown is not None:
                live.append((shown, chunks))
            return shown

        async def deliver(served: ServedCall) -> None:
            if served.chat.stream:
                answer = self._answer(served, head)
                shown = (live[0][1], live[0][0].text.shown) if live else None
                decode = self.tokenizer.decode
                sent.append(await send_chunks(request, answer, decode, headers, shown))

        try:
            served = await self.serve_call(
                request, self._parse_chat, headers, deliver=deliver, live=show_live
            )
        except RequestError as exc:
            if live and live[0][1].response is not None:  # the stream had begun: end it so
                error = {"error": {"message": str(exc), "type": "server_error"}}
                await write_event(live[0][1].response, error)
                await live[0][1].response.write(b"data: [DONE]\n\n")
                return live[0][1].response
            return json_error(exc.status, str(exc), "invalid_request_error", exc.code)
        except ClientGone:  # nobody reads what is answered now
            return sent[0] if sent else web.Response(status=499)
        except asyncio.CancelledError:
            if live and live[0][0].gone:  # our own cancel: the client left mid-stream
                asyncio.current_task().uncancel()
                return live[0][1].response or web.Response(status=499)
            raise
        if sent:
            return sent[0]
        answer = completion_json(self._answer(served), self.tokenizer.decode)
        return web.json_response(answer, headers=headers)

    def live_stream(
        self, chat: ChatRequest, write: Callable[[str], Awaitable[None]]
    ) -> LiveStream | None:
        """What shows ``chat``'s content through ``write`` while it is sampled (:mod:`.live`):
        one choice without logprobs (None otherwise: framed once the call is recorded)."""
        if chat.n != 1 or chat.logprobs:
            return None
        holds = [*chat.stop, TOOL_CALL_MARKER] if chat.parse_tools else list(chat.stop)
        return LiveStream(LiveText(self.tokenizer.decode, holds, self.template.stop_ids), write)

    def _parse_chat(self, body: Any) -> tuple[ChatRequest, Collection[str]]:
        chat = parse_chat_request(
            body, max_n=self.config.max_n, max_messages=self.config.max_messages
        )
        return chat, set(body)

    async def serve_call(
        self,
        request: web.Request,
        parse: Callable[[Any], tuple[ChatRequest, Collection[str]]],
        headers: dict[str, str],
        *,
        deliver: Callable[[ServedCall], Awaitable[None]] | None = None,
        live: Callable[[ChatRequest], LiveStream | None] | None = None,
    ) -> ServedCall:
        """One call, whichever API it came in: read the body, ``parse`` it into a
        :class:`ChatRequest` and the names of the chat fields it gave (the episode's call
        defaults fill the others), render, generate, parse the replies, and record the call
        under the request's ``X-Episode-Id`` (``headers`` gets its ``X-Episode-Token``).
        ``/v1/responses`` (:mod:`.responses`) comes through here too.

        A client that hangs up while the engine generates cancels this (the project's
        servers cancel a gone client's handler: :func:`~tunix_agentic.serving.http.serve_app`),
        which aborts the engine's requests; one that hangs up while ``deliver`` (which sends
        a streamed reply, after the call is recorded) writes raises :class:`ClientGone`
        (or the cancellation). Either way the call is recorded as cut. ``live`` may give a
        :class:`~.live.LiveStream` for the checked request: it is fed the engine's ids as
        they come and closed (its last piece written) before ``deliver``."""
        chat, given = parse(await self._body(request))
        check_model(chat.model, self.config.model_name)
        eid = self._episode_id(request)
        episode = None
        if eid is not None:
            token = episode_token(request, required=False) or new_token()
            episode = self.store.begin_call(eid, token, client_identity(request))
            headers[TOKEN_HEADER] = token
        call = None
        try:
            if episode is not None:
                defaults = self.call_defaults(episode.key, len(episode.calls))
                chat = with_defaults(chat, given, defaults)
            try:
                if (request.content_length or 0) > OFF_LOOP_BODY_BYTES:  # seconds of work
                    prompt = await asyncio.to_thread(self.prompts.prompt, chat, episode)
                else:
                    prompt = self.prompts.prompt(chat, episode)
            except (TemplateError, ValueError) as exc:
                raise RequestError(
                    f"messages: the chat template cannot render them: {exc}"
                ) from None
            version = self.version_of()
            t0 = time.perf_counter()
            shown = live(chat) if live is not None else None
            try:
                outs, stops = await self._generate(
                    chat, prompt.ids, episode.key if episode else None, shown
                )
                if shown is not None:
                    await shown.close()
            except asyncio.CancelledError:  # the client hung up: the engine's requests abort
                self.counts["cut_calls"] += 1
                if episode is not None:
                    keys = [message_key(m) for m in chat.messages]
                    call = Call(keys, prompt.ids, [], version, time.perf_counter() - t0, cut=True)
                raise
            model_s = time.perf_counter() - t0
            replies = [self.reply(chat, out, stop) for out, stop in zip(outs, stops, strict=True)]
            if episode is not None:
                call = recorded_call(
                    chat, prompt, outs, replies, self.template.stop_ids, version, model_s
                )
        finally:
            if episode is not None:
                self.store.end_call(episode, call)
        served = ServedCall(chat, prompt, outs, [r.message for r in replies], replies)
        if deliver is not None:
            try:
                await deliver(served)
            except (ConnectionError, asyncio.CancelledError) as exc:  # the client left
                self.counts["cut_calls"] += 1
                if call is not None:
                    call.cut = True
                if isinstance(exc, asyncio.CancelledError):
                    raise
                raise ClientGone("the client closed the connection") from None
        return served

    async def _generate(
        self, chat: ChatRequest, prompt_ids: list[int], eid: str | None, live: Any = None
    ) -> tuple[list[TokenOutput], list[str | None]]:
        """The engine's outputs, each cut at its first stop string, and the string it was
        cut at (None: not cut); ``live`` (one choice): a :class:`~.live.LiveStream` fed
        the ids as they come."""
        constraint = chat.constraint(self.config.parser)  # RequestError for another form
        try:
            samplings = [
                SamplingParams(
                    constraint=constraint,
                    temperature=chat.temperature,
                    top_p=chat.top_p,
                    top_k=chat.top_k,
                    max_new_tokens=chat.max_tokens or self.config.default_max_tokens,
                    stop_token_ids=self.template.stop_ids,
                    seed=None if chat.seed is None else chat.seed + k,
                )
                for k in range(chat.n)
            ]
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        # Sessions pin an episode's calls to one backend (its cache): named by the store's
        # key (the caller passes it), so two clients' episodes of one id never share a pin.
        sessions = (
            [None] * chat.n if eid is None else [eid] + [f"{eid}#{k}" for k in range(1, chat.n)]
        )
        stream = {} if live is None else {"on_tokens": live.on_tokens}
        tasks = [
            asyncio.ensure_future(self.engine.generate(prompt_ids, s, session_id=session, **stream))
            for s, session in zip(samplings, sessions, strict=True)
        ]
        try:
            outs = await asyncio.gather(*tasks)
        except PromptTooLongError as exc:
            raise RequestError(f"messages: the prompt of {len(prompt_ids)} tokens: {exc}") from None
        except EngineError as exc:
            raise RequestError(f"the engine could not serve the request: {exc}", 503) from None
        except ValueError as exc:  # a sampling value the model cannot honour (top_k)
            raise RequestError(str(exc)) from None
        finally:  # one choice failed or the client left: the others stop too
            for task in tasks:
                task.cancel()
            if live is not None and not all(t.done() and not t.cancelled() for t in tasks):
                live.cancel()
        if any(out.finish_reason == "abort" for out in outs):
            raise RequestError("the engine aborted the generation (retry)", 503)
        cut = [await cut_off_loop(out, chat.stop, self.text) for out in outs]
        return (
            [out if c is None else c.output for out, c in zip(outs, cut, strict=True)],
            [None if c is None else c.matched for c in cut],
        )

    def _answer(self, served: ServedCall, head: dict[str, Any] | None = None) -> Answer:
        head = head or completion_head(self.config.model_name)
        return Answer(
            head={**head, "model": served.chat.model or head["model"]},
            prompt_tokens=len(served.prompt.ids),
            outs=served.outs,
            replies=served.replies,
            logprobs=served.chat.logprobs,
            include_usage=served.chat.include_usage,
        )

    async def handle_reward(self, request: web.Request) -> web.Response:
        eid = request.match_info["episode_id"]
        try:
            token = episode_token(request, required=True)
            body = await self._body(request)
            reward, task_id, info = reward_body(body, self.config.reward_limit)
            key = episode_key(eid, token)
            episode = self.store.close(key, reward, task_id=task_id, info=info)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error")
        return web.json_response(
            {
                "episode_id": eid,
                "status": "closed",
                "reward": episode.reward,
                "calls": len(episode.calls),
            }
        )

    async def handle_episode(self, request: web.Request) -> web.Response:
        eid = request.match_info["episode_id"]
        try:
            token = episode_token(request, required=True)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error")
        episode = self.store.get(episode_key(eid, token))
        if episode is None:
            return json_error(
                404,
                f"episode {eid!r} is not known (or expired, or {TOKEN_HEADER} is not its token)",
                "not_found",
            )
        out = episode.to_json()
        if episode.closed:
            from tunix_agentic.rollout.service.wire import trajectory_to_json

            out["trajectory"] = trajectory_to_json(episode_trajectory(episode))
        return web.json_response(out)


def add_openai_routes(
    app: web.Application,
    *,
    engine: InferenceEngine,
    chat_format: ChatFormat,
    version_of: Callable[[], int | None] | None = None,
    config: OpenAIConfig = OpenAIConfig(),
) -> ChatCompletions:
    """Mount the endpoint's routes on ``app`` (before it starts); returns the endpoint,
    whose ``store`` holds the recorded episodes."""
    if hasattr(engine, "use_tokenizer") and getattr(engine, "grammars", 0) is None:
        # An in-process engine given no tokenizer yet: the template's, so that
        # tool_choice and response_format can be enforced (read on first use).
        engine.use_tokenizer(chat_format.tokenizer, chat_format.stop_ids)
    api = ChatCompletions(
        engine=engine, chat_format=chat_format, version_of=version_of, config=config
    )
    app.add_routes(api.routes())
    app.add_routes(Responses(api).routes())
    return api
