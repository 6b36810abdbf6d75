"""``POST /v1/responses``: the Responses API subset agent frameworks send (the OpenAI Agents
SDK's default model), served as the chat call it means over the shared call path.

Not stateful: the whole conversation comes in ``input``. A request is translated into the
chat request it means (:func:`parse_responses_request`) and runs as a chat call does:
the same rendering, continuation of an episode's calls and token-exact recording. The
answer is a ``response`` object or, with ``stream``, OpenAI's server-sent events, the
text shown while it is sampled (:class:`LiveEvents`). The translation and the events in
detail: ``docs/reference/openai_routes.md``. Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.call_path import ServedCall
from tunix_agentic.rollout.openai_endpoint.protocol import (
    ArgumentsDeltaEvent,
    ArgumentsDoneEvent,
    ChatCompletionRequest,
    ContentPartEvent,
    ErrorEvent,
    FunctionCallItem,
    MessageItem,
    OutputItem,
    OutputItemEvent,
    OutputText,
    RequestError,
    ResponseEvent,
    ResponseObject,
    ResponsesInput,
    ResponsesRequest,
    ResponseUsage,
    StreamEvent,
    TextDeltaEvent,
    TextDoneEvent,
    note_ignored_fields,
    parse_chat_request,
)
from tunix_agentic.rollout.openai_endpoint.reply import event_stream
from tunix_agentic.rollout.openai_endpoint.serving_base import Exchange, OpenAIServing
from tunix_agentic.serving.validation import validate

_MAX_PIECES = 4096  # a longer reply streams its text as one delta (decoding is quadratic)


@dataclasses.dataclass(frozen=True)
class ResponsesCall:
    """A checked Responses request: the chat request it means, the chat fields it gave
    (so an episode's call defaults fill only the others), ``stream``, and the request's
    values the response object repeats (``echo``: :func:`echo_of`)."""

    chat: ChatCompletionRequest
    given: frozenset[str]
    stream: bool
    echo: dict[str, Any]


def _given(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def input_messages(raw: Any, instructions: Any) -> list[dict[str, Any]]:
    """The chat messages that ``instructions`` and ``input`` mean
    (:meth:`~.protocol.ResponsesInput.messages`)."""
    body = _given({"input": raw, "instructions": instructions})
    return validate(ResponsesInput, body, error=RequestError).messages()


def echo_of(body: Mapping[str, Any], max_output_tokens: int | None) -> dict[str, Any]:
    """The :class:`~.protocol.ResponseObject` fields that repeat the request ``body``."""
    return {
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": max_output_tokens,
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
    }


def parse_responses_request(body: Any, *, max_messages: int) -> ResponsesCall:
    """A :class:`ResponsesCall` from a JSON body, or :class:`RequestError` naming the
    field (``input[2].call_id``); the translated chat request is checked as a chat one."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    given = _given(body)
    m = validate(ResponsesRequest, given, error=RequestError)
    note_ignored_fields(given, ResponsesRequest)
    chat_body = m.chat_body()
    chat = parse_chat_request(chat_body, max_n=1, max_messages=max_messages)
    if m.text is not None and m.text.format is not None:
        chat = chat.with_response_grammar(m.output_grammar())
    echo = echo_of(body, m.max_output_tokens)
    return ResponsesCall(chat=chat, given=frozenset(chat_body), stream=m.stream, echo=echo)


# ----------------------------------------------------------------------------- answers
def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(
    message: Mapping[str, Any], *, complete: bool, message_id: str | None = None
) -> list[OutputItem]:
    """The output items of one assistant message: a ``message`` item with its text (when
    it has text or no call; ``message_id`` its id), then a ``function_call`` item per call."""
    status = "completed" if complete else "incomplete"
    items: list[OutputItem] = []
    calls = message.get("tool_calls") or ()
    if message.get("content") or not calls:
        part = OutputText(text=message.get("content") or "")
        items.append(MessageItem(id=message_id or _id("msg"), status=status, content=[part]))
    for call in calls:
        fn = call["function"]
        items.append(
            FunctionCallItem(
                id=_id("fc"),
                status=status,
                call_id=call["id"],
                name=fn["name"],
                arguments=fn["arguments"],
            )
        )
    return items


def response_object(
    request: ResponsesCall, served: ServedCall, default_model: str, shell: LiveEvents | None = None
) -> ResponseObject:
    """The ``response`` object of a served call (one choice); ``shell``: the live stream
    whose ids (response, creation time, message item) it keeps."""
    (out,) = served.outs
    complete = out.finish_reason != "length"
    message_id = shell.message_id if shell else None
    output = output_items(served.messages[0], complete=complete, message_id=message_id)
    prompt_tokens, completion_tokens = len(served.prompt.ids), len(out.token_ids)
    now = time.time()
    return ResponseObject(
        id=shell.response_id if shell else _id("resp"),
        created_at=shell.created if shell else now,
        completed_at=now,
        status="completed" if complete else "incomplete",
        incomplete_details=None if complete else {"reason": "max_output_tokens"},
        error=None,
        **{**request.echo, "model": request.echo["model"] or default_model},
        output=output,
        previous_response_id=None,
        store=False,
        truncation="disabled",
        reasoning=None,
        usage=ResponseUsage(
            input_tokens=prompt_tokens,
            input_tokens_details={"cached_tokens": int(out.cached_tokens)},
            output_tokens=completion_tokens,
            total_tokens=prompt_tokens + completion_tokens,
        ),
    )


def text_pieces(decode: Callable[[list[int]], str], ids: list[int], text: str) -> list[str]:
    """``text`` as the deltas a token-by-token stream shows: each token's new characters
    (a token ending mid-character waits for the next), or ``[text]`` when ``text`` is not
    the decoding of ``ids`` (a reply whose tool calls were taken out of it) or too long to
    decode prefix by prefix."""
    if len(ids) > _MAX_PIECES:
        return [text]
    pieces, shown = [], ""
    for k in range(1, len(ids) + 1):
        now = decode(ids[:k])
        if now.endswith("\ufffd") or not now.startswith(shown) or now == shown:
            continue
        pieces.append(now[len(shown) :])
        shown = now
    return pieces if shown == text and pieces else [text]


def _opening(response: ResponseObject) -> list[StreamEvent]:
    shell = response.model_copy(
        update={"status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    )
    return [
        ResponseEvent(type="response.created", response=shell),
        ResponseEvent(type="response.in_progress", response=shell),
    ]


def _message_opening(item: MessageItem, index: int) -> list[StreamEvent]:
    started = item.model_copy(update={"content": [], "status": "in_progress"})
    empty = item.content[0].model_copy(update={"text": ""})
    return [
        OutputItemEvent(type="response.output_item.added", output_index=index, item=started),
        ContentPartEvent(
            type="response.content_part.added", item_id=item.id, output_index=index, part=empty
        ),
    ]


def _item_events(item: OutputItem, index: int, pieces: list[str], skip: int) -> list[StreamEvent]:
    """An output item's events after its opening (a message's text deltas past the first
    ``skip`` characters), up to ``response.output_item.done``."""
    at = {"item_id": item.id, "output_index": index}
    events: list[StreamEvent] = []
    if isinstance(item, MessageItem):
        (part,) = item.content
        for piece in pieces:
            piece, skip = piece[skip:], max(0, skip - len(piece))
            if piece:
                events.append(TextDeltaEvent(**at, delta=piece))
        events.append(TextDoneEvent(**at, text=part.text))
        events.append(ContentPartEvent(type="response.content_part.done", **at, part=part))
    else:
        started = item.model_copy(update={"arguments": "", "status": "in_progress"})
        events.append(
            OutputItemEvent(type="response.output_item.added", output_index=index, item=started)
        )
        events.append(ArgumentsDeltaEvent(**at, delta=item.arguments))
        events.append(ArgumentsDoneEvent(**at, arguments=item.arguments))
    events.append(OutputItemEvent(type="response.output_item.done", output_index=index, item=item))
    return events


def stream_events(
    response: ResponseObject, pieces: list[str], shown: LiveEvents | None = None
) -> Iterator[dict[str, Any]]:
    """The server-sent events of ``response`` in OpenAI's order, numbered; ``pieces``:
    the text deltas of its message item. ``shown``: the live stream that already sent the
    opening events and the first characters of the message's text: the events after."""
    number = itertools.count(shown.sent if shown else 0)
    skip = len(shown.text) if shown else 0
    events = [] if shown else _opening(response)
    for index, item in enumerate(response.output):
        if isinstance(item, MessageItem) and not (shown and index == 0):
            events.extend(_message_opening(item, index))
        events.extend(_item_events(item, index, pieces, skip))
    final = "response.completed" if response.status == "completed" else "response.incomplete"
    events.append(ResponseEvent(type=final, response=response))
    for event in events:
        yield {**event.model_dump(), "sequence_number": next(number)}


class LiveEvents:
    """The first events of a streamed response, written while the engine samples (a
    :class:`~.live.LiveStream`'s writer): at the first piece the opening events with the
    message item (ids made here, kept by :func:`response_object`), then a text delta per
    piece. ``sent``: events written; ``text``: the text shown."""

    def __init__(
        self, request: web.Request, headers: dict[str, str], req: ResponsesCall, model: str
    ):
        self.request, self.headers, self.req, self.model = request, headers, req, model
        self.response_id, self.message_id, self.created = _id("resp"), _id("msg"), time.time()
        self.stream: web.StreamResponse | None = None
        self.sent, self.text = 0, ""

    async def write(self, piece: str) -> None:
        events: list[StreamEvent] = []
        if self.stream is None:
            self.stream = await event_stream(self.request, self.headers)
            shell = ResponseObject(
                id=self.response_id,
                created_at=self.created,
                status="in_progress",
                **{**self.req.echo, "model": self.req.echo["model"] or self.model},
                output=[],
            )
            part = OutputText(text="")
            item = MessageItem(id=self.message_id, status="in_progress", content=[part])
            events = [*_opening(shell), *_message_opening(item, 0)]
        events.append(TextDeltaEvent(item_id=self.message_id, output_index=0, delta=piece))
        for event in events:
            await _write(self.stream, {**event.model_dump(), "sequence_number": self.sent})
            self.sent += 1
        self.text += piece


async def _write(stream: web.StreamResponse, event: dict[str, Any]) -> None:
    data = json.dumps(event, separators=(",", ":"))
    await stream.write(f"event: {event['type']}\ndata: {data}\n\n".encode())


# ----------------------------------------------------------------------------- serving
@dataclasses.dataclass
class _ResponsesExchange(Exchange):
    req: ResponsesCall | None = None  # the parsed request


class OpenAIServingResponses(OpenAIServing):
    """``POST /v1/responses``."""

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/responses", self.handle)]

    def exchange(self, request: web.Request) -> _ResponsesExchange:
        return _ResponsesExchange(request)

    def parse(
        self, ex: _ResponsesExchange, body: Any
    ) -> tuple[ChatCompletionRequest, Collection[str]]:
        ex.req = parse_responses_request(body, max_messages=self.calls.config.max_messages)
        return ex.req.chat, ex.req.given

    def live_writer(self, ex: _ResponsesExchange, chat: ChatCompletionRequest) -> LiveEvents | None:
        if not ex.req.stream:
            return None
        return LiveEvents(ex.request, ex.headers, ex.req, self.calls.config.model_name)

    async def stream_reply(
        self, ex: _ResponsesExchange, served: ServedCall
    ) -> web.StreamResponse | None:
        """Send ``served`` as server-sent events (a write to a gone client raises), after
        what the live stream sent."""
        if not ex.req.stream:
            return None
        shell = ex.writer if ex.writer is not None and ex.writer.stream else None
        response = response_object(ex.req, served, self.calls.config.model_name, shell)
        ids = list(served.outs[0].token_ids)
        if ids and ids[-1] in self.calls.template.stop_ids:
            ids = ids[:-1]
        text = next((i.content[0].text for i in response.output if isinstance(i, MessageItem)), "")
        pieces = text_pieces(self.calls.tokenizer.decode, ids, text)
        stream = shell.stream if shell else await event_stream(ex.request, ex.headers)
        for event in stream_events(response, pieces, shell):
            await _write(stream, event)
        await stream.write_eof()
        return stream

    def whole_reply(self, ex: _ResponsesExchange, served: ServedCall) -> web.Response:
        response = response_object(ex.req, served, self.calls.config.model_name)
        return web.json_response(response.model_dump(), headers=ex.headers)

    async def fail_stream(self, ex: Exchange, exc: RequestError) -> web.StreamResponse:
        event = ErrorEvent(message=str(exc)).model_dump()
        await _write(ex.begun, {**event, "sequence_number": ex.writer.sent})
        return ex.begun
