"""How a chat request becomes the prompt ids the engine sees (host-side, no JAX).

A conversation renders with the run's chat template as the agent loop frames its prompts
(:func:`template_messages`), the request's ``chat_template_kwargs`` passed to the
rendering, and is tokenised once. A request that continues a call an
episode recorded (that call's messages, then the assistant message it returned, then new
ones) is not re-rendered: its prompt is that call's prompt + completion ids followed by
the template's ids for the new messages (:meth:`PromptRenderer.prompt`), so what the
model generated is never re-tokenised and the calls chain into one learner row. A client's
text is encoded with :func:`~tunix_agentic.models.tokenizer.encode_client_text`: the
built-in tokenizer folds a tab or a non-ASCII character into one it has instead of refusing
the call.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from tunix_agentic.agent.chat import (
    BUILTIN_CHAT_TEMPLATE,
    ChatFormat,
    ChatTemplate,
    JinjaChatTemplate,
    TemplateError,
    tools_prompt_text,
)
from tunix_agentic.agent.tool_parser import format_tool_call
from tunix_agentic.models.tokenizer import encode_client_text
from tunix_agentic.rollout.openai_endpoint.protocol import (
    ChatCompletionRequest,
    message_key,
    note_ignored,
)
from tunix_agentic.rollout.openai_endpoint.recording import Call, Completion, Episode

_MARK = "\x00completion\x00"


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


class PromptRenderer:
    """Prompt ids of chat requests, rendered with ``template``."""

    def __init__(self, template: JinjaChatTemplate):
        self.template = template
        self.tokenizer = template.tokenizer

    def render(self, request: ChatCompletionRequest, messages: Sequence[dict[str, Any]]) -> str:
        """``messages`` rendered with the request's tools and ``chat_template_kwargs`` (the
        built-in character template takes none: they are ignored there, logged once)."""
        messages, tools = template_messages(self.template, messages, request.template_tools)
        kwargs = request.template_kwargs
        if kwargs and self.template.source == BUILTIN_CHAT_TEMPLATE:
            note_ignored("chat_template_kwargs", "the built-in character template takes none")
            kwargs = None
        return self.template.render(
            messages, add_generation_prompt=True, tools=tools, kwargs=kwargs
        )

    def render_ids(self, request: ChatCompletionRequest) -> list[int]:
        return encode_client_text(self.tokenizer, self.render(request, request.chat_messages))

    def continuation_ids(
        self, request: ChatCompletionRequest, k: int, ended_turn: bool
    ) -> list[int]:
        """The ids the template puts after assistant message ``k`` (its end-of-turn token
        only if the completion did not end the turn) up to the next generation prompt."""
        messages = list(request.chat_messages)
        messages[k] = {**messages[k], "content": _MARK}
        text = self.render(request, messages)
        after = text.split(_MARK, 1)[-1]
        end = after.find(self.template.turn_end)
        if _MARK not in text or end < 0:
            raise TemplateError("the chat template lost the assistant turn or its end token")
        return encode_client_text(
            self.tokenizer, after[end + len(self.template.turn_end) if ended_turn else end :]
        )

    def prompt(self, request: ChatCompletionRequest, episode: Episode | None) -> Prompt:
        """Prompt ids: the continuation of the longest recorded call whose messages and
        returned reply begin the request's messages, else the whole conversation rendered."""
        keys = [message_key(m) for m in request.chat_messages]
        best: tuple[int, int, Call, Completion] | None = None
        for i, call in enumerate(episode.calls if episode else ()):
            k = len(call.message_keys)
            if call.cut or k >= len(keys) or keys[:k] != call.message_keys:
                continue
            for j, c in enumerate(call.completions):
                if c.message_key == keys[k] and (best is None or k > len(best[2].message_keys)):
                    best = (i, j, call, c)
        if best is None:
            return Prompt(self.render_ids(request))
        i, j, call, c = best
        rest = self.continuation_ids(request, len(call.message_keys), c.ended_turn)
        return Prompt(call.prompt_ids + c.token_ids + rest, extends=(i, j))
