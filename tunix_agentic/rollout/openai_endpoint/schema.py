"""The OpenAI chat-completions request, checked by pydantic models (host-side, no JAX).

:func:`parse_chat_request` turns a request body into a :class:`ChatRequest` or raises
:class:`RequestError` naming the field (``messages[2].tool_calls[0].function.arguments``;
:mod:`~tunix_agentic.serving.validation` words it) and the HTTP status to answer. Messages
come out normalised for the chat template: ``content`` a string (text parts joined,
``None`` -> ``""``), the ``developer`` role as ``system``, assistant ``tool_calls`` in
OpenAI's shape with ``arguments`` a JSON string, ``reasoning_content`` kept for templates
that read it.

Enforced by constrained decoding (:meth:`ChatRequest.constraint`: a grammar the engine
applies token by token): ``tool_choice`` "required" (at least one call to an offered
tool) or a named function (a call to that tool), in the ``qwen3`` tool-call format, and
``response_format`` ``json_object`` / ``json_schema`` (:func:`json_constraint`, which the
Responses API's ``text.format`` uses too). ``chat_template_kwargs`` (a JSON object of at
most 32 names, 16 KiB of JSON; none the endpoint binds itself, such as ``messages``) goes
to the chat template's rendering over the run's own: ``{"enable_thinking": false}`` for
Qwen3 (the built-in character template takes none: ignored there).

As vLLM and SGLang do, a field this endpoint does not know is accepted and ignored, and
so are the fields that change nothing it returns: ``user``, ``metadata``,
``safety_identifier``, ``store``, ``service_tier``, ``prompt_cache_key``,
``prompt_cache_retention``, ``prediction`` (a latency hint), ``parallel_tool_calls``,
``reasoning_effort`` and ``verbosity`` (any of OpenAI's values: the served policy has no
switch the endpoint drives). Each ignored name is logged once per process
(:func:`note_ignored`). Accepted only with the value that changes nothing, and else
refused with a 400 naming the field and why: ``frequency_penalty`` / ``presence_penalty``
0 (the engine samples without penalties), ``logit_bias`` {}, ``top_logprobs`` 0 (the
engine returns the sampled token's logprob only), ``modalities`` ["text"], ``audio`` (none: replies are text), ``functions`` [] /
``function_call`` "none" or "auto" (send ``tools`` / ``tool_choice``),
``web_search_options`` {}, and vLLM's and SGLang's own fields that would change the result
(:class:`EngineExtras`: ``min_p`` 0, ``repetition_penalty`` 1, ``min_tokens`` 0,
``best_of`` 1, ``stop_token_ids`` [], ``guided_json`` and the other ``guided_*`` (none:
send ``response_format``), ``chat_template`` (none), ``add_generation_prompt`` true,
...). Checked fields keep their checks: a value of the wrong type or out of range is a
400 naming it; ``model`` is checked by the endpoint (a name it does not serve: 404,
:mod:`~tunix_agentic.rollout.openai_endpoint.api`). :func:`message_key` is what two messages must share to count as the same
turn (role, content and the tool calls' names and arguments; ids ignored).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Collection, Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from tunix_agentic.agent.chat import RENDER_NAMES
from tunix_agentic.inference.constraint import Constraint
from tunix_agentic.inference.params import SEED_MAX, SEED_MIN
from tunix_agentic.serving.http import JSONDepthError, load_json
from tunix_agentic.serving.validation import NonEmpty, Strict, inert, invalid, validate

ToolChoice = Literal["none", "auto", "required"]
MAX_STOPS = 4
MAX_TEMPLATE_KWARGS = 32  # keys of chat_template_kwargs
MAX_TEMPLATE_KWARGS_BYTES = 16 << 10  # its JSON
MAX_LOGGED_FIELDS = 256  # ignored field names logged per process (then no more)
# The Qwen3 tool-call form (tool_parser.format_tool_call), as a grammar's fixed pieces.
_CALL_BEGIN = '<tool_call>\n{"name": "'
_CALL_ARGUMENTS = '", "arguments": '
_CALL_END = "}\n</tool_call>"
_NO_PENALTIES = "only 0 is supported: the engine samples without penalties"
_ONE_LOGPROB = (
    "only 0 is supported: the engine returns the sampled token's logprob, not the most likely "
    "alternatives (send logprobs=true alone)"
)
_GUIDED = "is not supported: send response_format (json_object or json_schema)"
_OWN_PROMPT = "is not supported: the policy's chat template renders every call as it is"
_STOP_CUT = "is not supported: the content ends before the stop string"
_NO_PROCESSORS = "is not supported: the engine samples without logits processors"
# Accepted and ignored (logged once per process), and why.
_IGNORED = {
    "user": "a label",
    "metadata": "a label",
    "safety_identifier": "a label",
    "store": "nothing is stored",
    "service_tier": "one tier",
    "prompt_cache_key": "a cache hint (the engine caches prefixes by itself)",
    "prompt_cache_retention": "a cache hint (the engine caches prefixes by itself)",
    "prediction": "a latency hint: the reply is the model's own either way",
    "parallel_tool_calls": "every call the reply holds is returned",
    "reasoning_effort": "the served policy has no reasoning switch the endpoint drives",
    "reasoning": "the served policy has no reasoning switch the endpoint drives",
    "verbosity": "the served policy has no verbosity switch",
}
_log = logging.getLogger(__name__)
_logged: set[str] = set()


class RequestError(ValueError):
    """A request this endpoint refuses: ``status`` (4xx), a message naming the field and,
    where OpenAI gives one, its error ``code`` (``model_not_found``)."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


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
    # Passed to the chat template's rendering over the run's own (e.g. enable_thinking).
    chat_template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)

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
        try:  # the tools' parameter schemas are bounded as a response_format's are
            return Constraint("structural_tag", json.dumps(_forced_calls(tools, self.forced_tool)))
        except ValueError as exc:
            raise _fail("tools", f"the forced call's grammar: {exc}") from None

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


