"""The endpoint's wire format: every request and reply body as a pydantic model.

Requests (:class:`ChatCompletionRequest`, :class:`ResponsesRequest`,
:class:`RewardRequest`) are checked with the project's one validation layer
(:mod:`~tunix_agentic.serving.validation`): a bad field is a :class:`RequestError` naming
its path. A field no model names is accepted and ignored (logged once, :func:`note_ignored`);
fields that would change the result are accepted only at their neutral value
(:class:`EngineExtras`). Replies are models dumped as they are sent: keys in the order
declared, the fields a model lists as ``optional`` present only when given. What each
route takes and answers: ``docs/reference/openai_routes.md``. Nothing here imports JAX.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Collection, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    Tag,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)

from tunix_agentic.agent.chat import RENDER_NAMES
from tunix_agentic.inference.constraint import Constraint
from tunix_agentic.inference.params import SEED_MAX, SEED_MIN
from tunix_agentic.rollout.openai_endpoint.errors import (
    EpisodeClosed,
    EpisodeEmpty,
    EpisodeError,
    EpisodeFull,
    EpisodeUnknown,
    TooManyOpen,
)
from tunix_agentic.rollout.openai_endpoint.grammar import forced_call_grammar, json_grammar
from tunix_agentic.serving.http import JSONDepthError, load_json
from tunix_agentic.serving.validation import NonEmpty, Strict, inert, invalid, validate

if TYPE_CHECKING:
    from tunix_agentic.rollout.openai_endpoint.recording import Episode

EPISODE_HEADER = "X-Episode-Id"
TOKEN_HEADER = "X-Episode-Token"
ToolChoice = Literal["none", "auto", "required"]
MAX_STOPS = 4
MAX_TEMPLATE_KWARGS = 32  # keys of chat_template_kwargs
MAX_TEMPLATE_KWARGS_BYTES = 16 << 10  # its JSON
MAX_LOGGED_FIELDS = 256  # ignored field names logged per process (then no more)
_NO_PENALTIES = "only 0 is supported: the engine samples without penalties"
_ONE_LOGPROB = (
    "only 0 is supported: the engine returns the sampled token's logprob, not the most likely "
    "alternatives (send logprobs=true alone)"
)
_GUIDED = "is not supported: send response_format (json_object or json_schema)"
_OWN_PROMPT = "is not supported: the policy's chat template renders every call as it is"
_STOP_CUT = "is not supported: the content ends before the stop string"
_NO_PROCESSORS = "is not supported: the engine samples without logits processors"
_STATELESS = (
    "this endpoint keeps no responses: send store=false and the whole conversation in input"
)
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


# The store's refusals as HTTP statuses: the store itself knows no HTTP.
_EPISODE_STATUS: tuple[tuple[type[EpisodeError], int], ...] = (
    (EpisodeUnknown, 404),
    (EpisodeClosed, 409),
    (EpisodeEmpty, 409),
    (EpisodeFull, 413),
    (TooManyOpen, 429),
)


def refusal(exc: EpisodeError) -> RequestError:
    """The store's refusal ``exc`` as the request error it answers (its status by type)."""
    status = next(code for kind, code in _EPISODE_STATUS if isinstance(exc, kind))
    return RequestError(str(exc), status)


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


def json_constraint(
    kind: Literal["text", "json_object", "json_schema"], schema: dict[str, Any], where: str
) -> Constraint | None:
    """The grammar of a JSON output format (:func:`~.grammar.json_grammar`), or
    RequestError naming ``where`` (the schema's field) for a schema past the bounds of what
    a grammar compile may take."""
    try:
        return json_grammar(kind, schema)
    except ValueError as exc:
        raise _fail(where, str(exc)) from None


# ----------------------------------------------------------------- shared field types
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
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _tool_name(value: str) -> str:
    # The name goes into the tool-call grammar and the prompt as it is: a quote or a newline
    # in it would break both (a forced call then yields no call).
    if not _TOOL_NAME.fullmatch(value):
        raise invalid(f"must be 1-64 letters, digits, '_' or '-' (as OpenAI's), got {value!r:.80}")
    return value


