"""Tools an agent can call, their OpenAI function schemas, and a call wrapper that never raises.

A tool is a small async callable with a JSON-schema description of its arguments. Environments
run the agent's parsed tool calls through :func:`call_tool`, which turns every failure a model can
cause (unknown tool, bad arguments, an exception in the tool, a timeout) into an error result the
agent sees as its next observation, so one bad call never kills a rollout.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    """One tool call parsed from the agent's text: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]


# JSON schema type name -> Python check. bool is a subclass of int, so numbers exclude it.
_JSON_TYPE_CHECKS: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list | tuple),
    "null": lambda v: v is None,
}

ERROR_PREFIX = "error: "


def _json_type_name(value: Any) -> str:
    """The JSON type name of a Python value, for error messages."""
    for name in ("boolean", "integer", "number", "string", "object", "array", "null"):
        if _JSON_TYPE_CHECKS[name](value):
            return name
    return type(value).__name__


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
    :meth:`run`. ``run`` runs on the event loop: a tool that blocks (CPU work, a subprocess,
    file I/O) must hand that work to an executor, or the timeout in :func:`call_tool` cannot
    interrupt it and every other rollout stalls.
    """

    name: str
    description: str
    parameters: dict[str, Any] = {"type": "object", "properties": {}, "required": []}

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

    def validate(self, arguments: Any) -> str | None:
        """Checks ``arguments`` against :attr:`parameters`; None if valid, else a message.

        Checks that the arguments are an object, that required properties are present, that
        no unknown property is given (unless the schema sets ``additionalProperties``), and
        that each top-level value has the declared JSON type. Nested values are not checked.
        """
        if not isinstance(arguments, dict):
            return (
                f"arguments for tool '{self.name}' must be a JSON object, "
                f"got {_json_type_name(arguments)}"
            )
        properties: dict[str, Any] = self.parameters.get("properties", {})
        missing = [key for key in self.parameters.get("required", []) if key not in arguments]
        if missing:
            return f"tool '{self.name}' is missing required argument(s): {', '.join(missing)}"
        if not self.parameters.get("additionalProperties", False):
            unknown = [key for key in arguments if key not in properties]
            if unknown:
                allowed = ", ".join(properties) or "none"
                return (
                    f"tool '{self.name}' got unknown argument(s): {', '.join(map(str, unknown))}"
                    f" (allowed: {allowed})"
                )
        for key, value in arguments.items():
            declared = properties.get(key, {}).get("type")
            if declared is None:
                continue
            types = [declared] if isinstance(declared, str) else list(declared)
            if not any(_JSON_TYPE_CHECKS.get(t, lambda v: True)(value) for t in types):
                return (
                    f"argument '{key}' of tool '{self.name}' must be of type "
                    f"{' or '.join(types)}, got {_json_type_name(value)}"
                )
        return None

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
    ``seconds`` is the wall-clock time spent, validation included.
    """

    output: str
    error: bool
    seconds: float


async def call_tool(
    tools: Mapping[str, Tool], call: ToolCall, *, timeout: float | None = None
) -> ToolResult:
    """Runs one tool call and returns its result; never raises for a bad call.

    An unknown tool name, invalid arguments, an exception inside the tool and a timeout (when
    ``timeout`` seconds is given) all become error results whose output starts with
    ``"error: "``. ``asyncio.CancelledError`` still propagates, so cancelling a rollout works,
    and so does :class:`ToolUnavailable` (an infrastructure fault, not the agent's).
    """
    start = time.perf_counter()

    def result(output: str, error: bool) -> ToolResult:
        return ToolResult(output=output, error=error, seconds=time.perf_counter() - start)

    tool = tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return result(f"{ERROR_PREFIX}unknown tool '{call.name}' (available tools: {known})", True)
    message = tool.validate(call.arguments)
    if message is not None:
        return result(ERROR_PREFIX + message, True)
    scope = asyncio.timeout(timeout)
    try:
        async with scope:
            output = await tool.run(**call.arguments)
    except ToolUnavailable:
        raise
    except TimeoutError as exc:
        if scope.expired():
            return result(f"{ERROR_PREFIX}tool '{call.name}' timed out after {timeout:g}s", True)
        return result(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", True)
    except Exception as exc:  # noqa: BLE001 - any tool failure becomes an observation.
        return result(f"{ERROR_PREFIX}{type(exc).__name__}: {exc}", True)
    return result(output if isinstance(output, str) else str(output), False)