def note_ignored(name: str, why: str, level: int = logging.INFO) -> None:
    """Log, once per process, that a request's field ``name`` was accepted and ignored, and
    ``why``. Past :data:`MAX_LOGGED_FIELDS` names nothing more is logged (a client that
    invents names grows neither the log nor the set of names logged)."""
    if name in _logged or len(_logged) > MAX_LOGGED_FIELDS:
        return
    _logged.add(name)
    if len(_logged) > MAX_LOGGED_FIELDS:
        _log.warning("over %d request fields ignored: no more are logged", MAX_LOGGED_FIELDS)
    else:
        _log.log(level, "request field %s ignored: %s (logged once)", repr(name)[:80], why)


def note_ignored_fields(given: Collection[str], model: type[Strict]) -> None:
    """Log (once per name, :func:`note_ignored`) the fields of ``given`` that ``model``
    does not name, and those it accepts only to ignore them."""
    known = {f.alias or name for name, f in model.model_fields.items()}
    for name in sorted(set(given) - known):
        note_ignored(name, "not a field this endpoint knows", logging.WARNING)
    for name in sorted(set(given) & _IGNORED.keys()):
        note_ignored(name, _IGNORED[name])


def _json_object(value: Any) -> Any:
    try:
        parsed = load_json(value, "the string") if isinstance(value, str) else None
    except JSONDepthError as exc:
        raise invalid(str(exc)) from None
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise invalid("must be a string holding a JSON object")
    return value


# Tool-call arguments: a string holding a JSON object.
JSONObjectText = Annotated[Any, AfterValidator(_json_object)]
# Message keys the official client may echo back from a reply: accepted when empty.
_Echoed = inert(None, False, 0, "", [], {}, why="is not supported")


class _TextPart(Strict, extra="ignore"):
    type: Literal["text"]
    text: str


class _Function(Strict, extra="ignore"):
    name: NonEmpty
    arguments: JSONObjectText = "{}"