ToolName = Annotated[str, AfterValidator(_tool_name)]
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
Tokens = Annotated[int, Field(ge=1, le=2**31 - 1)]
Effort = Literal["none", "minimal", "low", "medium", "high"]


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


# ------------------------------------------------------------ POST /v1/chat/completions
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


class ChatMessage(Strict):
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
    def _by_role(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise invalid("must be a string or a list of text parts, got None", "content")
        for key, role in (("tool_calls", "assistant"), ("tool_call_id", "tool")):
            if key in self.model_fields_set and self.role != role:
                raise invalid(f"is not a field of a {self.role} message", key)
        return self

    def chat(self) -> dict[str, Any]:
        """The message as the chat template takes it: ``content`` a string (text parts
        joined, None -> ""), ``developer`` as ``system``, tool calls in OpenAI's shape."""
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


class _ToolFunction(Strict, extra="ignore"):
    name: ToolName
    parameters: dict[str, Any] = {}


class ChatTool(Strict, extra="ignore"):
    """A function tool; :meth:`schema` is the object as the client sent it (the chat
    template lists it so, its description and extra keys included)."""

    type: Literal["function"]
    function: _ToolFunction
    _given: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_given(cls, data: Any, handler: Any) -> ChatTool:
        tool = handler(data)
        tool._given = dict(data)
        return tool

    def schema(self) -> dict[str, Any]:
        return dict(self._given)


class _Named(Strict, extra="ignore"):
    name: str


class _NamedChoice(Strict, extra="ignore"):
    type: Literal["function"]
    function: _Named


class _JSONSchema(Strict, extra="ignore"):  # name, description, strict: not enforced
    schema_: dict[str, Any] = Field({}, alias="schema")


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


class _StreamOptions(Strict):  # include_usage is read with or without streaming
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ChatCompletionRequest(EngineExtras, NeutralFields, extra="ignore", frozen=True):
    """A ``/v1/chat/completions`` body, its nulls dropped (null is "not given"); a field it
    does not name is ignored (:func:`note_ignored_fields` logs it). Built by
    :func:`parse_chat_request`; the properties are what the call path reads."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    tools: Annotated[list[ChatTool], Field(fail_fast=True)] = []  # a body may hold thousands
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
    reasoning_effort: Effort | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    store: Any = None
    prediction: Any = None
    # The JSON grammar the reply must match (response_format's, or the Responses API's).
    _response_grammar: Constraint | None = PrivateAttr(None)

    @field_validator("messages", mode="before")
    @classmethod
    def _few_enough(cls, messages: Any, info: ValidationInfo) -> Any:
        """Counted before they are checked (``info.context``: the server's limits)."""
        limit = info.context["max_messages"]
        if isinstance(messages, list) and len(messages) > limit:
            raise invalid(f"holds {len(messages)} messages, over the limit of {limit}")
        return messages

    @model_validator(mode="after")
    def _limits(self, info: ValidationInfo) -> ChatCompletionRequest:
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

    def with_response_grammar(self, grammar: Constraint | None) -> ChatCompletionRequest:
        """This request with ``grammar`` as the JSON its reply must match."""
        request = self.model_copy()
        request._response_grammar = grammar
        return request

    @cached_property
    def chat_messages(self) -> tuple[dict[str, Any], ...]:
        """The messages as the chat template takes them (:meth:`ChatMessage.chat`)."""
        return tuple(message.chat() for message in self.messages)

    @cached_property
    def tool_schemas(self) -> tuple[dict[str, Any], ...]:
        """The tools as the client sent them."""
        return tuple(tool.schema() for tool in self.tools)

    @property
    def forced_tool(self) -> str | None:
        """The function ``tool_choice`` names (then the choice is "required")."""
        named = self.tool_choice
        return named.function.name if isinstance(named, _NamedChoice) else None

    @property
    def choice(self) -> ToolChoice:
        """``tool_choice``, a named function counted as "required"."""
        return "required" if isinstance(self.tool_choice, _NamedChoice) else self.tool_choice

    @property
    def completion_limit(self) -> int | None:
        """``max_completion_tokens`` or ``max_tokens`` (None: the server's default)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        """Whether a streamed reply ends with a usage chunk."""
        return bool(self.stream_options.include_usage)

    @cached_property
    def stops(self) -> tuple[str, ...]:
        """Strings that end a completion (cut after the token completing the first)."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(dict.fromkeys(s for s in stops if s))

    @property
    def template_kwargs(self) -> Mapping[str, Any]:
        """Passed to the chat template's rendering over the run's own (enable_thinking)."""
        return self.chat_template_kwargs or {}

    @property
    def response_grammar(self) -> Constraint | None:
        return self._response_grammar

    @property
    def constrained(self) -> bool:
        """Whether a grammar masks this call's sampling (:meth:`constraint`)."""
        return self.choice == "required" or self._response_grammar is not None

    def constraint(self, parser: str) -> Constraint | None:
        """The grammar the engine must enforce (None: sampling is free): a forced tool call
        (``tool_choice`` required or named) in ``parser``'s tool-call form, else the JSON
        ``response_format``. RequestError for a parser whose form has no grammar here."""
        if self.choice != "required":
            return self._response_grammar
        if parser != "qwen3":
            raise _fail(
                "tool_choice",
                f"a forced tool call is enforced in the qwen3 tool-call form only; this "
                f"endpoint parses {parser!r}",
            )
        forced = self.forced_tool
        tools = [t for t in self.tool_schemas if forced in (None, t["function"]["name"])]
        try:  # the tools' parameter schemas are bounded as a response_format's are
            return forced_call_grammar(tools, forced)
        except ValueError as exc:
            raise _fail("tools", f"the forced call's grammar: {exc}") from None

    @property
    def parse_tools(self) -> bool:
        """Whether tool calls are parsed out of the reply (not with ``tool_choice="none"``)."""
        return self.choice != "none"

    @property
    def offered(self) -> frozenset[str] | None:
        """The tool names a returned call may name (None: no call is parsed)."""
        if not self.parse_tools:
            return None
        return frozenset(t.function.name for t in self.tools)

    @property
    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tool schemas the template lists (none with ``tool_choice="none"``)."""
        return list(self.tool_schemas) if self.tools and self.parse_tools else None


def parse_chat_request(body: Any, *, max_n: int, max_messages: int) -> ChatCompletionRequest:
    """A :class:`ChatCompletionRequest` from a JSON body, or :class:`RequestError` naming
    the field."""
    if not isinstance(body, Mapping):
        raise RequestError(f"the body must be a JSON object, got {type(body).__name__}")
    given = {k: v for k, v in body.items() if v is not None}
    limits = {"max_n": max_n, "max_messages": max_messages}
    request = validate(ChatCompletionRequest, given, error=RequestError, context=limits)
    note_ignored_fields(given, ChatCompletionRequest)
    form = request.response_format
    return request.with_response_grammar(form.constraint() if form else None)


def message_key(message: Mapping[str, Any]) -> str:
    """What makes two messages the same turn: role, content, tool calls' names and
    arguments (ids and whitespace inside the arguments' JSON ignored)."""
    calls = [
        [c["function"]["name"], json.loads(c["function"]["arguments"])]
        for c in message.get("tool_calls") or ()
    ]
    return json.dumps([message["role"], message.get("content") or "", calls], sort_keys=True)


# ------------------------------------------------------------------- POST /v1/responses
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


class ResponsesInput(Strict):
    """A Responses conversation: ``instructions`` and ``input`` (a string, or items)."""

    # (a body may hold thousands of items: the first bad one is enough)
    input: Annotated[
        list[_InputItem], Field(min_length=1, fail_fast=True), BeforeValidator(_user_says)
    ]
    instructions: str | None = None

    def messages(self) -> list[dict[str, Any]]:
        """The chat messages that ``instructions`` and ``input`` mean: instructions a
        system message first; a ``function_call`` item joins the assistant message before
        it (the same reply's calls), a ``function_call_output`` is a tool message."""
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


class _FlatTool(Strict):
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
    effort: Effort | None = None


class ResponsesRequest(ResponsesInput, EngineExtras, NeutralFields, extra="ignore"):
    """A ``/v1/responses`` body, its nulls dropped (null is "not given"); a field it does
    not name is ignored (logged once). Served as the chat request it means
    (:func:`~.serving_responses.parse_responses_request`)."""

    tools: Annotated[list[_FlatTool], Field(fail_fast=True)] = []
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
    def _named_tool(self) -> ResponsesRequest:
        names = [t.name for t in self.tools]
        if isinstance(self.tool_choice, _NamedTool) and self.tool_choice.name not in names:
            name = self.tool_choice.name
            raise invalid(f"{name!r:.50} is not in tools ({names})", ("tool_choice", "name"))
        return self

    def chat_body(self) -> dict[str, Any]:
        """The chat-completions body this request means (its nulls dropped)."""
        choice = self.tool_choice
        if isinstance(choice, _NamedTool):
            choice = {"type": "function", "function": {"name": choice.name}}
        body = {
            "messages": self.messages(),
            "tools": [t.chat() for t in self.tools] or None,
            "tool_choice": choice,
            "max_tokens": self.max_output_tokens,
            **{k: getattr(self, k) for k in ("model", "temperature", "top_p", "top_k", "seed")},
        }
        return {k: v for k, v in body.items() if v is not None}

    def output_grammar(self) -> Constraint | None:
        """The grammar of ``text.format`` (None: free text); RequestError for a schema
        past the bounds."""
        form = self.text.format if self.text else None
        if form is None:
            return None
        return json_constraint(form.type, form.schema_ or {}, "text.format.schema")


# -------------------------------------------------------- POST /v1/episodes/{id}/reward
class RewardRequest(Strict):
    """The body that closes an episode (strict: the reward is a JSON number; its range, the
    run's ``rollout.reward_limit``, is checked where the limit is known)."""

    reward: float
    task_id: NonEmpty | None = None
    info: dict[str, Any] | None = None  # kept with the episode


# --------------------------------------------------------------------------- replies
class _Reply(BaseModel):
    """A reply's JSON object: keys in the order declared; a field named in ``optional``
    is sent only when given (None included)."""

    optional: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        for name in self.optional - self.model_fields_set:
            out.pop(name, None)
        return out


class FunctionCall(_Reply):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(_Reply):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(_Reply):
    """A choice's message: ``content`` None when the reply is only tool calls."""

    optional = frozenset({"tool_calls"})
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class TokenLogprob(_Reply):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[Any] = []  # the engine returns no alternatives


class ChoiceLogprobs(_Reply):
    content: list[TokenLogprob]
    refusal: None = None


class Usage(_Reply):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


FinishReason = Literal["stop", "tool_calls", "length"]


class ChatCompletionChoice(_Reply):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_Reply):
    id: str
    created: int
    model: str
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatCompletionChoice]
    usage: Usage


class FunctionDelta(_Reply):
    optional = frozenset({"name", "arguments"})
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Reply):
    """A call's first delta (``id``, ``type``, the name) or a fragment of its arguments."""

    optional = frozenset({"id", "type"})
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChoiceDelta(_Reply):
    """What a chunk adds to a choice: only the fields given."""

    optional = frozenset({"role", "content", "tool_calls"})
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Reply):
    index: int
    delta: ChoiceDelta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(_Reply):
    """One server-sent event of a streamed chat reply. ``usage``: null on every chunk when
    the stream ends with a usage chunk (no choices), absent otherwise."""

    optional = frozenset({"usage"})
    id: str
    created: int
    model: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    usage: Usage | dict[str, int] | None = None
    choices: list[ChunkChoice]


