"""Chat framing, in token ids: the prompt once, then each observation as a delta.

The prompt and every observation are framed once, turned into ids once, and
appended to the episode's token history; the model's own tokens are appended
as the engine returned them. Nothing is ever re-templated, so the ids the
learner trains on are the ids the engine saw and produced.

Two templates with one interface (``prompt_ids``, ``observation_ids``,
``assistant_ids``, ``stop_ids``):

* :class:`ChatTemplate`: the built-in Qwen3-style framing of the character model.
* :class:`JinjaChatTemplate`: the Jinja chat template a Hugging Face model
  ships (``tokenizer_config.json``), rendered with ``jinja2`` the way
  transformers renders it, tool schemas in the prompt included. An
  observation's ids are the *delta* the template appends after an assistant
  turn (everything after that turn's end token), rendered and tokenised once.
  Templates that rewrite earlier turns (Qwen3 drops the ``<think>`` blocks of
  earlier assistant turns) are never re-rendered: the history keeps what the
  model generated, which is what the engine saw (the ``as_rendered`` context rule
  shows the model its earlier turns as a re-rendering deployment would instead:
  :attr:`JinjaChatTemplate.generation_only_ids`).

Tools: a template that renders ``tools`` lists the environment's schemas its own way.
A template that drops them (rendering with and without ``tools`` gives the same text,
e.g. SmolLM2's) gets them in the system prompt instead, in the documented form
:data:`DEFAULT_TOOLS_PROMPT` (``tools_prompt`` replaces it), or is refused
(``tools_fallback="error"``); the built-in character template leaves them out on purpose
(its model learns its one tool from demonstrations). Demonstrations' tool calls are rendered by the template
itself (an assistant message with ``tool_calls``: Qwen3 writes
``<tool_call>\n{...}\n</tool_call>``); a template that drops ``tool_calls`` gets
:func:`~tunix_agentic.agent.tool_parser.format_tool_call`'s form, the one the fallback
prompt describes. The ``qwen3`` parser reads both.

An observation is a list of messages (``{"role": "tool" | "user", "content": ...}``);
a plain string is one user message.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from tunix_agentic.agent.tool_parser import format_tool_call
from tunix_agentic.models.tokenizer import Tokenizer

Messages = Sequence[dict[str, Any]]

# The built-in framing as a Jinja chat template (what save_char_tokenizer ships, so an
# exported built-in model renders its turns the same way in transformers). Tools are not
# listed in the prompt: the built-in model learns its one tool from demonstrations.
BUILTIN_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}"
    "{{ '<|im_start|>user\\n' }}{% endif -%}"
    "{{ '<tool_response>' + (m.content | string) + '</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}"
    "{{ '<|im_end|>\\n' }}{% endif -%}"
    "{%- else -%}"
    "{{ '<|im_start|>' + m.role + '\\n' + (m.content | string) + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)


def as_messages(observation: str | Messages) -> list[dict[str, Any]]:
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return [dict(m) for m in observation]


@dataclasses.dataclass(frozen=True)
class ChatTemplate:
    """Frames user prompts and tool observations around the assistant's turns.

    An assistant turn ends with ``<|im_end|>``, which is a stop token and is kept
    in the generated ids so the model learns to end its turn.
    """

    tokenizer: Tokenizer
    system: str | None = None

    def prompt_text(self, user: str) -> str:
        head = f"<|im_start|>system\n{self.system}<|im_end|>\n" if self.system else ""
        return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"

    def observation_text(self, observation: str | Messages) -> str:
        messages = as_messages(observation)
        body = "".join(
            f"<tool_response>{m['content']}</tool_response>"
            if m["role"] == "tool"
            else str(m["content"])
            for m in messages
        )
        return f"\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"

    def prompt_ids(self, user: str, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The first prompt's ids (``tools`` is not listed: see BUILTIN_CHAT_TEMPLATE)."""
        return self.tokenizer.encode(self.prompt_text(user))

    def observation_ids(self, observation: str | Messages) -> list[int]:
        return self.tokenizer.encode(self.observation_text(observation))

    def assistant_ids(self, text: str) -> list[int]:
        """An assistant turn's ids as the model should generate them (demonstrations)."""
        return self.tokenizer.encode(text) + [self.tokenizer.token_id("<|im_end|>")]

    def assistant_message_ids(self, message: dict[str, Any]) -> list[int]:
        """An assistant message (``content``, ``tool_calls``) as the model should generate
        it: the text, then each call in :func:`format_tool_call`'s form."""
        return self.assistant_ids(_with_calls_appended(message))

    @property
    def generation_only_ids(self) -> tuple[int, ...]:
        """Nothing of the built-in generation prompt is dropped when a turn is re-rendered."""
        return ()

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.tokenizer.stop_ids


