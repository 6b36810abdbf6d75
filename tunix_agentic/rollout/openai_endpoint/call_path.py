"""The call path every model-calling route shares: one call, whichever API it came in.

:meth:`CallPath.serve_call` reads and checks the body, opens or continues the episode the
``X-Episode-Id`` header names, renders the prompt (:mod:`~.prompt`), samples every choice
(cut at its first stop string), parses the replies (:mod:`~.reply`) and records the call
token for token (:mod:`~.recording`). The chat and Responses handlers
(:mod:`~.serving_chat`, :mod:`~.serving_responses`) frame what it served. Host-side only:
nothing here imports JAX.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from aiohttp import web

from tunix_agentic.agent.chat import ChatFormat, TemplateError
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    PromptTooLongError,
    TokenOutput,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.rollout.openai_endpoint.config import OpenAIConfig
from tunix_agentic.rollout.openai_endpoint.errors import EpisodeError
from tunix_agentic.rollout.openai_endpoint.live import TOOL_CALL_MARKER, LiveStream, LiveText
from tunix_agentic.rollout.openai_endpoint.prompt import Prompt, PromptRenderer, jinja_format
from tunix_agentic.rollout.openai_endpoint.protocol import (
    EPISODE_HEADER,
    TOKEN_HEADER,
    ChatCompletionRequest,
    RequestError,
    message_key,
    refusal,
)
from tunix_agentic.rollout.openai_endpoint.recording import Call, Completion
from tunix_agentic.rollout.openai_endpoint.reply import Reply, parse_reply
from tunix_agentic.rollout.openai_endpoint.store import (
    TOKEN_PATTERN,
    Episode,
    EpisodeStore,
    new_token,
)
from tunix_agentic.serving.http import client_identity, read_json
from tunix_agentic.serving.stops import ModelText, cut_off_loop

# A request body past this is rendered and tokenised in a worker thread (an 8 MB conversation
# held the loop for seconds: every other client's call and /health waited).
OFF_LOOP_BODY_BYTES = 256 << 10
_EPISODE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,200}")
# What a route's parser makes of a body: the chat request and the chat fields it gave.
Parse = Callable[[Any], tuple[ChatCompletionRequest, Collection[str]]]


class ClientGone(Exception):
    """The client closed its connection while its reply was being sent."""


class _Decoder:
    """The tokenizer as :class:`~tunix_agentic.serving.stops.ModelText` reads one."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def decode(self, ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(ids)  # (the project's tokenizers keep special tokens)


@dataclasses.dataclass(frozen=True)
class ServedCall:
    """One call served: its checked request, prompt, the engine's outputs and the parsed
    assistant messages (one per choice)."""

    chat: ChatCompletionRequest
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
    chat: ChatCompletionRequest, body: Collection[str], defaults: dict[str, Any]
) -> ChatCompletionRequest:
    """``chat`` with ``defaults`` for the sampling fields its body omitted."""
    given = set(body)
    if "max_completion_tokens" in given:
        given.add("max_tokens")
    changes = {k: v for k, v in defaults.items() if k not in given and v is not None}
    return chat.model_copy(update=changes) if changes else chat


def recorded_call(
    chat: ChatCompletionRequest,
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
        message_keys=[message_key(m) for m in chat.chat_messages],
        prompt_ids=prompt.ids,
        completions=completions,
        policy_version=version,
        model_s=model_s,
    )


