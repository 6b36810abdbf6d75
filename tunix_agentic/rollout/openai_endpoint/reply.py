"""What a chat completion answers, built from the sampled ids (host-side, no JAX).

:func:`parse_reply` turns a completion's text into OpenAI's assistant message (calls to
an offered tool become ``tool_calls``; a call to any other tool stays text, counted);
:func:`completion_json` and :func:`stream_chunks` frame the replies as a
``chat.completion`` or as ``chat.completion.chunk`` events whose deltas add up to the
same message (:mod:`~.protocol`'s models). The framing in detail:
``docs/reference/openai_routes.md``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any

from aiohttp import web

from tunix_agentic.agent.tool_parser import Action
from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.rollout.openai_endpoint.protocol import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChoice,
    ChatCompletionChunk,
    ChoiceDelta,
    ChoiceLogprobs,
    ChunkChoice,
    FinishReason,
    FunctionCall,
    FunctionDelta,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    Usage,
)

_TOOL_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.DOTALL)
_ARGUMENT_PIECE = 16  # characters per streamed fragment of a call's arguments
_PENDING_MAX = 16  # ids one delta may wait for before the rest goes in the last delta
_CONTEXT_IDS = 4  # ids decoded before the pending ones (merges, leading spaces)


@dataclasses.dataclass(frozen=True)
class Reply:
    """One choice's answer: ``text`` (its ids decoded, the end-of-turn id and a matched
    stop string left out), the assistant ``message``, where each returned call's block
    was in ``text`` (``calls_at``: ``[start, end)``), how many blocks called a tool the
    request did not offer (``unoffered``, left in the content), and the ``text_ids``: the
    completion's ids that make up ``text`` (all but an end-of-turn id)."""

    text: str
    message: dict[str, Any]
    calls_at: tuple[tuple[int, int], ...] = ()
    unoffered: int = 0
    text_ids: tuple[int, ...] = ()


def parse_reply(
    text: str,
    text_ids: Sequence[int],
    *,
    parse: Callable[[str], Action],
    offered: Collection[str] | None,
) -> Reply:
    """The :class:`Reply` of ``text``; ``offered``: the tool names calls may name (None:
    no call is parsed, as with ``tool_choice="none"``)."""
    if offered is None:
        return Reply(text, AssistantMessage(content=text).model_dump(), text_ids=tuple(text_ids))
    calls: list[ToolCall] = []
    kept, spans = [], []
    unoffered = last = 0
    for match in _TOOL_CALL.finditer(text):
        try:
            action = parse(match.group(0))
        except RecursionError:  # arguments nested past what JSON parsing can take
            continue  # left in the text, as a malformed block is
        if not action.tool_calls or action.parse_errors:
            continue
        call = action.tool_calls[0]
        if call.name not in offered:
            unoffered += 1
            continue
        kept.append(text[last : match.start()])
        last = match.end()
        spans.append((match.start(), match.end()))
        function = FunctionCall(name=call.name, arguments=json.dumps(call.arguments))
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=function))
    message = AssistantMessage(content=text)
    if calls:
        content = "".join(kept) + text[last:]
        message = AssistantMessage(content=content if content.strip() else None, tool_calls=calls)
    return Reply(text, message.model_dump(), tuple(spans), unoffered, tuple(text_ids))


def finish_reason(out: TokenOutput, reply: Reply) -> FinishReason:
    """OpenAI's ``finish_reason``: "tool_calls", "length" or "stop"."""
    if reply.message.get("tool_calls"):
        return "tool_calls"
    return "length" if out.finish_reason == "length" else "stop"


def logprobs_json(
    reply: Reply, logprobs: Sequence[float], decode: Callable[[list[int]], str]
) -> ChoiceLogprobs:
    """OpenAI's ``logprobs`` of a choice: one entry per id of its text (tool-call blocks
    included; the end-of-turn id, which is no text, left out; ``GET /v1/episodes/{id}``
    has every recorded one), each the sampled token's logprob under the distribution the
    engine sampled from; ``top_logprobs`` empty (the engine returns no alternatives)."""
    entries = []
    for tid, lp in zip(reply.text_ids, logprobs, strict=False):
        token = decode([tid])
        entries.append(
            TokenLogprob(token=token, logprob=float(lp), bytes=list(token.encode("utf-8")))
        )
    return ChoiceLogprobs(content=entries)