class TemplateError(ValueError):
    """A chat template this framing cannot use."""


def _call_parts(call: dict[str, Any]) -> tuple[str, Any]:
    """``{"name", "arguments"}`` or the OpenAI form ``{"function": {"name", "arguments"}}``."""
    fn = call.get("function", call)
    return fn["name"], fn.get("arguments", {})


def _openai_call(name: str, arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def _with_calls_appended(message: dict[str, Any]) -> str:
    text = str(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        text += format_tool_call(*_call_parts(call))
    return text


# The system-prompt text that lists the tools for a template that drops ``tools``.
# ``{tools}`` is replaced by the schemas, one JSON object a line; the call format is the
# one :func:`format_tool_call` writes and the ``qwen3`` parser reads.
DEFAULT_TOOLS_PROMPT = (
    "You can use the tools below. Their JSON schemas, one per line:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a tool, write a JSON object with its name and arguments between "
    "<tool_call> and </tool_call>, one call per pair of tags:\n"
    '<tool_call>{"name": "<tool name>", "arguments": {<argument name>: <value>}}</tool_call>'
)
# What a template that drops the tool schemas does with them (agent.tools_fallback; see
# JinjaChatTemplate).
ToolsFallback = Literal["auto", "system", "error", "drop"]
TOOLS_FALLBACKS: tuple[ToolsFallback, ...] = get_args(ToolsFallback)


def tools_prompt_text(tools: list[dict[str, Any]], prompt: str | None = None) -> str:
    """``prompt`` (default :data:`DEFAULT_TOOLS_PROMPT`) with ``{tools}`` replaced by the
    schemas, one JSON object a line."""
    schemas = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (prompt or DEFAULT_TOOLS_PROMPT).replace("{tools}", schemas)


# A tool and a call to it, rendered once to learn whether a template shows tools and calls.
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "probe_tool",
        "description": "Checks whether the template lists tools.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}},
    },
}
_PROBE_CALL = {"type": "function", "function": {"name": "probe_tool", "arguments": {"x": "y"}}}


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **kw: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, **kw)


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused: {message}")


