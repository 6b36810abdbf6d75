"""The OpenAI Responses API subset that agent frameworks send (the OpenAI Agents SDK's
default model), served by the chat endpoint's own call path (host-side, no JAX).

``POST /v1/responses`` is not stateful: ``store`` is false (absent counts as false) and
``previous_response_id`` / ``conversation`` are refused with a 400 saying to send the
whole conversation in ``input``. A request is translated into the chat-completions
request it means (:func:`parse_responses_request`): ``instructions`` -> a system message
first; ``input`` a string -> one user message, or a list of items: ``message`` (roles
user, system, developer -> system, assistant; content a string or ``input_text`` /
``output_text`` parts), ``function_call`` (-> the assistant message's ``tool_calls``,
merged into the assistant message before it) and ``function_call_output`` (-> a tool
message); flat function ``tools`` -> chat tools; ``tool_choice`` none / auto / required /
``{"type": "function", "name": ...}``; ``max_output_tokens`` -> ``max_tokens``;
``temperature``, ``top_p`` (and the chat endpoint's ``top_k``, ``seed``); ``text.format``
``json_object`` or ``json_schema`` (its ``schema``) -> the JSON grammar chat's
``response_format`` becomes (:func:`~.schema.json_constraint`: enforced by constrained
decoding), echoed in the response's ``text``. ``model`` is echoed (a name the node does
not serve is a 404: :mod:`~.api`). As on chat (:mod:`~.schema`), a field this endpoint
does not know is accepted and ignored (logged once per name), and so are ``metadata``,
``user``, ``parallel_tool_calls``, cache / tier hints, ``safety_identifier``,
``reasoning`` (an ``effort`` of OpenAI's values) and ``text.verbosity``; inert values
(``include: []``, ``truncation: "disabled"``, ``top_logprobs: 0``, vLLM's and SGLang's
sampling fields at their neutral values: :class:`~.schema.EngineExtras`) are accepted; any
other value of those is a 400 naming the field.

The call then runs as a chat completion does
(:meth:`~tunix_agentic.rollout.openai_endpoint.api.ChatCompletions.serve_call`): the same
rendering, the same continuation of an episode's earlier calls (a re-sent output item is
the assistant message it came from), the same token-exact recording under
``X-Episode-Id``. The answer is a ``response`` object: ``output`` holds a ``message``
item with one ``output_text`` part (when the reply has text or no call), then a
``function_call`` item per parsed call (``call_id``, ``name``, ``arguments``); ``usage``
counts tokens; a reply cut by ``max_output_tokens`` is ``status: "incomplete"``. With
``stream: true`` the answer is server-sent events in OpenAI's order (``response.created``,
``response.in_progress``, per item ``response.output_item.added``, text deltas (one per
token that completes a character) or the arguments, ``...done`` events,
``response.output_item.done``, then ``response.completed`` or ``response.incomplete``).
The reply's text shows while the engine samples it (:class:`LiveEvents`: the opening
events and text deltas, held back as the chat path holds them: :mod:`.live`); the rest
follows once the call is recorded, under the same response and item ids. A client that
leaves mid-stream has its call marked cut, as the chat path does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from typing import Annotated, Any, Literal, Protocol

from aiohttp import web
from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from tunix_agentic.rollout.openai_endpoint.schema import (
    ChatRequest,
    EngineExtras,
    JSONObjectText,
    NeutralFields,
    RequestError,
    ToolName,
    json_constraint,
    note_ignored_fields,
    parse_chat_request,
)
from tunix_agentic.serving.http import json_error
from tunix_agentic.serving.validation import NonEmpty, Strict, inert, invalid, validate

_STATELESS = (
    "this endpoint keeps no responses: send store=false and the whole conversation in input"
)
_MAX_PIECES = 4096  # a longer reply streams its text as one delta (decoding is quadratic)


@dataclasses.dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses request: the chat request it means, the chat fields it gave
    (so an episode's call defaults fill only the others), ``stream``, and the request's
    values the response object repeats (``echo``)."""

    chat: ChatRequest
    given: frozenset[str]
    stream: bool
    echo: dict[str, Any]


class _Part(Strict, extra="ignore"):
    type: Literal["input_text", "output_text"]
    text: str