class CallPath:
    """One engine and chat template behind every route: the episodes (``store``), the
    counters and :meth:`serve_call`. ``call_defaults(episode_key, calls)`` may supply
    sampling values for the fields a recorded call omits (a rollout node sets it to its
    external groups' sampling). Single event loop."""

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

    def render_ids(self, request: ChatCompletionRequest) -> list[int]:
        """The whole conversation's prompt ids (see :class:`~.prompt.PromptRenderer`)."""
        return self.prompts.render_ids(request)

    def reply(
        self, request: ChatCompletionRequest, out: TokenOutput, stop: str | None = None
    ) -> Reply:
        """One completion's :class:`~.reply.Reply` (``stop``: the stop string it was cut at)."""
        ids = out.token_ids
        ended = bool(ids) and ids[-1] in self.template.stop_ids
        text_ids = ids[:-1] if ended else ids
        text = self.tokenizer.decode(text_ids)
        if stop is not None and stop in text:
            text = text[: text.index(stop)]
        reply = parse_reply(text, text_ids, parse=self.parse, offered=request.offered)
        self.counts["unoffered_tool_calls"] += reply.unoffered
        return reply

    def reply_message(self, request: ChatCompletionRequest, out: TokenOutput) -> dict[str, Any]:
        """The assistant message of one completion (OpenAI's shape)."""
        return self.reply(request, out).message

    def live_stream(
        self, chat: ChatCompletionRequest, write: Callable[[str], Awaitable[None]]
    ) -> LiveStream | None:
        """What shows ``chat``'s content through ``write`` while it is sampled (:mod:`.live`):
        one choice without logprobs (None otherwise: framed once the call is recorded)."""
        if chat.n != 1 or chat.logprobs:
            return None
        holds = [*chat.stops, TOOL_CALL_MARKER] if chat.parse_tools else list(chat.stops)
        return LiveStream(LiveText(self.tokenizer.decode, holds, self.template.stop_ids), write)

    async def read_body(self, request: web.Request) -> Any:
        """The request's JSON body, within ``max_body_bytes`` (413 past it)."""
        if (request.content_length or 0) > self.config.max_body_bytes:
            raise RequestError(f"the body is over {self.config.max_body_bytes} bytes", 413)
        raw = await request.read()
        if len(raw) > self.config.max_body_bytes:
            raise RequestError(f"the body is over {self.config.max_body_bytes} bytes", 413)
        try:  # a large body is parsed off the event loop
            return await read_json(request)
        except ValueError as exc:  # not JSON, or nested past MAX_JSON_DEPTH
            raise RequestError(str(exc)) from None

    def _begin_episode(self, request: web.Request, headers: dict[str, str]) -> Episode | None:
        """The episode the call records into (None without ``X-Episode-Id``); ``headers``
        gets its token (the client's, or a fresh one)."""
        eid = request.headers.get(EPISODE_HEADER)
        if eid is None:
            return None
        if not _EPISODE_ID.fullmatch(eid):
            raise RequestError(
                f"{EPISODE_HEADER}: must be 1-200 characters of letters, digits and ._:@/+=-"
            )
        token = episode_token(request, required=False) or new_token()
        try:
            episode = self.store.begin_call(eid, token, client_identity(request))
        except EpisodeError as exc:
            raise refusal(exc) from None
        headers[TOKEN_HEADER] = token
        return episode

    async def serve_call(
        self,
        request: web.Request,
        parse: Parse,
        headers: dict[str, str],
        *,
        deliver: Callable[[ServedCall], Awaitable[None]] | None = None,
        live: Callable[[ChatCompletionRequest], LiveStream | None] | None = None,
    ) -> ServedCall:
        """One call: read the body, ``parse`` it into a chat request and the names of the
        chat fields it gave (the episode's call defaults fill the others), render, generate,
        parse the replies, and record the call under the request's ``X-Episode-Id``
        (``headers`` gets its ``X-Episode-Token``).

        A client that hangs up while the engine generates cancels this (the project's
        servers cancel a gone client's handler: :func:`~tunix_agentic.serving.http.serve_app`),
        which aborts the engine's requests; one that hangs up while ``deliver`` (which sends
        a streamed reply, after the call is recorded) writes raises :class:`ClientGone`
        (or the cancellation). Either way the call is recorded as cut. ``live`` may give a
        :class:`~.live.LiveStream` for the checked request: it is fed the engine's ids as
        they come and closed (its last piece written) before ``deliver``."""
        chat, given = parse(await self.read_body(request))
        check_model(chat.model, self.config.model_name)
        episode = self._begin_episode(request, headers)
        call = None
        try:
            if episode is not None:
                defaults = self.call_defaults(episode.key, len(episode.calls))
                chat = with_defaults(chat, given, defaults)
            prompt = await self._prompt(request, chat, episode)
            version, t0 = self.version_of(), time.perf_counter()
            try:
                outs, stops = await self._sample(chat, prompt.ids, episode, live)
            except asyncio.CancelledError:  # the client hung up: the engine's requests abort
                self.counts["cut_calls"] += 1
                if episode is not None:
                    keys = [message_key(m) for m in chat.chat_messages]
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
                try:
                    self.store.end_call(episode, call)
                except EpisodeError as exc:
                    raise refusal(exc) from None
        served = ServedCall(chat, prompt, outs, [r.message for r in replies], replies)
        if deliver is not None:
            await self._deliver(deliver, served, call)
        return served

    async def _prompt(
        self, request: web.Request, chat: ChatCompletionRequest, episode: Episode | None
    ) -> Prompt:
        try:
            if (request.content_length or 0) > OFF_LOOP_BODY_BYTES:  # seconds of work
                return await asyncio.to_thread(self.prompts.prompt, chat, episode)
            return self.prompts.prompt(chat, episode)
        except (TemplateError, ValueError) as exc:
            raise RequestError(f"messages: the chat template cannot render them: {exc}") from None

    async def _sample(
        self,
        chat: ChatCompletionRequest,
        prompt_ids: list[int],
        episode: Episode | None,
        live: Callable[[ChatCompletionRequest], LiveStream | None] | None,
    ) -> tuple[list[TokenOutput], list[str | None]]:
        shown = live(chat) if live is not None else None
        outs, stops = await self._generate(
            chat, prompt_ids, episode.key if episode else None, shown
        )
        if shown is not None:
            await shown.close()
        return outs, stops

    async def _deliver(
        self,
        deliver: Callable[[ServedCall], Awaitable[None]],
        served: ServedCall,
        call: Call | None,
    ) -> None:
        try:
            await deliver(served)
        except (ConnectionError, asyncio.CancelledError) as exc:  # the client left
            self.counts["cut_calls"] += 1
            if call is not None:
                call.cut = True
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ClientGone("the client closed the connection") from None

    def _samplings(self, chat: ChatCompletionRequest) -> list[SamplingParams]:
        constraint = chat.constraint(self.config.parser)  # RequestError for another form
        try:
            return [
                SamplingParams(
                    constraint=constraint,
                    temperature=chat.temperature,
                    top_p=chat.top_p,
                    top_k=chat.top_k,
                    max_new_tokens=chat.completion_limit or self.config.default_max_tokens,
                    stop_token_ids=self.template.stop_ids,
                    seed=None if chat.seed is None else chat.seed + k,
                )
                for k in range(chat.n)
            ]
        except ValueError as exc:
            raise RequestError(str(exc)) from None

    async def _generate(
        self,
        chat: ChatCompletionRequest,
        prompt_ids: list[int],
        eid: str | None,
        live: LiveStream | None = None,
    ) -> tuple[list[TokenOutput], list[str | None]]:
        """The engine's outputs, each cut at its first stop string, and the string it was
        cut at (None: not cut); ``live`` (one choice): a :class:`~.live.LiveStream` fed
        the ids as they come."""
        samplings = self._samplings(chat)
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
        cut = [await cut_off_loop(out, chat.stops, self.text) for out in outs]
        return (
            [out if c is None else c.output for out, c in zip(outs, cut, strict=True)],
            [None if c is None else c.matched for c in cut],
        )
