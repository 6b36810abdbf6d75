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
``temperature``, ``top_p`` (and the chat endpoint's ``top_k``, ``seed``). ``model``,
``metadata``, ``user``, ``parallel_tool_calls`` and cache / tier hints are echoed or
ignored; inert values (``include: []``, ``truncation: "disabled"``, ``text`` in plain
text format, ``reasoning`` without values) are accepted; any other value and any unknown
field is a 400 naming it.

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
from typing import Any, Protocol

from aiohttp import web

from tunix_agentic.rollout.openai_endpoint.schema import (
    ChatRequest,
    RequestError,
    parse_chat_request,
)
from tunix_agentic.serving.http import JSONDepthError, json_error, load_json

_STATELESS = (
    "this endpoint keeps no responses: send store=false and the whole conversation in input"
)
# Fields a client may send with a value that changes nothing here, and why others are refused.
_INERT: dict[str, tuple[tuple[Any, ...], str]] = {
    "store": ((None, False), _STATELESS),
    "previous_response_id": ((None,), _STATELESS),
    "conversation": ((None,), _STATELESS),
    "background": ((None, False), "background responses are not supported"),
    "include": ((None, []), "no extra output data is supported (send include=[])"),
    "top_logprobs": ((None, 0), "logprobs are not returned here (GET /v1/episodes/{id})"),
    "max_tool_calls": ((None,), "is not supported"),
    "prompt": ((None,), "stored prompts are not supported"),
    "truncation": ((None, "disabled"), "only 'disabled' is supported"),
    "stream_options": ((None, {}), "is not supported"),
    "context_management": ((None, []), "is not supported"),
}
_IGNORED = {
    "model",
    "user",
    "metadata",
    "parallel_tool_calls",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
}
_KNOWN = {
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_output_tokens",
    "stream",
    "text",
    "reasoning",
    *_INERT,
    *_IGNORED,
}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TOOL_KEYS = {"type", "name", "description", "parameters", "strict"}
# Keys an output item carries when a client sends it back as input (ignored here).
_ITEM_EXTRAS = {"id", "status", "phase"}
_MAX_PIECES = 4096  # a longer reply streams its text as one delta (decoding is quadratic)


def _fail(where: str, message: str) -> RequestError:
    return RequestError(f"{where}: {message}")


@dataclasses.dataclass(frozen=True)
class ResponsesRequest:
    """A checked Responses request: the chat request it means, the chat fields it gave
    (so an episode's call defaults fill only the others), ``stream``, and the request's
    values the response object repeats (``echo``)."""

    chat: ChatRequest
    given: frozenset[str]
    stream: bool
    echo: dict[str, Any]


def _text_parts(raw: Any, where: str, kinds: Collection[str]) -> str:
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise _fail(where, f"must be a string or a list of parts, got {type(raw).__name__}")
    texts = []
    for j, part in enumerate(raw):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in kinds:
            raise _fail(
                f"{where}[{j}].type", f"must be one of {', '.join(kinds)}, got {kind!r:.50}"
            )
        if not isinstance(part.get("text"), str):
            raise _fail(f"{where}[{j}].text", "must be a string")
        texts.append(part["text"])
    return "".join(texts)


def _unknown_keys(item: Mapping[str, Any], allowed: Collection[str], where: str, what: str):
    unknown = sorted(set(item) - set(allowed) - _ITEM_EXTRAS)
    if unknown:
        raise _fail(f"{where}.{unknown[0]}", f"is not a field of a {what} item")


def _message_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    _unknown_keys(item, {"type", "role", "content"}, where, "message")
    role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise _fail(
            f"{where}.role", f"must be one of {', '.join(_ROLES)}, got {item.get('role')!r:.50}"
        )
    kinds = ("output_text",) if role == "assistant" else ("input_text",)
    return {"role": role, "content": _text_parts(item.get("content"), f"{where}.content", kinds)}


def _call_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    _unknown_keys(item, {"type", "call_id", "name", "arguments"}, where, "function_call")
    for key in ("call_id", "name"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise _fail(f"{where}.{key}", "must be a non-empty string")
    args = item.get("arguments")
    try:
        parsed = load_json(args, f"{where}.arguments") if isinstance(args, str) else None
    except JSONDepthError as exc:
        raise RequestError(str(exc)) from None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _fail(f"{where}.arguments", "must be a string holding a JSON object")
    fn = {"name": item["name"], "arguments": args}
    return {"id": item["call_id"], "type": "function", "function": fn}


def _output_item(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    _unknown_keys(item, {"type", "call_id", "output"}, where, "function_call_output")
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise _fail(f"{where}.call_id", "must be a non-empty string")
    output = _text_parts(item.get("output"), f"{where}.output", ("input_text", "output_text"))
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def input_messages(raw: Any, instructions: Any) -> list[dict[str, Any]]:
    """The chat messages that ``instructions`` and ``input`` mean (see the module doc)."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _fail("instructions", "must be a string")
        if instructions:
            messages.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _fail("input", "must be a string or a non-empty list of items")
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _fail(where, f"must be an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message_item(item, where))
        elif kind == "function_call":
            call = _call_item(item, where)
            if messages and messages[-1]["role"] == "assistant":  # the same reply's calls
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(_output_item(item, where))
        else:
            raise _fail(
                f"{where}.type",
                f"{kind!r:.50} items are not supported (message, function_call, "
                "function_call_output)",
            )
    return messages


def _chat_tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _fail("tools", f"must be a list, got {type(raw).__name__}")
    tools = []
    for j, tool in enumerate(raw):
        where = f"tools[{j}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise _fail(f"{where}.type", f"only 'function' tools are supported, got {kind!r:.50}")
        unknown = sorted(set(tool) - _TOOL_KEYS)
        if unknown:
            raise _fail(f"{where}.{unknown[0]}", "is not a supported field of a function tool")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _fail(f"{where}.name", "must be a non-empty string")
        fn = {"name": tool["name"], "parameters": tool.get("parameters") or {}}
        if not isinstance(fn["parameters"], Mapping):
            raise _fail(f"{where}.parameters", "must be a JSON schema object")
        if tool.get("description"):
            fn["description"] = tool["description"]
        tools.append({"type": "function", "function": fn})
    return tools


def _chat_tool_choice(raw: Any, tools: list[dict[str, Any]]) -> Any:
    if raw is None or raw in ("none", "auto", "required"):
        return raw
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        names = [t["function"]["name"] for t in tools]
        if raw.get("name") not in names:
            raise _fail("tool_choice.name", f"{raw.get('name')!r:.50} is not in tools ({names})")
        return {"type": "function", "function": {"name": raw["name"]}}
    raise _fail(
        "tool_choice", "must be 'none', 'auto', 'required' or {'type': 'function', 'name': ...}"
    )


def _check_inert(body: Mapping[str, Any]) -> None:
    for key, (allowed, why) in _INERT.items():
        if key in body and body[key] not in allowed:
            raise _fail(key, why)
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, Mapping) else None
        if not isinstance(text, Mapping) or set(text) - {"format", "verbosity"}:
            raise _fail("text", "only {'format': {'type': 'text'}} is supported")
        if fmt not in (None, {"type": "text"}) or text.get("verbosity") not in (None, "medium"):
            raise _fail("text.format", "only plain text output is supported")
    reasoning = body.get("reasoning")
    if reasoning is not None and (
        not isinstance(reasoning, Mapping) or any(v is not None for v in reasoning.values())
    ):
        raise _fail("reasoning", "reasoning settings are not supported (the model has none)")


def parse_responses_request(body: Any, *, max_messages: int) -> ResponsesRequest:
    """A :class:`ResponsesRequest` from a JSON body, or :class:`RequestError` naming the
    field (``input[2].call_id``); the translated chat request is checked as a chat one."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _fail(unknown[0], "is not a supported field of /v1/responses")
    _check_inert(body)
    if body.get("stream") not in (None, False, True):
        raise _fail("stream", "must be a boolean")
    messages = input_messages(body.get("input"), body.get("instructions"))
    tools = _chat_tools(body.get("tools"))
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise _fail("max_output_tokens", f"must be an integer >= 1, got {max_tokens!r:.50}")
    chat_body: dict[str, Any] = {
        "messages": messages,
        "tools": tools or None,
        "tool_choice": _chat_tool_choice(body.get("tool_choice"), tools),
        "max_tokens": max_tokens,
        **{k: body.get(k) for k in ("model", "temperature", "top_p", "top_k", "seed")},
    }
    chat_body = {k: v for k, v in chat_body.items() if v is not None}
    chat = parse_chat_request(chat_body, max_n=1, max_messages=max_messages)
    echo = {
        "model": body.get("model"),
        "instructions": body.get("instructions"),
        "tools": list(body.get("tools") or []),
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": max_tokens,
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
    }
    return ResponsesRequest(
        chat=chat, given=frozenset(chat_body), stream=body.get("stream") is True, echo=echo
    )


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
        "text": {"format": {"type": "text"}},
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
            return json_error(exc.status, str(exc), "invalid_request_error")
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