Text = str | list[_Part]


def _joined(text: Text) -> str:
    return text if isinstance(text, str) else "".join(p.text for p in text)


class _Item(Strict):
    # What an output item carries when a client sends it back as input (ignored here).
    id: Any = None
    status: Any = None
    phase: Any = None


class _MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Text

    @model_validator(mode="after")
    def _parts(self) -> _MessageItem:
        kind = "output_text" if self.role == "assistant" else "input_text"
        for j, part in enumerate(self.content if isinstance(self.content, list) else ()):
            if part.type != kind:
                where = ("content", j, "type")
                raise invalid(f"must be {kind!r} in a message of role {self.role}", where)
        return self


class _CallItem(_Item):
    type: Literal["function_call"]
    call_id: NonEmpty
    name: NonEmpty
    arguments: JSONObjectText


class _OutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: NonEmpty
    output: Text


def _item_type(item: Any) -> Any:
    # ``message`` when absent; a value that is no object is refused as a message.
    return item.get("type", "message") if isinstance(item, dict) else "message"


_InputItem = Annotated[
    Annotated[_MessageItem, Tag("message")]
    | Annotated[_CallItem, Tag("function_call")]
    | Annotated[_OutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="invalid",
        custom_error_message="must be 'message', 'function_call' or 'function_call_output'",
        custom_error_context={"at": "type"},
    ),
]


def _user_says(value: Any) -> Any:
    return [{"role": "user", "content": value}] if isinstance(value, str) else value


class _Conversation(Strict):
    # (a body may hold thousands of items: the first bad one is enough)
    input: Annotated[
        list[_InputItem], Field(min_length=1, fail_fast=True), BeforeValidator(_user_says)
    ]
    instructions: str | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages that ``instructions`` and ``input`` mean (the module doc)."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        for item in self.input:
            if isinstance(item, _MessageItem):
                role = "system" if item.role == "developer" else item.role
                messages.append({"role": role, "content": _joined(item.content)})
            elif isinstance(item, _OutputItem):
                output = _joined(item.output)
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
            else:
                fn = {"name": item.name, "arguments": item.arguments}
                call = {"id": item.call_id, "type": "function", "function": fn}
                if messages and messages[-1]["role"] == "assistant":  # the same reply's calls
                    messages[-1].setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        return messages


class _Tool(Strict):
    type: Literal["function"]  # (a flat function tool)
    name: ToolName
    description: Any = None
    parameters: dict[str, Any] | None = None
    strict: Any = None

    def chat(self) -> dict[str, Any]:
        fn = {"name": self.name, "parameters": self.parameters or {}}
        if self.description:
            fn["description"] = self.description
        return {"type": "function", "function": fn}


class _NamedTool(Strict, extra="ignore"):
    type: Literal["function"]
    name: str


class _TextFormat(Strict, extra="ignore"):  # name, description, strict: not enforced
    type: Literal["text", "json_object", "json_schema"]
    schema_: dict[str, Any] | None = Field(None, alias="schema")

    @model_validator(mode="after")
    def _spec(self) -> _TextFormat:
        if self.type == "json_schema" and self.schema_ is None:
            raise invalid("is required", "schema")
        return self


class _TextOptions(Strict):
    format: _TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # ignored (as chat's)