class _ErrorDetail(_Reply):
    optional = frozenset({"code"})
    message: str
    type: str
    code: str | None = None


class ErrorReply(_Reply):
    """A refused request's answer (:func:`~tunix_agentic.serving.http.json_error` sends
    it), and the last event of a chat stream whose call failed after it began."""

    error: _ErrorDetail


# ---------------------------------------------------------------------- GET /v1/models
class ModelCard(_Reply):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "tunix-agentic"
    policy_version: int | None  # the weights' version now


class ModelList(_Reply):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ------------------------------------------------------------------- /v1/episodes/{id}
class RewardReply(_Reply):
    episode_id: str
    status: Literal["closed"] = "closed"
    reward: float | None
    calls: int


class RecordedChoice(_Reply):
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    unoffered_tool_calls: int
    constrained: bool


class RecordedCall(_Reply):
    prompt_ids: list[int]
    policy_version: int | None
    cut: bool
    choices: list[RecordedChoice]


class EpisodeView(_Reply):
    """``GET /v1/episodes/{id}``: what was recorded; once closed, ``trajectory`` (the
    learner's trajectory in the rollout wire format)."""

    optional = frozenset({"trajectory"})
    episode_id: str
    status: Literal["open", "closed"]
    reward: float | None
    task_id: str | None
    info: dict[str, Any]
    calls: list[RecordedCall]
    trajectory: dict[str, Any] | None = None

    @classmethod
    def of(cls, episode: Episode, **trajectory: Any) -> EpisodeView:
        """The view of ``episode`` (``trajectory=...`` for a closed one)."""
        calls = [
            RecordedCall(
                prompt_ids=c.prompt_ids,
                policy_version=c.policy_version,
                cut=c.cut,
                choices=[
                    RecordedChoice(
                        completion_ids=x.token_ids,
                        logprobs=x.logprobs,
                        versions=x.versions,
                        finish_reason=x.finish_reason,
                        unoffered_tool_calls=x.unoffered_tool_calls,
                        constrained=x.constrained,
                    )
                    for x in c.completions
                ],
            )
            for c in episode.calls
        ]
        return cls(
            episode_id=episode.episode_id,
            status="closed" if episode.closed else "open",
            reward=episode.reward,
            task_id=episode.task_id,
            info=episode.info,
            calls=calls,
            **trajectory,
        )