def token_ends(decode: Callable[[list[int]], str], ids: Sequence[int], text: str) -> list[int]:
    """Where each of ``ids``' text ends in ``text`` (non-decreasing, the last ``len(text)``):
    an id that completes no character yet (part of a UTF-8 sequence) ends where the one
    before did, and an id whose decoded piece is not the next slice of ``text`` (a trimmed
    stop string) waits, at most :data:`_PENDING_MAX` ids, then the rest goes to the last."""
    ends: list[int] = []
    pos = done = 0  # text placed so far; ids [0, done) placed
    stuck = False
    for k in range(1, len(ids) + 1):
        if not stuck:
            a = max(0, done - _CONTEXT_IDS)
            head, whole = decode(list(ids[a:done])), decode(list(ids[a:k]))
            piece = whole[len(head) :]
            if whole.startswith(head) and not whole.endswith("\ufffd"):
                if text.startswith(piece, pos):
                    pos, done = pos + len(piece), k
            stuck = k - done > _PENDING_MAX
        ends.append(pos)
    if ends:
        ends[-1] = len(text)
    return ends


@dataclasses.dataclass(frozen=True)
class StreamChoice:
    """What :func:`stream_chunks` needs of one choice."""

    reply: Reply
    finish_reason: FinishReason
    ends: list[int]  # token_ends of its text ids
    logprobs: ChoiceLogprobs | None = None  # logprobs_json, when the request asked


def _call_deltas(index: int, call: dict[str, Any]) -> Iterator[ChoiceDelta]:
    fn = call["function"]
    named = FunctionDelta(name=fn["name"], arguments="")
    yield ChoiceDelta(
        tool_calls=[ToolCallDelta(index=index, id=call["id"], type="function", function=named)]
    )
    args = fn["arguments"]
    for at in range(0, len(args), _ARGUMENT_PIECE):
        piece = FunctionDelta(arguments=args[at : at + _ARGUMENT_PIECE])
        yield ChoiceDelta(tool_calls=[ToolCallDelta(index=index, function=piece)])


def _outside(text: str, start: int, end: int, spans: Sequence[tuple[int, int]]) -> str:
    """``text[start:end]`` without the (sorted) ``spans``: the content it holds."""
    out, at = [], start
    for a, b in spans:
        if b <= at or a >= end:
            continue
        if a > at:
            out.append(text[at:a])
        at = max(at, b)
    if at < end:
        out.append(text[at:end])
    return "".join(out)


def _choice_deltas(
    choice: StreamChoice, shown: int = 0
) -> Iterator[tuple[ChoiceDelta, ChoiceLogprobs | None]]:
    """``(delta, logprobs)`` pairs of one choice, role first, finish_reason not included;
    ``shown``: characters of content already sent live (:mod:`.live`), with the role."""
    if shown:
        for delta, lp in _choice_deltas(choice):
            piece = delta.content
            if delta.role is not None:
                continue
            if piece and shown:
                delta = delta.model_copy(update={"content": piece[shown:]})
                shown = max(0, shown - len(piece))
                if not delta.content and lp is None:
                    continue
            yield delta, lp
        return
    reply, message = choice.reply, choice.reply.message
    shows_content = message["content"] is not None
    yield ChoiceDelta(role="assistant", content="" if shows_content else None), None
    calls = message.get("tool_calls") or []
    entries = choice.logprobs.content if choice.logprobs else None
    sent_calls = start = 0
    for k, end in enumerate(choice.ends):
        piece = _outside(reply.text, start, end, reply.calls_at) if shows_content else ""
        lp = ChoiceLogprobs(content=[entries[k]]) if entries and k < len(entries) else None
        if piece or lp is not None:
            yield (ChoiceDelta(content=piece) if shows_content else ChoiceDelta()), lp
        while sent_calls < len(calls) and reply.calls_at[sent_calls][1] <= end:
            for delta in _call_deltas(sent_calls, calls[sent_calls]):
                yield delta, None
            sent_calls += 1
        start = end
    for i in range(sent_calls, len(calls)):  # (only with no ids at all)
        for delta in _call_deltas(i, calls[i]):
            yield delta, None


def _chunk(
    head: dict[str, Any],
    with_usage: bool,
    index: int,
    delta: ChoiceDelta,
    finish: FinishReason | None = None,
    lp: ChoiceLogprobs | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice's delta (``"usage": null`` when the
    stream ends with a usage chunk, as OpenAI's do)."""
    one = ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=lp)
    usage = {"usage": None} if with_usage else {}
    return ChatCompletionChunk(**head, **usage, choices=[one]).model_dump()


