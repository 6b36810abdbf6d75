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
  model generated, which is what the engine saw.

An observation is a list of messages (``{"role": "tool" | "user", "content": ...}``);
a plain string is one user message.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from collections.abc import Sequence
from typing import Any

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

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return self.tokenizer.stop_ids


class TemplateError(ValueError):
    """A chat template this framing cannot use."""


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **kw: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, **kw)


def _raise(message: str) -> None:
    raise TemplateError(f"the chat template refused: {message}")


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
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: str,
        *,
        system: str | None = None,
        kwargs: dict[str, Any] | None = None,
    ):
        self.tokenizer = tokenizer
        self.source = source
        self.system = system
        self.kwargs = dict(kwargs or {})
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
    ) -> str:
        return self._template.render(
            messages=list(messages),
            tools=tools or None,
            add_generation_prompt=add_generation_prompt,
            bos_token=getattr(self.tokenizer, "bos_token", None) or "",
            eos_token=getattr(self.tokenizer, "eos_token", None) or "",
            **self.kwargs,
        )

    def prompt_ids(self, user: str, tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.tokenizer.encode(
            self.render(self._head(user), add_generation_prompt=True, tools=tools)
        )

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

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.turn_end_id, *self.tokenizer.stop_ids)))


ChatFormat = ChatTemplate | JinjaChatTemplate


def make_chat_template(
    tokenizer: Tokenizer, *, system: str | None = None, kwargs: dict[str, Any] | None = None
):
    """The tokenizer's own chat template (a Hugging Face tokenizer), else the built-in
    framing (the character tokenizer, which has none). A Hugging Face tokenizer without a
    template raises :class:`TemplateError`: the built-in markers are not its tokens."""
    if not hasattr(tokenizer, "chat_template"):
        return ChatTemplate(tokenizer, system=system)
    if not tokenizer.chat_template:
        raise TemplateError(
            f"the tokenizer at {getattr(tokenizer, 'path', '?')} has no chat template "
            "(tokenizer_config.json chat_template or chat_template.jinja)"
        )
    return JinjaChatTemplate(tokenizer, tokenizer.chat_template, system=system, kwargs=kwargs)
