"""Tools an agent can call, their OpenAI function schemas, and a call wrapper that never raises.

A tool is a small async callable with a JSON-schema description of its arguments. Environments
run the agent's parsed tool calls through :func:`call_tool`, which turns every failure a model can
cause (unknown tool, bad arguments, an exception in the tool, a timeout) into an error result the
agent sees as its next observation, so one bad call never kills a rollout.
"""

from __future__ import annotations

import abc
import asyncio
import contextvars
import time
from collections.abc import Mapping
from dataclasses import dataclass
from traceback import format_exc
from typing import Any, Literal

from jsonschema import Draft202012Validator, SchemaError
from jsonschema.exceptions import ValidationError, relevance

from tunix_agentic.envs.tools.failures import TOOL_FAILURES, ToolFailureMonitor


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from the agent's text: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


ERROR_PREFIX = "error: "

# Why a call failed, as ``ToolResult.kind`` and the agent loop's ``count/tool/<name>/<kind>_total``:
# the agent's mistakes (``unknown_tool``, ``bad_arguments``, ``rejected``: a ToolError) and
# the tool's own failures (``raised``: any other exception, ``timeout``).
ErrorKind = Literal["unknown_tool", "bad_arguments", "rejected", "raised", "timeout"]


def _json_type_name(value: Any) -> str:
    """The JSON type name of a Python value, for error messages."""
    if isinstance(value, bool):
        return "boolean"
    for name, types in (
        ("integer", int),
        ("number", float),
        ("string", str),
        ("object", dict),
        ("array", list | tuple),
    ):
        if isinstance(value, types):
            return name
    return "null" if value is None else type(value).__name__


class ToolError(Exception):
    """Raised by a tool for a call it refuses (a missing key, an input out of its domain):
    the agent sees ``error: <message>`` and the call counts as the agent's mistake
    (kind ``rejected``), not as the tool failing. Any other exception counts as ``raised``
    and, raised often, is warned about (see :class:`ToolFailureMonitor`)."""


def check_parameters(parameters: Any, name: str) -> None:
    """Raises ``ValueError`` naming tool ``name`` if ``parameters`` is not a valid JSON
    schema of an object (the arguments of a call are always an object)."""
    if not isinstance(parameters, dict):
        raise ValueError(
            f"tool {name!r}: parameters must be a JSON schema dict, got {parameters!r}"
        )
    if parameters.get("type", "object") != "object":
        raise ValueError(f"tool {name!r}: parameters must describe an object, got {parameters!r}")
    try:
        Draft202012Validator.check_schema(parameters)
    except SchemaError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "the top level"
        raise ValueError(
            f"tool {name!r}: parameters is not a valid JSON schema (at {where}: {exc.message})"
        ) from None


_VALIDATORS: dict[str, tuple[Any, Draft202012Validator]] = {}


def _validator(name: str, parameters: dict[str, Any]) -> Draft202012Validator:
    """The compiled validator of a tool's schema (cached per tool name and schema object);
    top-level ``additionalProperties`` defaults to false: an unknown argument is a mistake."""
    cached = _VALIDATORS.get(name)
    if cached is not None and cached[0] is parameters:
        return cached[1]
    schema = {"type": "object", "additionalProperties": False, **parameters}
    validator = Draft202012Validator(schema)
    _VALIDATORS[name] = (parameters, validator)
    return validator


def validate_arguments(name: str, parameters: dict[str, Any], arguments: Any) -> str | None:
    """Checks a call's ``arguments`` against tool ``name``'s JSON schema ``parameters``;
    None if valid, else one message for the agent naming the argument at fault."""
    if not isinstance(arguments, dict):
        return (
            f"arguments for tool '{name}' must be a JSON object, got {_json_type_name(arguments)}"
        )
    errors = list(_validator(name, parameters).iter_errors(arguments))
    if not errors:
        return None
    top = [e for e in errors if not e.path]
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        return f"tool '{name}' is missing required argument(s): {', '.join(missing)}"
    if any(e.validator == "additionalProperties" for e in top):
        properties = parameters.get("properties", {})
        unknown = [str(k) for k in arguments if k not in properties]
        allowed = ", ".join(properties) or "none"
        return f"tool '{name}' got unknown argument(s): {', '.join(unknown)} (allowed: {allowed})"
    error = min(errors, key=lambda e: (len(e.path), relevance(e)))  # the outermost first
    return _describe(name, error)


def _describe(name: str, error: ValidationError) -> str:
    """One validation error as the agent reads it, naming the argument (``at.y``, ``tags[1]``)."""
    if not error.path:
        return f"arguments of tool '{name}': {error.message}"
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.path)[1:]
    if error.validator == "type":
        types = error.validator_value
        expected = " or ".join([types] if isinstance(types, str) else types)
        return (
            f"argument '{path}' of tool '{name}' must be of type {expected}, "
            f"got {_json_type_name(error.instance)}"
        )
    return f"argument '{path}' of tool '{name}': {error.message}"


class ToolUnavailable(Exception):
    """Raised by a tool whose *infrastructure* failed (its sandbox died, its service is down).

    Unlike any other exception, which the agent sees as an ``error:`` observation
    (a bad call is the policy's fault), this one passes through :func:`call_tool`
    and ends the episode with status ``tool_error``: an infrastructure fault that
    the orchestrator retries or drops, never scores as a failure of the policy.
    """