# ---------------------------------------------------------------- Responses replies
class OutputText(_Reply):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = []
    logprobs: list[Any] = []


ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(_Reply):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(_Reply):
    id: str
    type: Literal["function_call"] = "function_call"
    status: ItemStatus
    call_id: str
    name: str
    arguments: str


OutputItem = MessageItem | FunctionCallItem


class _InputDetails(_Reply):
    cached_tokens: int


class _OutputDetails(_Reply):
    reasoning_tokens: int = 0


class ResponseUsage(_Reply):
    input_tokens: int
    input_tokens_details: _InputDetails
    output_tokens: int
    output_tokens_details: _OutputDetails = _OutputDetails()
    total_tokens: int


class ResponseObject(_Reply):
    """A ``response`` object. The request's values it repeats (``model`` ... ``text``) are
    :func:`~.serving_responses.echo_of`'s; the opening events of a live stream leave out
    the keys in ``optional``, which a finished response gives."""

    optional = frozenset(
        {"completed_at", "error", "previous_response_id", "store", "truncation", "reasoning"}
    )
    id: str
    object: Literal["response"] = "response"
    created_at: float
    completed_at: float | None = None
    status: Literal["in_progress", "completed", "incomplete"]
    incomplete_details: dict[str, str] | None = None
    error: None = None
    model: str
    instructions: Any = None
    tools: list[Any] = []  # as the request sent them
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    temperature: Any = None
    top_p: Any = None
    max_output_tokens: int | None = None
    metadata: Any = None
    user: Any = None
    text: dict[str, Any]
    output: list[OutputItem]
    previous_response_id: None = None
    store: bool = False
    truncation: Literal["disabled"] = "disabled"
    reasoning: None = None
    usage: ResponseUsage | None = None


class ResponseEvent(_Reply):
    """``response.created``, ``.in_progress``, ``.completed`` or ``.incomplete``. Every
    event goes out with the ``sequence_number`` its stream gives it."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete"
    ]
    response: ResponseObject


class OutputItemEvent(_Reply):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Reply):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText


class TextDeltaEvent(_Reply):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any] = []


class TextDoneEvent(_Reply):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[Any] = []


class ArgumentsDeltaEvent(_Reply):
    type: Literal["response.function_call_arguments.delta"] = (
        "response.function_call_arguments.delta"
    )
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Reply):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    arguments: str


class ErrorEvent(_Reply):
    """The last event of a stream whose call failed after it began."""

    type: Literal["error"] = "error"
    code: str = "server_error"
    message: str


StreamEvent = (
    ResponseEvent
    | OutputItemEvent
    | ContentPartEvent
    | TextDeltaEvent
    | TextDoneEvent
    | ArgumentsDeltaEvent
    | ArgumentsDoneEvent
    | ErrorEvent
)
