"""The OpenAI chat-completions request, checked field by field (host-side, no JAX).

:func:`parse_chat_request` turns a request body into a :class:`ChatRequest` or raises
:class:`RequestError` naming the field (``messages[2].tool_calls[0].function.arguments``)
and the HTTP status to answer. Messages come out normalised for the chat template:
``content`` a string (text parts joined, ``None`` -> ``""``), the ``developer`` role as
``system``, assistant ``tool_calls`` in OpenAI's shape with ``arguments`` a JSON string,
``reasoning_content`` kept for templates that read it.

Enforced by constrained decoding (:meth:`ChatRequest.constraint`: a grammar the engine
applies token by token): ``tool_choice`` "required" (at least one call to an offered
tool) or a named function (a call to that tool), in the ``qwen3`` tool-call format, and
``response_format`` ``json_object`` / ``json_schema``. Accepted with a value that changes
nothing: ``frequency_penalty`` / ``presence_penalty`` 0, ``logit_bias`` {},
``top_logprobs`` 0, ``response_format`` text, and ``reasoning_effort`` (any of OpenAI's
values: a documented no-op, the served models have no reasoning switch the endpoint
drives). Refused, naming why: non-zero penalties (the engine samples without them),
``top_logprobs`` > 0 (the engine returns the sampled token's logprob only), and any field
not named here. :func:`message_key` is what two messages must share to count as
the same turn (role, content and the tool calls' names and arguments; ids ignored).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, Literal

from tunix_agentic.inference.constraint import Constraint
from tunix_agentic.serving.http import JSONDepthError, load_json

ROLES = ("system", "developer", "user", "assistant", "tool")
ToolChoice = Literal["none", "auto", "required"]
MAX_STOPS = 4
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high")
# The Qwen3 tool-call form (tool_parser.format_tool_call), as a grammar's fixed pieces.
_CALL_BEGIN = '<tool_call>\n{"name": "'
_CALL_ARGUMENTS = '", "arguments": '
_CALL_END = "}\n</tool_call>"

# Fields a client may send only with a value that changes nothing here, and why another
# value is refused.
_INERT: dict[str, tuple[tuple[Any, ...], str]] = {
    "frequency_penalty": ((None, 0), "only 0 is supported: the engine samples without penalties"),
    "presence_penalty": ((None, 0), "only 0 is supported: the engine samples without penalties"),
    "logit_bias": ((None, {}), "is not supported: the engine samples without biases"),
    "top_logprobs": (
        (None, 0),
        "only 0 is supported: the engine returns the sampled token's logprob, not the most "
        "likely alternatives (send logprobs=true alone)",
    ),
}
_IGNORED = {"model", "user", "parallel_tool_calls", "metadata", "store", "service_tier"}
_KNOWN = {
    "messages",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "logprobs",
    "reasoning_effort",
    "response_format",
    *_INERT,
    *_IGNORED,
}
# Message keys the official client may echo back from a reply (dropped when empty).
_ECHOED = {"refusal", "annotations", "audio", "function_call"}


class RequestError(ValueError):
    """A request this endpoint refuses: ``status`` (4xx) and a message naming the field."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked chat-completions request. ``max_tokens`` None: the server's default.
    ``stop``: strings that end a completion (cut after the token completing the first);
    ``include_usage``: a streamed reply ends with a usage chunk."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: ToolChoice = "auto"
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    n: int = 1
    seed: int | None = None
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    forced_tool: str | None = None  # tool_choice names this function (tool_choice "required")
    response_format: Constraint | None = None  # JSON output

    @property
    def constrained(self) -> bool:
        """Whether a grammar masks this call's sampling (:meth:`constraint`)."""
        return self.tool_choice == "required" or self.response_format is not None

    def constraint(self, parser: str) -> Constraint | None:
        """The grammar the engine must enforce (None: sampling is free): a forced tool call
        (``tool_choice`` required or named) in ``parser``'s tool-call form, else the JSON
        ``response_format``. RequestError for a parser whose form has no grammar here."""
        if self.tool_choice != "required":
            return self.response_format
        if parser != "qwen3":
            raise _fail(
                "tool_choice",
                f"a forced tool call is enforced in the qwen3 tool-call form only; this "
                f"endpoint parses {parser!r}",
            )
        tools = [t for t in self.tools if self.forced_tool in (None, t["function"]["name"])]
        return Constraint("structural_tag", json.dumps(_forced_calls(tools, self.forced_tool)))

    @property
    def parse_tools(self) -> bool:
        """Whether tool calls are parsed out of the reply (not with ``tool_choice="none"``)."""
        return self.tool_choice != "none"

    @property
    def offered(self) -> frozenset[str] | None:
        """The tool names a returned call may name (None: no call is parsed)."""
        if not self.parse_tools:
            return None
        return frozenset(t["function"]["name"] for t in self.tools)

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas the template lists (none with ``tool_choice="none"``)."""
        return list(self.tools) if self.tools and self.parse_tools else None


def _fail(where: str, message: str) -> RequestError:
    return RequestError(f"{where}: {message}")


def _number(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(key, f"must be a finite number, got {value!r:.50}")
    if not lo <= value <= hi:
        raise _fail(key, f"must be in [{lo:g}, {hi:g}], got {value}")
    return float(value)


def _integer(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, got {value!r:.50}")
    if not lo <= value <= hi:
        raise _fail(key, f"must be in [{lo}, {hi}], got {value}")
    return value


def _content(raw: Any, where: str, *, nullable: bool) -> str:
    if raw is None and nullable:
        return ""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        texts = []
        for j, part in enumerate(raw):
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise _fail(f"{where}[{j}]", "only parts of type 'text' are supported")
            if not isinstance(part.get("text"), str):
                raise _fail(f"{where}[{j}].text", "must be a string")
            texts.append(part["text"])
        return "".join(texts)
    kinds = "a string or a list of text parts" + (" or null" if nullable else "")
    raise _fail(where, f"must be {kinds}, got {type(raw).__name__}")


def _tool_calls(raw: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _fail(where, f"must be a list, got {type(raw).__name__}")
    calls = []
    for j, call in enumerate(raw):
        at = f"{where}[{j}]"
        if not isinstance(call, Mapping):
            raise _fail(at, "must be an object")
        if call.get("type", "function") != "function":
            raise _fail(f"{at}.type", f"must be 'function', got {call.get('type')!r:.50}")
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            raise _fail(f"{at}.function", "must be an object with 'name' and 'arguments'")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{at}.function.name", "must be a non-empty string")
        args = fn.get("arguments", "{}")
        try:
            parsed = load_json(args, f"{at}.function.arguments") if isinstance(args, str) else None
        except JSONDepthError as exc:
            raise RequestError(str(exc)) from None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise _fail(f"{at}.function.arguments", "must be a string holding a JSON object")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise _fail(f"{at}.id", "must be a string")
        calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
        )
    return calls


def _message(raw: Any, i: int) -> dict[str, Any]:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise _fail(where, f"must be an object, got {type(raw).__name__}")
    role = raw.get("role")
    if role not in ROLES:
        raise _fail(f"{where}.role", f"must be one of {', '.join(ROLES)}, got {role!r:.50}")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    out["content"] = _content(raw.get("content"), f"{where}.content", nullable=role == "assistant")
    for key, value in raw.items():
        where_key = f"{where}.{key}"
        if key in ("role", "content"):
            continue
        if key in _ECHOED:
            if value:
                raise _fail(where_key, "is not supported")
        elif key == "tool_calls" and role == "assistant":
            if value:
                out["tool_calls"] = _tool_calls(value, where_key)
        elif key in ("name", "reasoning_content") or (key == "tool_call_id" and role == "tool"):
            if value is not None and not isinstance(value, str):
                raise _fail(where_key, "must be a string")
            if value is not None:
                out[key] = value
        else:
            raise _fail(where_key, f"is not a field of a {role} message")
    return out


def _tools(raw: Any) -> tuple[dict[str, Any], ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise _fail("tools", f"must be a list, got {type(raw).__name__}")
    for j, tool in enumerate(raw):
        at = f"tools[{j}]"
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            raise _fail(f"{at}.type", "must be 'function'")
        fn = tool.get("function")
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _fail(f"{at}.function.name", "must be a non-empty string")
        if not isinstance(fn.get("parameters", {}), Mapping):
            raise _fail(f"{at}.function.parameters", "must be a JSON schema object")
    return tuple(dict(t) for t in raw)


def _tool_choice(raw: Any, tools: tuple[dict[str, Any], ...]) -> tuple[ToolChoice, str | None]:
    """``(choice, forced tool name)``; a named function is ``("required", name)``."""
    if raw is None:
        return "auto", None
    if raw in ("none", "auto"):
        return raw, None
    if raw == "required":
        if not tools:
            raise _fail("tool_choice", "'required' needs tools")
        return "required", None
    if isinstance(raw, Mapping) and raw.get("type") == "function":
        name = (raw.get("function") or {}).get("name")
        known = [t["function"]["name"] for t in tools]
        if name not in known:
            raise _fail("tool_choice.function.name", f"{name!r:.50} is not in tools ({known})")
        return "required", name
    raise _fail("tool_choice", "must be 'none', 'auto', 'required' or {'type': 'function', ...}")


def _arguments_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    parameters = dict(tool["function"].get("parameters") or {})
    return parameters if parameters.get("type") == "object" else {"type": "object", **parameters}


def _forced_calls(tools: list[dict[str, Any]], name: str | None) -> dict[str, Any]:
    """An xgrammar structural tag: one call to ``name``, or (None) text with at least one
    call to any of ``tools``, each call in the qwen3 form with arguments that match the
    tool's JSON schema."""
    tags = [
        {
            "type": "tag",
            "begin": _CALL_BEGIN + t["function"]["name"] + _CALL_ARGUMENTS,
            # (at most one blank in a row: else a model may pad the call with blanks
            # until its length limit)
            "content": {
                "type": "json_schema",
                "json_schema": _arguments_schema(t),
                "max_whitespace_cnt": 1,
            },
            "end": _CALL_END,
        }
        for t in tools
    ]
    if name is not None:
        return {"type": "structural_tag", "format": tags[0]}
    triggered = {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": tags}
    return {"type": "structural_tag", "format": {**triggered, "at_least_one": True}}


def _response_format(raw: Any) -> Constraint | None:
    """OpenAI's ``response_format``: ``text`` (None), ``json_object`` or ``json_schema``
    (``{"json_schema": {"name": ..., "schema": {...}}}``)."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, Mapping) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    if kind != "json_schema":
        raise _fail("response_format.type", "must be 'text', 'json_object' or 'json_schema'")
    spec = raw.get("json_schema")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("schema", {}), Mapping):
        raise _fail("response_format.json_schema.schema", "must be a JSON schema object")
    return Constraint("json_schema", json.dumps(spec.get("schema") or {"type": "object"}))


def _inert(body: Mapping[str, Any]) -> None:
    for key, (allowed, why) in _INERT.items():
        value = body.get(key)
        # (a bool is refused even where it equals an allowed 0)
        if key in body and (isinstance(value, bool) or value not in allowed):
            raise _fail(key, f"{why}, got {value!r:.50}")


def _flag(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise _fail(key, f"must be a boolean, got {value!r:.50}")
    return bool(value)


def _stream_options(raw: Any) -> bool:
    """``include_usage`` of ``stream_options`` (accepted with or without streaming)."""
    if raw is None:
        return False
    if not isinstance(raw, Mapping):
        raise _fail("stream_options", f"must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - {"include_usage", "include_obfuscation"})
    if unknown:
        raise _fail(f"stream_options.{unknown[0]}", "is not supported")
    for key in ("include_usage", "include_obfuscation"):
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise _fail(f"stream_options.{key}", "must be a boolean")
    return bool(raw.get("include_usage"))


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None or raw == "":
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise _fail("stop", "must be a string or a list of non-empty strings")
    if len(stops) > MAX_STOPS:
        raise _fail("stop", f"holds {len(stops)} strings, at most {MAX_STOPS} are supported")
    return tuple(dict.fromkeys(stops))


def _reasoning_effort(raw: Any) -> None:
    """Checked and then ignored: see the module docstring."""
    if raw is not None and raw not in REASONING_EFFORTS:
        raise _fail("reasoning_effort", f"must be one of {', '.join(REASONING_EFFORTS)}")


def parse_chat_request(body: Any, *, max_n: int, max_messages: int) -> ChatRequest:
    """A :class:`ChatRequest` from a JSON body, or :class:`RequestError` naming the field
    (what is accepted and refused: the module docstring)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise _fail(unknown[0], "is not a supported field of /v1/chat/completions")
    _inert(body)
    _reasoning_effort(body.get("reasoning_effort"))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _fail("messages", "must be a non-empty list of messages")
    if len(raw) > max_messages:
        raise _fail("messages", f"holds {len(raw)} messages, over the limit of {max_messages}")
    messages = tuple(_message(m, i) for i, m in enumerate(raw))
    tools = _tools(body.get("tools"))
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _fail("model", "must be a string")
    max_tokens = _integer(body, "max_completion_tokens", 1, 2**31 - 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1, 2**31 - 1)
    tool_choice, forced = _tool_choice(body.get("tool_choice"), tools)
    return ChatRequest(
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        forced_tool=forced,
        response_format=_response_format(body.get("response_format")),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=_integer(body, "top_k", 0, 2**31 - 1) or 0,
        max_tokens=max_tokens,
        n=_integer(body, "n", 1, max_n) or 1,
        seed=_integer(body, "seed", -(2**63), 2**63 - 1 - max_n),
        model=model,
        stream=_flag(body, "stream"),
        include_usage=_stream_options(body.get("stream_options")),
        stop=_stop(body.get("stop")),
        logprobs=_flag(body, "logprobs"),
    )


def message_key(message: Mapping[str, Any]) -> str:
    """What makes two messages the same turn: role, content, tool calls' names and
    arguments (ids and whitespace inside the arguments' JSON ignored)."""
    calls = [
        [c["function"]["name"], json.loads(c["function"]["arguments"])]
        for c in message.get("tool_calls") or ()
    ]
    return json.dumps([message["role"], message.get("content") or "", calls], sort_keys=True)