class Tool(abc.ABC):
    """A function the agent can call, described by an OpenAI function schema.

    Subclasses set the class attributes ``name``, ``description`` and ``parameters`` (a JSON
    schema object ``{"type": "object", "properties": {...}, "required": [...]}``) and implement
    :meth:`run`. Arguments are checked against ``parameters`` with ``jsonschema`` before
    ``run`` sees them. ``run`` raises :class:`ToolError` (or one of ``expected_errors``)
    to refuse an input; any other exception counts as the tool failing (counted and,
    when frequent, warned about). ``run`` runs on the event loop: a tool that blocks (CPU
    work, a subprocess, file I/O) must hand that work to an executor, or the timeout in
    :func:`call_tool` cannot interrupt it and every other rollout stalls.
    """

    name: str
    description: str
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
    # Exceptions that mean "the agent's input was refused" (like ToolError): the agent
    # sees them as usual, and they do not count as the tool failing.
    expected_errors: tuple[type[Exception], ...] = ()

    @classmethod
    def schema(cls) -> dict[str, Any]:
        """The OpenAI function schema: ``{"type": "function", "function": {...}}`` (from the
        class attributes, so a tool's schema is known before any instance exists)."""
        return {
            "type": "function",
            "function": {
                "name": cls.name,
                "description": cls.description,
                "parameters": cls.parameters,
            },
        }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "parameters" in cls.__dict__:  # a bad schema is the author's: say so at import
            check_parameters(cls.parameters, getattr(cls, "name", cls.__name__))

    def validate(self, arguments: Any) -> str | None:
        """Checks ``arguments`` against :attr:`parameters` with ``jsonschema`` (JSON Schema
        2020-12: nested objects, arrays, enums, ranges, patterns...); None if valid, else
        one message naming the argument. Unknown top-level arguments are refused unless
        the schema sets ``additionalProperties``."""
        return validate_arguments(self.name, self.parameters, arguments)

    @abc.abstractmethod
    async def run(self, **arguments: Any) -> str:
        """Runs the tool on validated arguments and returns its output text.

        Raise an exception for a failed call; :func:`call_tool` reports it to the agent.
        Raise :class:`ToolUnavailable` when the tool itself could not run (infrastructure).
        """


@dataclass
class ToolResult:
    """The outcome of one tool call.

    ``output`` is the text the agent sees; for an error it starts with ``"error: "``.
    ``seconds`` is the wall-clock time spent, validation included. ``kind`` says why a
    call failed (None when it did not); ``traceback`` is the tool's own traceback and
    ``exception`` its exception's class name when it raised.
    """

    output: str
    error: bool
    seconds: float
    kind: ErrorKind | None = None
    traceback: str | None = None
    exception: str | None = None

    def record(self, name: str) -> dict[str, Any]:
        """What the agent loop counts of the call (``info["tool_calls"]``' entries)."""
        out: dict[str, Any] = {"name": name, "seconds": self.seconds, "error": self.error}
        if self.kind is not None:
            out["kind"] = self.kind
        if self.exception is not None:
            out["exception"] = self.exception
        return out


# The calls :func:`call_tool` ran during one environment step, in order: the agent loop
# opens a list per step, so an environment that calls ``call_tool`` itself (and reports no
# ``info["tool_calls"]``) gets its calls' errors counted as :func:`run_tool_calls`' are.
STEP_CALLS: contextvars.ContextVar[list[dict[str, Any]] | None] = contextvars.ContextVar(
    "tool_step_calls", default=None
)


async def call_tool(
    tools: Mapping[str, Tool],
    call: ToolCall,
    *,
    timeout: float | None = None,
    monitor: ToolFailureMonitor | None = TOOL_FAILURES,
) -> ToolResult:
    """Runs one tool call and returns its result; never raises for a bad call.

    An unknown tool name, invalid arguments, an exception inside the tool and a timeout (when
    ``timeout`` seconds is given) all become error results whose output starts with
    ``"error: "``, their ``kind`` saying which. ``asyncio.CancelledError`` still propagates,
    so cancelling a rollout works, and so does :class:`ToolUnavailable` (an infrastructure
    fault, not the agent's). Each call of a known tool is reported to ``monitor`` (by
    default the process's :data:`TOOL_FAILURES`, which warns about a tool that keeps
    raising); None reports nowhere.
    """
    start = time.perf_counter()

    def result(
        output: str,
        kind: ErrorKind | None = None,
        trace: str | None = None,
        exc: BaseException | None = None,
    ) -> ToolResult:
        name = type(exc).__name__ if exc is not None else None
        done = ToolResult(output, kind is not None, time.perf_counter() - start, kind, trace, name)
        if monitor is not None and kind != "unknown_tool":
            monitor.record(call.name, kind, trace or output)
        step_calls = STEP_CALLS.get()
        if step_calls is not None:
            step_calls.append(done.record(call.name))
        return done

    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return result(
            f"{ERROR_PREFIX}unknown tool '{call.name}' (available tools: {known})", "unknown_tool"
        )
    message = tool.validate(call.arguments)
    if message is not None:
        return result(ERROR_PREFIX + message, "bad_arguments")
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            output = await tool.run(**call.arguments)
    except ToolUnavailable:
        raise
    except ToolError as exc:
        return result(f"{ERROR_PREFIX}{exc}", "rejected")
    except TimeoutError as exc:
        if scope.expired():
            return result(
                f"{ERROR_PREFIX}tool '{call.name}' timed out after {timeout:g}s", "timeout"
            )
        return result(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", "raised", format_exc(), exc)
    except Exception as exc:  # noqa: BLE001 - any tool failure becomes an observation.
        if isinstance(exc, tool.expected_errors):  # the agent's input, refused: not a fault
            return result(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", "rejected")
        return result(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", "raised", format_exc(), exc)
    return result(output if isinstance(output, str) else str(output))
