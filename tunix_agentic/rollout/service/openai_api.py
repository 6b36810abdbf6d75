"""An OpenAI-compatible chat endpoint that records tokens, so any agent can be trained.

Routes (JSON; errors ``{"error": {"message", "type"}}`` with a 4xx naming the field):

* ``POST /v1/chat/completions``: ``messages``, ``tools``, ``tool_choice``, ``temperature``,
  ``top_p``, ``top_k``, ``max_tokens`` / ``max_completion_tokens``, ``n``, ``seed``
  (non-streaming). The conversation is rendered with the model's chat template and
  tokenised once; the reply is OpenAI's ``chat.completion`` (tool calls parsed into
  ``tool_calls`` with the agent loop's parser, ``finish_reason`` "stop" | "tool_calls" |
  "length", ``usage`` counted in tokens). ``tool_choice`` "none" hides the tools and
  parses no calls; "required" or a named function is accepted but not enforced
  (sampling is not constrained). Refused with a 400: ``stream``, ``stop`` strings,
  ``logprobs`` (the recorded ones are in ``GET /v1/episodes/{id}``), unknown fields.
* A call with an ``X-Episode-Id: ID`` header is recorded (prompt ids, completion ids,
  logprobs, per-token policy versions) into the episode of that id and its
  ``X-Episode-Token`` (the client's own, 16-200 characters, or, when the call sends none,
  a fresh one the server makes; the answer's ``X-Episode-Token`` header holds it): only the
  token's holder continues, reads, rewards or closes it, and the same id with another
  token is another client's episode (see
  :mod:`~tunix_agentic.rollout.service.openai_episodes`). A call that fails opens nothing.
  The recording keeps
  the calls' tokens exactly: when its messages continue an earlier call of
  the episode (that call's messages, then the assistant message it returned, then new
  ones), the prompt ids are that call's prompt + completion ids followed by the template's
  ids for the new messages: what the model generated is never re-tokenised, so the calls
  chain into one learner row. Otherwise the whole conversation is rendered. Episodes are
  bounded (:class:`~tunix_agentic.rollout.service.openai_episodes.EpisodeLimits`: 429 when
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

    from tunix_agentic.rollout.service.openai_api import add_openai_routes
    api = add_openai_routes(app, engine=pool, chat_format=template, version_of=lambda: v)
    # api.store: the EpisodeStore; episode_trajectory(ep) / ExternalEpisodes(api.store, ...)

``engine``: any :class:`~tunix_agentic.inference.base.InferenceEngine` (an EnginePool, a
JaxEngine, an SGLang client). ``chat_format``: the run's template (the built-in
:class:`~tunix_agentic.agent.chat.ChatTemplate` is served through its Jinja twin
``BUILTIN_CHAT_TEMPLATE``). A conversation renders as the agent loop frames its prompts
(:func:`template_messages`): tools the template drops go to the system prompt when its
``tools_fallback`` is ``"system"``, and assistant tool calls a template drops are written
after the content in :func:`~tunix_agentic.agent.tool_parser.format_tool_call`'s form.
``version_of()``: the policy version now (recorded per call; per-token versions come
from the engine). The app's API-key guard and error middleware
(:func:`tunix_agentic.serving.http.api_key_guard`) apply as to its other routes.
Host-side only: nothing here imports JAX.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import math
import re
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from tunix_agentic.agent.chat import (
    BUILTIN_CHAT_TEMPLATE,
    ChatFormat,
    ChatTemplate,
    JinjaChatTemplate,
    TemplateError,
    tools_prompt_text,
)
from tunix_agentic.agent.tool_parser import format_tool_call, get_parser
from tunix_agentic.inference.base import (
    EngineError,
    InferenceEngine,
    PromptTooLongError,
    TokenOutput,
)
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.rollout.service.openai_episodes import (
    TOKEN_PATTERN,
    Call,
    Completion,
    Episode,
    EpisodeLimits,
    EpisodeStore,
    episode_key,
    episode_trajectory,
    new_token,
)
from tunix_agentic.rollout.service.openai_schema import (
    ChatRequest,
    RequestError,
    message_key,
    parse_chat_request,
)
from tunix_agentic.serving.http import json_error, load_json

EPISODE_HEADER = "X-Episode-Id"
TOKEN_HEADER = "X-Episode-Token"
_EPISODE_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,200}")

_MARK = "\x00completion\x00"
_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class OpenAIConfig:
    """Limits and defaults of the endpoint (episode bounds in ``episodes``)."""

    model_name: str = "tunix-agentic"
    default_max_tokens: int = 512
    max_n: int = 16
    max_messages: int = 1024
    max_body_bytes: int = 8 << 20
    parser: str = "qwen3"
    episodes: EpisodeLimits = EpisodeLimits()

    def __post_init__(self):
        for name in ("default_max_tokens", "max_n", "max_messages", "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"openai.{name} must be >= 1, got {getattr(self, name)}")
        get_parser(self.parser)


def jinja_format(chat_format: ChatFormat) -> JinjaChatTemplate:
    """The Jinja template that renders whole conversations for ``chat_format``."""
    if isinstance(chat_format, JinjaChatTemplate):
        return chat_format
    if isinstance(chat_format, ChatTemplate):
        return JinjaChatTemplate(chat_format.tokenizer, BUILTIN_CHAT_TEMPLATE)
    raise TypeError(f"chat_format must be a chat template, got {type(chat_format).__name__}")


def template_messages(
    template: JinjaChatTemplate,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """``(messages, tools)`` to render so that a conversation is framed as the agent loop
    frames it (:meth:`JinjaChatTemplate.prompt_text`, demonstrations): tools listed in the
    system prompt for a template that drops them (``tools_fallback="system"``), assistant
    tool calls appended to the content in the compact form for a template that drops them."""
    out = [dict(m) for m in messages]
    if not template.renders_tool_calls:
        for m in out:
            for call in m.pop("tool_calls", None) or ():
                fn = call["function"]
                m["content"] += format_tool_call(fn["name"], json.loads(fn["arguments"]))
    if tools and not template.renders_tools and template.tools_fallback == "system":
        listed = tools_prompt_text(tools, template.tools_prompt)
        if out and out[0]["role"] == "system":
            out[0]["content"] = f"{out[0]['content']}\n\n{listed}"
        else:
            out.insert(0, {"role": "system", "content": listed})
        tools = None
    return out, tools


@dataclasses.dataclass(frozen=True)
class Prompt:
    """A call's prompt ids and, when it continues a recorded call, which one."""

    ids: list[int]
    extends: tuple[int, int] | None = None  # (call, choice) of the episode


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
        self.version_of = version_of or (lambda: engine.version)
        self.config = config
        self.parse = get_parser(config.parser)
        self.store = EpisodeStore(config.episodes)
        # Sampling values for a recorded call that omits them: (episode key, calls so far)
        # -> {temperature, top_p, top_k, max_tokens, seed} (a rollout node's external groups).
        self.call_defaults: Callable[[str, int], dict[str, Any]] = lambda key, calls: {}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/chat/completions", self.handle_chat),
            web.post("/v1/episodes/{episode_id}/reward", self.handle_reward),
            web.get("/v1/episodes/{episode_id}", self.handle_episode),
        ]

    # ------------------------------------------------------------------ rendering
    def render(self, request: ChatRequest, messages: Sequence[dict[str, Any]]) -> str:
        messages, tools = template_messages(self.template, messages, request.template_tools)
        return self.template.render(messages, add_generation_prompt=True, tools=tools)

    def render_ids(self, request: ChatRequest) -> list[int]:
        return self.tokenizer.encode(self.render(request, request.messages))

    def continuation_ids(self, request: ChatRequest, k: int, ended_turn: bool) -> list[int]:
        """The ids the template puts after assistant message ``k`` (its end-of-turn token
        only if the completion did not end the turn) up to the next generation prompt."""
        messages = list(request.messages)
        messages[k] = {**messages[k], "content": _MARK}
        text = self.render(request, messages)
        after = text.split(_MARK, 1)[-1]
        end = after.find(self.template.turn_end)
        if _MARK not in text or end < 0:
            raise TemplateError("the chat template lost the assistant turn or its end token")
        return self.tokenizer.encode(
            after[end + len(self.template.turn_end) if ended_turn else end :]
        )

    def prompt(self, request: ChatRequest, episode: Episode | None) -> Prompt:
        """Prompt ids: the continuation of the longest recorded call whose messages and
        returned reply begin ``request.messages``, else the whole conversation rendered."""
        keys = [message_key(m) for m in request.messages]
        best: tuple[int, int, Call, Completion] | None = None
        for i, call in enumerate(episode.calls if episode else ()):
            k = len(call.message_keys)
            if k >= len(keys) or keys[:k] != call.message_keys:
                continue
            for j, c in enumerate(call.completions):
                if c.message_key == keys[k] and (best is None or k > len(best[2].message_keys)):
                    best = (i, j, call, c)
        if best is None:
            return Prompt(self.render_ids(request))
        i, j, call, c = best
        rest = self.continuation_ids(request, len(call.message_keys), c.ended_turn)
        return Prompt(call.prompt_ids + c.token_ids + rest, extends=(i, j))

    def reply_message(self, request: ChatRequest, out: TokenOutput) -> dict[str, Any]:
        """The assistant message of one completion (OpenAI's shape)."""
        ids = out.token_ids
        ended = bool(ids) and ids[-1] in self.template.stop_ids
        text = self.tokenizer.decode(ids[:-1] if ended else ids)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if not request.parse_tools:
            return message
        calls, kept = [], []
        last = 0
        for match in _TOOL_CALL.finditer(text):
            try:
                action = self.parse(match.group(0))
            except RecursionError:  # arguments nested past what JSON parsing can take
                kept.append(text[last : match.end()])
                last = match.end()
                continue
            kept.append(text[last : match.start()])
            last = match.end()
            if action.tool_calls and not action.parse_errors:
                call = action.tool_calls[0]
                calls.append(
                    {
                        "id": f"call_{uuid.uuid4().hex[:24]}",
                        "type": "function",
                        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                    }
                )
            else:  # malformed: left in the text for the agent to see
                kept.append(match.group(0))
        if calls:
            kept.append(text[last:])
            content = "".join(kept)
            message["content"] = content if content.strip() else None
            message["tool_calls"] = calls
        return message

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

    @staticmethod
    def _token(request: web.Request, *, required: bool) -> str | None:
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

    @staticmethod
    def _client(request: web.Request) -> str:
        """Who the per-client episode cap counts against: the credential sent, else the
        peer's address."""
        auth = request.headers.get("Authorization")
        if auth:
            return "key:" + hashlib.sha256(auth.encode()).hexdigest()[:32]
        return f"addr:{request.remote}"

    async def handle_chat(self, request: web.Request) -> web.Response:
        headers: dict[str, str] = {}
        try:
            return web.json_response(await self._chat(request, headers), headers=headers)
        except RequestError as exc:
            return json_error(exc.status, str(exc), "invalid_request_error")

    async def _chat(self, request: web.Request, headers: dict[str, str]) -> dict[str, Any]:
        body = await self._body(request)
        chat = parse_chat_request(
            body, max_n=self.config.max_n, max_messages=self.config.max_messages
        )
        eid = self._episode_id(request)
        episode = None
        if eid is not None:
            token = self._token(request, required=False) or new_token()
            episode = self.store.begin_call(eid, token, self._client(request))
            headers[TOKEN_HEADER] = token
        call = None
        try:
            if episode is not None:
                defaults = self.call_defaults(episode.key, len(episode.calls))
                chat = self._with_defaults(chat, body, defaults)
            try:
                prompt = self.prompt(chat, episode)
            except (TemplateError, ValueError) as exc:
                raise RequestError(
                    f"messages: the chat template cannot render them: {exc}"
                ) from None
            version = self.version_of()
            t0 = time.perf_counter()
            outs = await self._generate(chat, prompt.ids, episode.key if episode else None)
            model_s = time.perf_counter() - t0
            messages = [self.reply_message(chat, out) for out in outs]
            if episode is not None:
                call = self._record(chat, prompt, outs, messages, version, model_s)
        finally:
            if episode is not None:
                self.store.end_call(episode, call)
        return self._response(chat, prompt, outs, messages)

    @staticmethod
    def _with_defaults(
        chat: ChatRequest, body: dict[str, Any], defaults: dict[str, Any]
    ) -> ChatRequest:
        """``chat`` with ``defaults`` for the sampling fields its body omitted."""
        given = set(body)
        if "max_completion_tokens" in given:
            given.add("max_tokens")
        changes = {k: v for k, v in defaults.items() if k not in given and v is not None}
        return dataclasses.replace(chat, **changes) if changes else chat

    async def _generate(
        self, chat: ChatRequest, prompt_ids: list[int], eid: str | None
    ) -> list[TokenOutput]:
        try:
            samplings = [
                SamplingParams(
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
        tasks = [
            asyncio.ensure_future(self.engine.generate(prompt_ids, s, session_id=session))
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
        if any(out.finish_reason == "abort" for out in outs):
            raise RequestError("the engine aborted the generation (retry)", 503)
        return list(outs)

    def _record(self, chat, prompt, outs, messages, version, model_s) -> Call:
        completions = []
        for out, message in zip(outs, messages, strict=True):
            ids = list(out.token_ids)
            versions = list(out.versions) or [version if version is not None else -1] * len(ids)
            completions.append(
                Completion(
                    token_ids=ids,
                    logprobs=[float(x) for x in out.logprobs],
                    versions=[int(v) for v in versions],
                    finish_reason=out.finish_reason,
                    message_key=message_key(message),
                    ended_turn=bool(ids) and ids[-1] in self.template.stop_ids,
                )
            )
        return Call(
            message_keys=[message_key(m) for m in chat.messages],
            prompt_ids=prompt.ids,
            completions=completions,
            policy_version=version,
            model_s=model_s,
        )

    def _response(self, chat, prompt, outs, messages) -> dict[str, Any]:
        choices = []
        for k, (out, message) in enumerate(zip(outs, messages, strict=True)):
            finish = "length" if out.finish_reason == "length" else "stop"
            if message.get("tool_calls"):
                finish = "tool_calls"
            choices.append(
                {"index": k, "message": message, "finish_reason": finish, "logprobs": None}
            )
        completion_tokens = sum(len(out.token_ids) for out in outs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": chat.model or self.config.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt.ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt.ids) + completion_tokens,
            },
        }

    async def handle_reward(self, request: web.Request) -> web.Response:
        eid = request.match_info["episode_id"]
        try:
            token = self._token(request, required=True)
            body = await self._body(request)
            if not isinstance(body, dict):
                raise RequestError('the body must be a JSON object {"reward": r}')
            unknown = sorted(set(body) - {"reward", "task_id", "info"})
            if unknown:
                raise RequestError(f"{unknown[0]}: is not a field of a reward")
            reward = body.get("reward")
            if isinstance(reward, bool) or not isinstance(reward, int | float):
                raise RequestError(f"reward: must be a number, got {reward!r:.50}")
            if not math.isfinite(reward):
                raise RequestError(f"reward: must be finite, got {reward}")
            task_id = body.get("task_id")
            if task_id is not None and (not isinstance(task_id, str) or not task_id):
                raise RequestError("task_id: must be a non-empty string")
            info = body.get("info") or {}
            if not isinstance(info, dict):
                raise RequestError("info: must be a JSON object")
            key = episode_key(eid, token)
            episode = self.store.close(key, float(reward), task_id=task_id, info=info)
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
            token = self._token(request, required=True)
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
    api = ChatCompletions(
        engine=engine, chat_format=chat_format, version_of=version_of, config=config
    )
    app.add_routes(api.routes())
    return api
