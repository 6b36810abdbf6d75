"""Parse the agent's text into an :class:`tunix_agentic.envs.base.Action`.

Malformed tool calls are reported in ``Action.parse_errors`` (the environment
turns each into an error observation); parsing never raises on model output.
Parsers are looked up by name so a config string selects the format.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from tunix_agentic.envs.base import Action, ToolCall

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_TURN_END = ("<|im_end|>", "<|endoftext|>")


def parse_qwen3(text: str) -> Action:
    """Qwen3 format: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, ``<answer>..</answer>``.

    Whitespace around the JSON is ignored, so this reads both what Qwen3's own chat template
    renders for an assistant's ``tool_calls`` (``<tool_call>\n{...}\n</tool_call>``) and the
    compact form of :func:`format_tool_call` (the built-in model's, and the one the
    system-prompt tools fallback describes); ``arguments`` may be a JSON string.
    """
    body = text
    for end in _TURN_END:
        body = body.replace(end, "")
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _TOOL_CALL.finditer(body):
        call, error = _parse_call(match.group(1).strip())
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    remainder = _TOOL_CALL.sub("", body)
    if "<tool_call>" in remainder:
        errors.append("unterminated <tool_call>: expected </tool_call>")
    elif "</tool_call>" in remainder:
        errors.append("</tool_call> without a matching <tool_call>")
    answer_match = _ANSWER.search(remainder)
    answer = answer_match.group(1).strip() if answer_match else None
    return Action(text=text, tool_calls=tuple(calls), answer=answer, parse_errors=tuple(errors))


def _parse_call(raw: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        # Some of json's messages end in "at" ("Unterminated string starting at"): one "at".
        what = exc.msg.removesuffix(" at")
        return None, f"tool call is not valid JSON ({what} at column {exc.colno})"
    if not isinstance(obj, dict):
        return None, "tool call must be a JSON object with 'name' and 'arguments'"
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return None, "tool call needs a non-empty string 'name'"
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit arguments as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"arguments of tool '{name}' are a string that is not JSON"
    if not isinstance(args, dict):
        return None, f"arguments of tool '{name}' must be a JSON object"
    return ToolCall(name=name, arguments=args), ""


PARSERS: dict[str, Callable[[str], Action]] = {"qwen3": parse_qwen3}


def register_parser(name: str, parse: Callable[[str], Action]) -> None:
    """Make ``parse`` (the model's text -> :class:`Action`; it reports a malformed call in
    ``Action.parse_errors`` and never raises on model output) the tool-call format
    ``agent.parser: name``. Register it in a module the run imports (``env.import``), so
    rollout nodes, which import the same modules, know it too. A name already taken by
    another parser is a ValueError."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a parser's name must be a non-empty string, got {name!r}")
    if not callable(parse):
        raise TypeError(f"parser {name!r} must be callable (text -> Action), got {parse!r}")
    if PARSERS.get(name, parse) is not parse:
        raise ValueError(f"tool-call parser {name!r} is already registered")
    PARSERS[name] = parse


def get_parser(name: str) -> Callable[[str], Action]:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool-call parser {name!r}; known: {sorted(PARSERS)}") from None


def format_tool_call(name: str, arguments: dict) -> str:
    """One call in the compact form ``<tool_call>{...}</tool_call>``: the built-in model's
    demonstrations, and templates that do not render ``tool_calls`` (the form
    :data:`~tunix_agentic.agent.chat.DEFAULT_TOOLS_PROMPT` describes). A template that
    renders them (Qwen3's) writes demonstrations its own way:
    :meth:`~tunix_agentic.agent.chat.JinjaChatTemplate.assistant_message_text`."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
