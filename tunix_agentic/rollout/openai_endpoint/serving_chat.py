"""``POST /v1/chat/completions``: OpenAI's chat completions over the shared call path.

The answer is a ``chat.completion`` or, with ``stream``, its ``chat.completion.chunk``
events then ``data: [DONE]`` (:mod:`~.reply`); one choice without ``logprobs`` shows its
content while it is sampled (:mod:`~.live`). Fields and framing:
``docs/reference/openai_routes.md``. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Collection
from typing import Any

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.call_path import ServedCall
from tunix_agentic.rollout.openai_endpoint.protocol import (
    ChatCompletionRequest,
    ErrorReply,
    RequestError,
    parse_chat_request,
)
from tunix_agentic.rollout.openai_endpoint.reply import (
    Answer,
    LiveChunks,
    completion_json,
    send_chunks,
    write_event,
)
from tunix_agentic.rollout.openai_endpoint.serving_base import Exchange, OpenAIServing


def completion_head(model: str) -> dict[str, Any]:
    """A completion's ``id``, ``created`` and (the default) ``model``."""
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}


@dataclasses.dataclass
class _ChatExchange(Exchange):
    head: dict[str, Any] = dataclasses.field(default_factory=dict)  # a streamed reply's


class OpenAIServingChat(OpenAIServing):
    """``POST /v1/chat/completions``."""

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/chat/completions", self.handle)]

    def exchange(self, request: web.Request) -> _ChatExchange:
        return _ChatExchange(request, head=completion_head(self.calls.config.model_name))

    def parse(self, ex: Exchange, body: Any) -> tuple[ChatCompletionRequest, Collection[str]]:
        config = self.calls.config
        chat = parse_chat_request(body, max_n=config.max_n, max_messages=config.max_messages)
        return chat, set(body)

    def live_writer(self, ex: _ChatExchange, chat: ChatCompletionRequest) -> LiveChunks | None:
        if not chat.stream:
            return None
        head = {**ex.head, "model": chat.model or ex.head["model"]}
        return LiveChunks(ex.request, ex.headers, head, chat.include_usage)

    async def stream_reply(
        self, ex: _ChatExchange, served: ServedCall
    ) -> web.StreamResponse | None:
        if not served.chat.stream:
            return None
        shown = (ex.writer, ex.live.text.shown) if ex.live is not None else None
        answer = self._answer(served, ex.head)
        return await send_chunks(ex.request, answer, self.calls.tokenizer.decode, ex.headers, shown)

    def whole_reply(self, ex: Exchange, served: ServedCall) -> web.Response:
        answer = completion_json(self._answer(served), self.calls.tokenizer.decode)
        return web.json_response(answer, headers=ex.headers)

    async def fail_stream(self, ex: Exchange, exc: RequestError) -> web.StreamResponse:
        stream = ex.begun
        error = ErrorReply(error={"message": str(exc), "type": "server_error"})
        await write_event(stream, error.model_dump())
        await stream.write(b"data: [DONE]\n\n")
        return stream

    def _answer(self, served: ServedCall, head: dict[str, Any] | None = None) -> Answer:
        head = head or completion_head(self.calls.config.model_name)
        return Answer(
            head={**head, "model": served.chat.model or head["model"]},
            prompt_tokens=len(served.prompt.ids),
            outs=served.outs,
            replies=served.replies,
            logprobs=served.chat.logprobs,
            include_usage=served.chat.include_usage,
        )