def stream_chunks(
    head: dict[str, Any],
    choices: Sequence[StreamChoice],
    usage: Usage | dict[str, int] | None,
    shown: int = 0,
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` events of a reply (``head``: ``id``, ``created``,
    ``model``); a last chunk with ``usage`` and no choices when ``usage`` is given.
    ``shown``: characters of the first choice's content already sent live (with its
    role delta): the events that follow them."""
    with_usage = usage is not None
    for index, choice in enumerate(choices):
        for delta, lp in _choice_deltas(choice, shown if index == 0 else 0):
            yield _chunk(head, with_usage, index, delta, None, lp)
        yield _chunk(head, with_usage, index, ChoiceDelta(), choice.finish_reason)
    if usage is not None:
        yield ChatCompletionChunk(**head, choices=[], usage=usage).model_dump()


@dataclasses.dataclass(frozen=True)
class Answer:
    """What one call answers: ``head`` (``id``, ``created``, ``model``), the prompt's
    length, the engine's outputs (cut at stop strings) and their replies, and whether the
    request asked for ``logprobs`` and (streaming) a usage chunk."""

    head: dict[str, Any]
    prompt_tokens: int
    outs: Sequence[TokenOutput]
    replies: Sequence[Reply]
    logprobs: bool = False
    include_usage: bool = False

    def usage(self) -> Usage:
        completion = sum(len(out.token_ids) for out in self.outs)
        return Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=completion,
            total_tokens=self.prompt_tokens + completion,
        )

    def choice_logprobs(self, k: int, decode: Callable[[list[int]], str]) -> ChoiceLogprobs | None:
        if not self.logprobs:
            return None
        return logprobs_json(self.replies[k], self.outs[k].logprobs, decode)


def completion_json(answer: Answer, decode: Callable[[list[int]], str]) -> dict[str, Any]:
    """OpenAI's ``chat.completion`` object of ``answer``."""
    choices = [
        ChatCompletionChoice(
            index=k,
            message=AssistantMessage.model_validate(reply.message),
            finish_reason=finish_reason(out, reply),
            logprobs=answer.choice_logprobs(k, decode),
        )
        for k, (out, reply) in enumerate(zip(answer.outs, answer.replies, strict=True))
    ]
    return ChatCompletion(**answer.head, choices=choices, usage=answer.usage()).model_dump()


async def event_stream(request: web.Request, headers: dict[str, str]) -> web.StreamResponse:
    """A prepared server-sent-events response."""
    stream = web.StreamResponse(
        headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await stream.prepare(request)
    return stream


async def write_event(stream: web.StreamResponse, body: Any) -> None:
    await stream.write(b"data: " + json.dumps(body).encode() + b"\n\n")


class LiveChunks:
    """The first chunks of a chat stream, written while the engine samples (the
    :class:`~.live.LiveStream`'s writer): the response is opened at the first piece, with
    the role delta, then each piece is a content delta."""

    def __init__(
        self, request: web.Request, headers: dict[str, str], head: dict[str, Any], usage: bool
    ):
        self.request, self.headers, self.head, self.usage = request, headers, head, usage
        self.stream: web.StreamResponse | None = None

    async def write(self, piece: str) -> None:
        if self.stream is None:
            self.stream = await event_stream(self.request, self.headers)
            role = ChoiceDelta(role="assistant", content="")
            await write_event(self.stream, _chunk(self.head, self.usage, 0, role))
        delta = ChoiceDelta(content=piece)
        await write_event(self.stream, _chunk(self.head, self.usage, 0, delta))


async def send_chunks(
    request: web.Request,
    answer: Answer,
    decode: Callable[[list[int]], str],
    headers: dict[str, str],
    live: tuple[LiveChunks, str] | None = None,
) -> web.StreamResponse:
    """Send ``answer`` as server-sent chunk events, then ``data: [DONE]`` (a
    ``ConnectionError`` when the client has left); ``live``: the chunks already sent
    while sampling and the content they showed (the rest follows on their response)."""
    choices = [
        StreamChoice(
            reply=reply,
            finish_reason=finish_reason(out, reply),
            ends=token_ends(decode, reply.text_ids, reply.text),
            logprobs=answer.choice_logprobs(k, decode),
        )
        for k, (out, reply) in enumerate(zip(answer.outs, answer.replies, strict=True))
    ]
    chunks, shown = live if live is not None else (None, "")
    stream = chunks.stream if chunks and chunks.stream else None
    if stream is None:
        stream, shown = await event_stream(request, headers), ""
    usage = answer.usage() if answer.include_usage else None
    for chunk in stream_chunks(answer.head, choices, usage, len(shown)):
        await write_event(stream, chunk)
    await stream.write(b"data: [DONE]\n\n")
    await stream.write_eof()
    return stream