class _Reasoning(Strict, extra="ignore"):  # ignored (summary, ...), as chat's reasoning_effort
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class _Responses(_Conversation, EngineExtras, NeutralFields, extra="ignore"):
    """A ``/v1/responses`` body, its nulls dropped (null is "not given"); a field it does
    not name is ignored (logged once)."""

    tools: Annotated[list[_Tool], Field(fail_fast=True)] = []
    tool_choice: Literal["none", "auto", "required"] | _NamedTool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool = False
    text: _TextOptions | None = None
    reasoning: _Reasoning | None = None
    # Checked by the chat request they become.
    temperature: Any = None
    top_p: Any = None
    top_k: Any = None
    seed: Any = None
    # Accepted with a value that changes nothing here; another is refused saying why.
    store: inert(False, why=_STATELESS) = None
    previous_response_id: inert(why=_STATELESS) = None
    conversation: inert(why=_STATELESS) = None
    background: inert(False, why="background responses are not supported") = None
    include: inert([], why="no extra output data is supported (send include=[])") = None
    top_logprobs: inert(0, why="logprobs are not returned here (GET /v1/episodes/{id})") = None
    max_tool_calls: inert(why="is not supported") = None
    prompt: inert(why="stored prompts are not supported") = None
    truncation: inert("disabled", why="only 'disabled' is supported") = None
    stream_options: inert({}, why="is not supported") = None
    context_management: inert([], why="is not supported") = None
    model: Any = None  # echoed (the endpoint checks it); NeutralFields' are ignored

    @model_validator(mode="after")
    def _named_tool(self) -> _Responses:
        names = [t.name for t in self.tools]
        if isinstance(self.tool_choice, _NamedTool) and self.tool_choice.name not in names:
            name = self.tool_choice.name
            raise invalid(f"{name!r:.50} is not in tools ({names})", ("tool_choice", "name"))
        return self