# The names a render binds itself (its arguments and the environment's globals, Jinja's
# own included): extra render kwargs may not rebind them.
RENDER_NAMES = frozenset(
    {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"}
    | {"raise_exception", "strftime_now", "range", "dict", "lipsum", "cycler", "joiner"}
    | {"namespace"}
)


@functools.cache
def _compile(source: str):
    from jinja2 import ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env.from_string(source)


# Stand-ins for content the delta never includes (found in the render, then cut away).
_USER, _ASSISTANT = "\x00user-turn\x00", "\x00assistant-turn\x00"


class JinjaChatTemplate:
    """A Hugging Face chat template over a tokenizer (see the module docstring).

    ``kwargs`` go to every render (e.g. ``{"enable_thinking": False}`` for Qwen3).
    ``tools_fallback`` says what happens when the template drops ``tools`` (rendering with
    and without them gives the same text): ``"system"`` lists them in the system prompt
    as ``tools_prompt`` (default :data:`DEFAULT_TOOLS_PROMPT`) writes them, ``"error"``
    raises :class:`TemplateError` here, ``"drop"`` leaves them out; ``"auto"`` is
    ``"drop"`` for the built-in character template (its model learns its tool from
    demonstrations) and ``"system"`` for any other.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: str,
        *,
        system: str | None = None,
        kwargs: dict[str, Any] | None = None,
        tools_fallback: ToolsFallback = "auto",
        tools_prompt: str | None = None,
    ):
        if tools_fallback not in TOOLS_FALLBACKS:
            raise ValueError(
                f"tools_fallback must be one of {TOOLS_FALLBACKS}, got {tools_fallback!r}"
            )
        if tools_prompt is not None and "{tools}" not in tools_prompt:
            raise ValueError("tools_prompt must contain '{tools}' (where the schemas go)")
        self.tokenizer = tokenizer
        self.source = source
        self.system = system
        self.kwargs = dict(kwargs or {})
        self.tools_prompt = tools_prompt
        self._template = _compile(source)
        # The token that ends an assistant turn: the first stop token after its content.
        text = self.render([*self._head(), {"role": "assistant", "content": _ASSISTANT}])
        after = text.split(_ASSISTANT, 1)[-1]
        ends = [(after.find(s), s) for s in self._stop_strings() if s in after]
        if _ASSISTANT not in text or not ends:
            raise TemplateError(
                "the chat template does not end an assistant turn with a stop token "
                f"({', '.join(map(repr, self._stop_strings()))})"
            )
        self.turn_end = min(ends)[1]
        self.turn_end_id = tokenizer.token_id(self.turn_end)
        head = self._head()
        bare = self.render(head, add_generation_prompt=True)
        #: Whether the template lists ``tools`` itself (else see ``tools_fallback``).
        self.renders_tools = self._differs(
            lambda: self.render(head, add_generation_prompt=True, tools=[_PROBE_TOOL]),
            lambda: bare,
            if_refused=True,  # a template that refuses tools this way: left to its render
        )
        if tools_fallback == "auto":
            tools_fallback = "drop" if source == BUILTIN_CHAT_TEMPLATE else "system"
        if not self.renders_tools and tools_fallback == "error":
            raise TemplateError(
                "the chat template drops the tool schemas (it renders the same prompt with "
                "and without `tools`), so the model would never see its tools; set "
                "agent.tools_fallback=system to list them in the system prompt"
            )
        self.tools_fallback = tools_fallback
        turn = {"role": "assistant", "content": ""}
        #: Whether the template renders an assistant message's ``tool_calls``.
        self.renders_tool_calls = self._differs(
            lambda: self.render([*head, {**turn, "tool_calls": [_PROBE_CALL]}]),
            lambda: self.render([*head, turn]),
            if_refused=False,
        )
        try:
            extra = self._generation_only_text()
        except TemplateError:  # e.g. a template that insists on turns it was not given
            extra = ""
        self.generation_only_ids = tuple(tokenizer.encode(extra))

    @staticmethod
    def _differs(render_a, render_b, *, if_refused: bool) -> bool:
        """Whether two probe renders differ (``if_refused`` when the template raises)."""
        try:
            return render_a() != render_b()
        except TemplateError:
            return if_refused

    def _generation_only_text(self) -> str:
        """What the generation prompt adds that the opening of the same assistant turn, once
        it is an earlier turn, no longer has (Qwen3 with ``enable_thinking=False``: the
        empty ``<think>\\n\\n</think>\\n\\n``); usually nothing."""
        head = self._head()
        before = self.render(head)
        prompt = self.render(head, add_generation_prompt=True)
        later = self.render(
            [*head, {"role": "assistant", "content": _ASSISTANT}, {"role": "user", "content": "x"}]
        )
        if not (prompt.startswith(before) and later.startswith(before) and _ASSISTANT in later):
            return ""
        opening = prompt[len(before) :]
        earlier = later[len(before) :].split(_ASSISTANT, 1)[0]
        if opening.startswith(earlier) and len(opening) > len(earlier):
            return opening[len(earlier) :]
        return ""

    def _stop_strings(self) -> list[str]:
        return [self.tokenizer.decode([i]) for i in self.tokenizer.stop_ids]

    def _head(self, user: str = _USER) -> list[dict[str, Any]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, {"role": "user", "content": user}]

    def render(
        self,
        messages: Messages,
        *,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The template's text for ``messages``; ``kwargs`` (none of :data:`RENDER_NAMES`)
        over the template's own (an OpenAI client's ``chat_template_kwargs``)."""
        return self._template.render(
            messages=list(messages),
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=getattr(self.tokenizer, "bos_token", None) or "",
            eos_token=getattr(self.tokenizer, "eos_token", None) or "",
            **{**self.kwargs, **(kwargs or {})},
        )

    def prompt_text(self, user: str, tools: list[dict[str, Any]] | None = None) -> str:
        """The first prompt: the system turn (with the tools, for a template that drops
        them and ``tools_fallback="system"``), ``user``, the assistant's opening."""
        if tools and not self.renders_tools and self.tools_fallback == "system":
            listed = tools_prompt_text(tools, self.tools_prompt)
            system = f"{self.system}\n\n{listed}" if self.system else listed
            head = [{"role": "system", "content": system}, {"role": "user", "content": user}]
            return self.render(head, add_generation_prompt=True)
        return self.render(self._head(user), add_generation_prompt=True, tools=tools)

    def prompt_ids(self, user: str, tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.tokenizer.encode(self.prompt_text(user, tools))

    def observation_text(self, observation: str | Messages) -> str:
        """What the template appends after an assistant turn's end token for ``observation``,
        up to and including the next assistant turn's opening."""
        convo = [*self._head(), {"role": "assistant", "content": _ASSISTANT}]
        text = self.render([*convo, *as_messages(observation)], add_generation_prompt=True)
        after = text.split(_ASSISTANT, 1)[1]
        end = after.find(self.turn_end)
        if end < 0:
            raise TemplateError("the rendered assistant turn lost its end token")
        return after[end + len(self.turn_end) :]

    def observation_ids(self, observation: str | Messages) -> list[int]:
        return self.tokenizer.encode(self.observation_text(observation))

    def assistant_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text) + [self.turn_end_id]

    def assistant_message_text(self, message: dict[str, Any]) -> str:
        """What the model generates for an assistant ``message`` (``content`` and
        ``tool_calls``, each ``{"name", "arguments"}`` or OpenAI's ``{"function": ...}``),
        as the template renders it as the turn after the generation prompt, up to its
        end token (Qwen3: ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``).
        A template that drops ``tool_calls`` gets the content with each call in
        :func:`format_tool_call`'s form after it; so does one whose turn does not begin
        with its generation prompt."""
        calls = [_openai_call(*_call_parts(c)) for c in message.get("tool_calls") or ()]
        if calls and not self.renders_tool_calls:
            return _with_calls_appended(message)
        head = self._head()
        prompt = self.render(head, add_generation_prompt=True)
        turn = {"role": "assistant", "content": str(message.get("content") or "")}
        full = self.render([*head, {**turn, "tool_calls": calls} if calls else turn])
        end = full.find(self.turn_end, len(prompt))
        if not full.startswith(prompt) or end < 0:
            return _with_calls_appended(message)
        return full[len(prompt) : end]

    def assistant_message_ids(self, message: dict[str, Any]) -> list[int]:
        """:meth:`assistant_message_text`'s ids, then the turn's end token."""
        return self.assistant_ids(self.assistant_message_text(message))

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.turn_end_id, *self.tokenizer.stop_ids)))


ChatFormat = ChatTemplate | JinjaChatTemplate


def make_chat_template(
    tokenizer: Tokenizer,
    *,
    system: str | None = None,
    kwargs: dict[str, Any] | None = None,
    tools_fallback: ToolsFallback = "auto",
    tools_prompt: str | None = None,
):
    """The tokenizer's own chat template (a Hugging Face tokenizer), else the built-in
    framing (the character tokenizer, which has none). A Hugging Face tokenizer without a
    template raises :class:`TemplateError`: the built-in markers are not its tokens.
    ``tools_fallback``/``tools_prompt``: see :class:`JinjaChatTemplate`."""
    if not hasattr(tokenizer, "chat_template"):
        return ChatTemplate(tokenizer, system=system)
    if not tokenizer.chat_template:
        raise TemplateError(
            f"the tokenizer at {getattr(tokenizer, 'path', '?')} has no chat template "
            "(tokenizer_config.json chat_template or chat_template.jinja)"
        )
    return JinjaChatTemplate(
        tokenizer,
        tokenizer.chat_template,
        system=system,
        kwargs=kwargs,
        tools_fallback=tools_fallback,
        tools_prompt=tools_prompt,
    )