class _ToolCall(Strict, extra="ignore"):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _Function


class _Message(Strict):
    """One chat message (``tool_calls``: an assistant's; ``tool_call_id``: a tool's)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_TextPart] | None = None  # null: an assistant's only
    name: str | None = None
    reasoning_content: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[_ToolCall] | None = None
    refusal: _Echoed = None
    annotations: _Echoed = None
    audio: _Echoed = None
    function_call: _Echoed = None

    @model_validator(mode="after")
    def _by_role(self) -> _Message:
        if self.content is None and self.role != "assistant":
            raise invalid("must be a string or a list of text parts, got None", "content")
        for key, role in (("tool_calls", "assistant"), ("tool_call_id", "tool")):
            if key in self.model_fields_set and self.role != role:
                raise invalid(f"is not a field of a {self.role} message", key)
        return self

    def chat(self) -> dict[str, Any]:
        """The message as the chat template takes it (see the module docstring)."""
        content = self.content or ""
        out: dict[str, Any] = {
            "role": "system" if self.role == "developer" else self.role,
            "content": content if isinstance(content, str) else "".join(p.text for p in content),
        }
        if self.tool_calls:
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": dict(c.function)}
                for c in self.tool_calls
            ]
        for key in ("name", "reasoning_content", "tool_call_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _tool_name(value: str) -> str:
    # The name goes into the tool-call grammar and the prompt as it is: a quote or a newline
    # in it would break both (a forced call then yields no call).
    if not _TOOL_NAME.fullmatch(value):
        raise invalid(f"must be 1-64 letters, digits, '_' or '-' (as OpenAI's), got {value!r:.80}")
    return value


ToolName = Annotated[str, AfterValidator(_tool_name)]


class _ToolFunction(Strict, extra="ignore"):
    name: ToolName
    parameters: dict[str, Any] = {}


class _Tool(Strict, extra="ignore"):
    type: Literal["function"]
    function: _ToolFunction


class _Named(Strict, extra="ignore"):
    name: str


class _NamedChoice(Strict, extra="ignore"):
    type: Literal["function"]
    function: _Named


class _JSONSchema(Strict, extra="ignore"):  # name, description, strict: not enforced
    schema_: dict[str, Any] = Field({}, alias="schema")


def json_constraint(
    kind: Literal["text", "json_object", "json_schema"], schema: dict[str, Any], where: str
) -> Constraint | None:
    """The grammar of a JSON output format (``text``: None; ``json_schema`` with ``schema``,
    an empty one any object), or RequestError naming ``where`` (the schema's field) for a
    schema past the bounds of what a grammar compile may take."""
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_object()
    try:
        return Constraint("json_schema", json.dumps(schema or {"type": "object"}))
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


class _ResponseFormat(Strict, extra="ignore"):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: _JSONSchema | None = None

    @model_validator(mode="after")
    def _spec(self) -> _ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise invalid("is required", "json_schema")
        return self

    def constraint(self) -> Constraint | None:
        """``text``: None; ``json_object`` or ``json_schema``: the grammar of its JSON."""
        schema = self.json_schema.schema_ if self.json_schema else {}
        return json_constraint(self.type, schema, "response_format.json_schema.schema")


_TEMPLATE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def _template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    # Bounded: they reach every render of the call (and its continuations).
    if len(value) > MAX_TEMPLATE_KWARGS:
        raise invalid(f"holds {len(value)} keys, over the limit of {MAX_TEMPLATE_KWARGS}")
    for name in value:
        if not _TEMPLATE_NAME.fullmatch(name):
            raise invalid(f"{name!r:.80} is not a name (letters, digits and '_', at most 64)")
        if name in RENDER_NAMES:
            raise invalid("is set by the endpoint, not by a request", name)
    size = len(json.dumps(value))
    if size > MAX_TEMPLATE_KWARGS_BYTES:
        raise invalid(f"{size} bytes of JSON, over the limit of {MAX_TEMPLATE_KWARGS_BYTES}")
    return value


TemplateKwargs = Annotated[dict[str, Any], AfterValidator(_template_kwargs)]


class EngineExtras(Strict):
    """vLLM's and SGLang's own request fields that would change the result: accepted with
    the value that changes nothing, refused naming why with any other. Their other fields
    (``skip_special_tokens``, ``priority``, ...) are unknown here: ignored."""

    min_p: inert(0, why="only 0 is supported: the engine samples without min_p") = None
    repetition_penalty: inert(1, why="only 1 is supported: the engine samples without it") = None
    min_tokens: inert(0, why="only 0 is supported: a completion may end at any token") = None
    ignore_eos: inert(False, why="is not supported: a completion ends its turn") = None
    best_of: inert(1, why="only 1 is supported (send n for several choices)") = None
    use_beam_search: inert(False, why="beam search is not supported") = None
    stop_token_ids: inert([], why="is not supported: send stop strings") = None
    bad_words: inert([], why="is not supported: the engine bans no words") = None
    include_stop_str_in_output: inert(False, why=_STOP_CUT) = None
    no_stop_trim: inert(False, why=_STOP_CUT) = None
    allowed_token_ids: inert(why=_NO_PROCESSORS) = None
    logits_processors: inert(why=_NO_PROCESSORS) = None
    custom_logit_processor: inert(why=_NO_PROCESSORS) = None
    guided_json: inert(why=_GUIDED) = None
    guided_regex: inert(why=_GUIDED) = None
    guided_choice: inert(why=_GUIDED) = None
    guided_grammar: inert(why=_GUIDED) = None
    structured_outputs: inert(why=_GUIDED) = None
    regex: inert(why=_GUIDED) = None
    ebnf: inert(why=_GUIDED) = None
    chat_template: inert(why=_OWN_PROMPT) = None
    add_generation_prompt: inert(True, why=_OWN_PROMPT) = None
    continue_final_message: inert(False, why=_OWN_PROMPT) = None
    documents: inert([], why=_OWN_PROMPT) = None
    truncate_prompt_tokens: inert(why="is not supported: a prompt is never truncated") = None
    echo: inert(False, why="is not supported: a reply holds the completion only") = None
    prompt_logprobs: inert(0, why="is not supported: logprobs are the completion's") = None
    return_tokens_as_token_ids: inert(False, why="is not supported") = None
    lora_path: inert(why="is not supported: every call samples the policy") = None


class _StreamOptions(Strict):  # include_usage is read with or without streaming
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


Tokens = Annotated[int, Field(ge=1, le=2**31 - 1)]


class NeutralFields(Strict):
    """OpenAI's request fields that change nothing the endpoint returns, on chat and
    Responses alike: accepted with any value and ignored (logged once: ``_IGNORED``)."""

    user: Any = None
    parallel_tool_calls: Any = None
    metadata: Any = None
    service_tier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    safety_identifier: Any = None


class _Chat(EngineExtras, NeutralFields, extra="ignore"):
    """A chat-completions body, its nulls dropped (null is "not given"); a field it does
    not name is ignored (:func:`note_ignored_fields` logs it)."""

    messages: Annotated[list[_Message], Field(min_length=1)]
    tools: Annotated[list[_Tool], Field(fail_fast=True)] = []  # a body may hold thousands
    tool_choice: ToolChoice | _NamedChoice = "auto"
    temperature: Annotated[float, Field(ge=0, le=2, allow_inf_nan=False)] = 1.0
    top_p: Annotated[float, Field(ge=1e-9, le=1, allow_inf_nan=False)] = 1.0
    top_k: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    n: Annotated[int, Field(ge=1)] = 1
    seed: Annotated[int, Field(ge=SEED_MIN)] | None = None
    model: str | None = None
    stream: bool = False
    stream_options: _StreamOptions = _StreamOptions()
    stop: str | Annotated[list[NonEmpty], Field(max_length=MAX_STOPS)] = ()
    logprobs: bool = False
    response_format: _ResponseFormat | None = None
    chat_template_kwargs: TemplateKwargs | None = None
    # Accepted with a value that changes nothing; another is refused saying why.
    frequency_penalty: inert(0, why=_NO_PENALTIES) = None
    presence_penalty: inert(0, why=_NO_PENALTIES) = None
    logit_bias: inert({}, why="is not supported: the engine samples without biases") = None
    top_logprobs: inert(0, why=_ONE_LOGPROB) = None
    functions: inert([], why="is not supported: send tools") = None
    function_call: inert("none", "auto", why="is not supported: send tool_choice") = None
    audio: inert(why="is not supported: replies are text") = None
    modalities: inert(["text"], why="only ['text'] is supported") = None
    web_search_options: inert({}, why="is not supported: the policy has no web search") = None
    # Checked, then ignored (_IGNORED, logged once).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    store: Any = None
    prediction: Any = None

    @field_validator("messages", mode="before")
    @classmethod
    def _few_enough(cls, messages: Any, info: ValidationInfo) -> Any:
        """Counted before they are checked (``info.context``: the server's limits)."""
        limit = info.context["max_messages"]
        if isinstance(messages, list) and len(messages) > limit:
            raise invalid(f"holds {len(messages)} messages, over the limit of {limit}")
        return messages

    @model_validator(mode="after")
    def _limits(self, info: ValidationInfo) -> _Chat:
        """The server's limits, and a tool choice the tools allow."""
        max_n = info.context["max_n"]
        if self.n > max_n:
            raise invalid(f"must be in [1, {max_n}], got {self.n}", "n")
        if self.seed is not None and self.seed > SEED_MAX - max_n:  # choice i seeds seed + i
            raise invalid(f"must be <= {SEED_MAX - max_n}, got {self.seed}", "seed")
        names = [t.function.name for t in self.tools]
        choice = self.tool_choice
        if isinstance(choice, _NamedChoice) and choice.function.name not in names:
            where = ("tool_choice", "function", "name")
            raise invalid(f"{choice.function.name!r:.50} is not in tools ({names})", where)
        if choice == "required" and not names:
            raise invalid("'required' needs tools", "tool_choice")
        return self


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


def parse_chat_request(body: Any, *, max_n: int, max_messages: int) -> ChatRequest:
    """A :class:`ChatRequest` from a JSON body, or :class:`RequestError` naming the field
    (what is accepted and refused: the module docstring)."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    given = {k: v for k, v in body.items() if v is not None}
    limits = {"max_n": max_n, "max_messages": max_messages}
    m = validate(_Chat, given, error=RequestError, context=limits)
    note_ignored_fields(given, _Chat)
    named = m.tool_choice if isinstance(m.tool_choice, _NamedChoice) else None
    stops = [m.stop] if isinstance(m.stop, str) else m.stop
    return ChatRequest(
        messages=tuple(message.chat() for message in m.messages),
        tools=tuple(dict(t) for t in given.get("tools", ())),
        tool_choice="required" if named else m.tool_choice,  # type: ignore[arg-type]
        forced_tool=named.function.name if named else None,
        response_format=m.response_format.constraint() if m.response_format else None,
        temperature=m.temperature,
        top_p=m.top_p,
        top_k=m.top_k,
        max_tokens=m.max_completion_tokens or m.max_tokens,
        n=m.n,
        seed=m.seed,
        model=m.model,
        stream=m.stream,
        include_usage=bool(m.stream_options.include_usage),
        stop=tuple(dict.fromkeys(s for s in stops if s)),
        logprobs=m.logprobs,
        chat_template_kwargs=m.chat_template_kwargs or {},
    )


def message_key(message: Mapping[str, Any]) -> str:
    """What makes two messages the same turn: role, content, tool calls' names and
    arguments (ids and whitespace inside the arguments' JSON ignored)."""
    calls = [
        [c["function"]["name"], json.loads(c["function"]["arguments"])]
        for c in message.get("tool_calls") or ()
    ]
    return json.dumps([message["role"], message.get("content") or "", calls], sort_keys=True)