def _given(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def input_messages(raw: Any, instructions: Any) -> list[dict[str, Any]]:
    """The chat messages that ``instructions`` and ``input`` mean (see the module doc)."""
    body = _given({"input": raw, "instructions": instructions})
    return validate(_Conversation, body, error=RequestError).messages()


def parse_responses_request(body: Any, *, max_messages: int) -> ResponsesRequest:
    """A :class:`ResponsesRequest` from a JSON body, or :class:`RequestError` naming the
    field (``input[2].call_id``); the translated chat request is checked as a chat one."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    given = _given(body)
    m = validate(_Responses, given, error=RequestError)
    note_ignored_fields(given, _Responses)
    choice = m.tool_choice
    if isinstance(choice, _NamedTool):
        choice = {"type": "function", "function": {"name": choice.name}}
    chat_body = _given(
        {
            "messages": m.messages(),
            "tools": [t.chat() for t in m.tools] or None,
            "tool_choice": choice,
            "max_tokens": m.max_output_tokens,
            **{k: getattr(m, k) for k in ("model", "temperature", "top_p", "top_k", "seed")},
        }
    )
    chat = parse_chat_request(chat_body, max_n=1, max_messages=max_messages)
    form = m.text.format if m.text else None
    if form is not None:
        grammar = json_constraint(form.type, form.schema_ or {}, "text.format.schema")
        chat = dataclasses.replace(chat, response_format=grammar)
    echo = {
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": m.max_output_tokens,
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
    }
    return ResponsesRequest(chat=chat, given=frozenset(chat_body), stream=m.stream, echo=echo)


# ----------------------------------------------------------------------------- answers
def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(
    message: Mapping[str, Any], *, complete: bool, message_id: str | None = None
) -> list[dict[str, Any]]:
    """The output items of one assistant message: a ``message`` item with its text (when
    it has text or no call; ``message_id`` its id), then a ``function_call`` item per call."""
    status = "completed" if complete else "incomplete"
    items = []
    calls = message.get("tool_calls") or ()
    if message.get("content") or not calls:
        part = {"type": "output_text", "text": message.get("content") or "", "annotations": []}
        item = {
            "id": message_id or _id("msg"),
            "type": "message",
            "role": "assistant",
            "status": status,
        }
        items.append({**item, "content": [{**part, "logprobs": []}]})
    for call in calls:
        fn = call["function"]
        items.append(
            {
                "id": _id("fc"),
                "type": "function_call",
                "status": status,
                "call_id": call["id"],
                "name": fn["name"],
                "arguments": fn["arguments"],
            }
        )
    return items


def response_object(
    request: ResponsesRequest, served: Any, default_model: str, shell: LiveEvents | None = None
) -> dict[str, Any]:
    """The ``response`` object of a served call (``served``: the chat path's
    :class:`~tunix_agentic.rollout.openai_endpoint.api.ServedCall`, one choice); ``shell``:
    the live stream whose ids (response, creation time, message item) it keeps."""
    (out,) = served.outs
    complete = out.finish_reason != "length"
    message_id = shell.message_id if shell else None
    output = output_items(served.messages[0], complete=complete, message_id=message_id)
    prompt_tokens, completion_tokens = len(served.prompt.ids), len(out.token_ids)
    now = time.time()
    return {
        "id": shell.response_id if shell else _id("resp"),
        "object": "response",
        "created_at": shell.created if shell else now,
        "completed_at": now,
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "error": None,
        **request.echo,
        "model": request.echo["model"] or default_model,
        "output": output,
        "previous_response_id": None,
        "store": False,
        "truncation": "disabled",
        "reasoning": None,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": int(out.cached_tokens)},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


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


def _opening(response: dict[str, Any]) -> list[dict[str, Any]]:
    shell = {**response, "status": "in_progress", "output": [], "usage": None}
    shell["incomplete_details"] = None
    return [
        {"type": "response.created", "response": shell},
        {"type": "response.in_progress", "response": shell},
    ]


def _message_opening(item: dict[str, Any], index: int) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    empty = {**item["content"][0], "text": ""}
    return [
        _added(item, content=[], index=index),
        {"type": "response.content_part.added", **at, "content_index": 0, "part": empty},
    ]


def stream_events(
    response: dict[str, Any], pieces: list[str], shown: LiveEvents | None = None
) -> Iterator[dict[str, Any]]:
    """The server-sent events of ``response`` in OpenAI's order, numbered; ``pieces``:
    the text deltas of its message item. ``shown``: the live stream that already sent the
    opening events and the first characters of the message's text: the events after."""
    number = itertools.count(shown.sent if shown else 0)
    skip = len(shown.text) if shown else 0
    events: list[dict[str, Any]] = [] if shown else _opening(response)
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            (part,) = item["content"]
            if not (shown and index == 0):
                events.extend(_message_opening(item, index))
            for piece in pieces:
                piece, skip = piece[skip:], max(0, skip - len(piece))
                if not piece:
                    continue
                delta = {"delta": piece, "logprobs": [], "content_index": 0}
                events.append({"type": "response.output_text.delta", **at, **delta})
            done = {"text": part["text"], "logprobs": [], "content_index": 0}
            events.append({"type": "response.output_text.done", **at, **done})
            events.append(
                {"type": "response.content_part.done", **at, "content_index": 0, "part": part}
            )
        else:
            events.append(_added(item, arguments="", index=index))
            args = item["arguments"]
            events.append({"type": "response.function_call_arguments.delta", **at, "delta": args})
            events.append(
                {"type": "response.function_call_arguments.done", **at, "arguments": args}
            )
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    final = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": final, "response": response})
    for event in events:
        yield {**event, "sequence_number": next(number)}


def _added(item: dict[str, Any], *, index: int, **empty: Any) -> dict[str, Any]:
    started = {**item, **empty, "status": "in_progress"}
    return {"type": "response.output_item.added", "output_index": index, "item": started}


class LiveEvents:
    """The first events of a streamed response, written while the engine samples (a
    :class:`~.live.LiveStream`'s writer): at the first piece the opening events with the
    message item (ids made here, kept by :func:`response_object`), then a text delta per
    piece. ``sent``: events written; ``text``: the text shown."""

    def __init__(
        self, request: web.Request, headers: dict[str, str], req: ResponsesRequest, model: str
    ):
        self.request, self.headers, self.req, self.model = request, headers, req, model
        self.response_id, self.message_id, self.created = _id("resp"), _id("msg"), time.time()
        self.stream: web.StreamResponse | None = None
        self.sent, self.text = 0, ""

    async def write(self, piece: str) -> None:
        events = []
        if self.stream is None:
            self.stream = await _event_stream(self.request, self.headers)
            shell = {
                "id": self.response_id,
                "object": "response",
                "created_at": self.created,
                **self.req.echo,
                "model": self.req.echo["model"] or self.model,
            }
            message = {"id": self.message_id, "type": "message", "role": "assistant"}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            item = {**message, "status": "in_progress", "content": [part]}
            events = [*_opening(shell), *_message_opening(item, 0)]
        at = {"item_id": self.message_id, "output_index": 0, "content_index": 0}
        events.append({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []})
        for event in events:
            await _write(self.stream, {**event, "sequence_number": self.sent})
            self.sent += 1
        self.text += piece


async def _event_stream(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    stream = web.StreamResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)
    return stream


async def _write(stream: web.StreamResponse, event: dict[str, Any]) -> None:
    data = json.dumps(event, separators=(",", ":"))
    await stream.write(f"event: {event['type']}\ndata: {data}\n\n".encode())


# ----------------------------------------------------------------------------- serving
class ChatPath(Protocol):
    """What this endpoint needs of the chat endpoint
    (:class:`~tunix_agentic.rollout.openai_endpoint.api.ChatCompletions`)."""

    config: Any  # OpenAIConfig: max_messages, model_name
    tokenizer: Any
    template: Any  # its stop_ids end a turn

    async def serve_call(
        self,
        request: web.Request,
        parse: Callable[[Any], tuple[ChatRequest, Collection[str]]],
        headers: dict[str, str],
        *,
        deliver: Callable[[Any], Awaitable[None]] | None = None,
        live: Callable[[ChatRequest], Any] | None = None,
    ) -> Any: ...

    def live_stream(self, chat: ChatRequest, write: Callable[[str], Awaitable[None]]) -> Any:
        """A :class:`~.live.LiveStream` of ``chat``'s content through ``write`` (None: the
        call is framed once recorded)."""
        ...


class Responses:
    """``POST /v1/responses`` over the chat endpoint ``chat`` (see the module docstring)."""

    def __init__(self, chat: ChatPath):
        self.chat = chat

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/v1/responses", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        headers: dict[str, str] = {}
        parsed: list[ResponsesRequest] = []
        sent: list[web.StreamResponse] = []
        shells: list[LiveEvents] = []
        lives: list[Any] = []  # the LiveStream
        model = self.chat.config.model_name

        def show_live(chat: ChatRequest) -> Any:
            if not parsed[0].stream:
                return None
            shells.append(LiveEvents(request, headers, parsed[0], model))
            lives.append(self.chat.live_stream(chat, shells[0].write))
            return lives[0]

        def parse(body: Any) -> tuple[ChatRequest, Collection[str]]:
            parsed.append(parse_responses_request(body, max_messages=self.chat.config.max_messages))
            return parsed[0].chat, parsed[0].given

        async def deliver(served: Any) -> None:  # after the call is recorded
            if parsed[0].stream:
                shell = shells[0] if shells and shells[0].stream else None
                sent.append(await self._stream(request, parsed[0], served, headers, shell))

        try:
            served = await self.chat.serve_call(
                request, parse, headers, deliver=deliver, live=show_live
            )
        except RequestError as exc:
            if shells and shells[0].stream is not None:  # the stream had begun: end it so
                error = {"code": "server_error", "message": str(exc)}
                event = {"type": "error", **error, "sequence_number": shells[0].sent}
                await _write(shells[0].stream, event)
                return shells[0].stream
            return json_error(exc.status, str(exc), "invalid_request_error", exc.code)
        except Exception:
            # A client gone mid-stream (the chat path marks the call cut): the stream that
            # was started is all the answer there is.
            if sent:
                return sent[0]
            raise
        except asyncio.CancelledError:
            if lives and lives[0] is not None and lives[0].gone:  # our cancel: client left
                asyncio.current_task().uncancel()
                return shells[0].stream or web.Response(status=499)
            raise
        if sent:
            return sent[0]
        response = response_object(parsed[0], served, self.chat.config.model_name)
        return web.json_response(response, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        req: ResponsesRequest,
        served: Any,
        headers: dict[str, str],
        shell: LiveEvents | None = None,
    ) -> web.StreamResponse:
        """Send ``served`` as server-sent events (a write to a gone client raises), after
        what ``shell`` sent live."""
        response = response_object(req, served, self.chat.config.model_name, shell)
        ids = list(served.outs[0].token_ids)
        if ids and ids[-1] in self.chat.template.stop_ids:
            ids = ids[:-1]
        text = next(
            (i["content"][0]["text"] for i in response["output"] if i["type"] == "message"), ""
        )
        pieces = text_pieces(self.chat.tokenizer.decode, ids, text)
        stream = shell.stream if shell and shell.stream else await _event_stream(request, headers)
        for event in stream_events(response, pieces, shell):
            await _write(stream, event)
        await stream.write_eof()
        return stream
