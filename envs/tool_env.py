"""A base for tool-using environments: declare the tools, write ``reset`` and the reward.

:class:`ToolEnvironment` does the rest of the contract: each turn's tool calls run with
the configured timeout (``env.tool_timeout_s``), malformed calls, bad arguments and tool
exceptions come back to the agent as ``error: ...`` observations, outputs are framed as
``{"role": "tool"}`` messages, and every call is recorded in ``info["tool_calls"]``, which
gives ``rollout/tool_use_fraction``, ``eval/tool_use_fraction``, ``time/tool/<name>`` and
``count/tool/<name>/error_total`` without extra code. A tool is an environment method (or a
function) marked with :func:`tool`, whose JSON schema is read from its type hints or given
whole, or a :class:`~tunix_agentic.envs.tools.Tool` subclass listed in ``tools``::

    @register_env("kv", tasks=KVTasks())
    class KVEnv(ToolEnvironment):
        @tool
        def get(self, key: str) -> str:
            "The value stored under key."
            return self.table[key]

        async def reset(self, task):
            self.table = task.data["table"]
            return task.prompt

        def reward(self, answer):
            return float(answer.strip() == self.task.answer)
"""

from __future__ import annotations

import asyncio
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from tunix_agentic.envs.base import Action, Environment, StepResult, run_tool_calls
from tunix_agentic.envs.tools import Tool, check_parameters

_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}
_HINTS = "str, int, float, bool, list, dict, list[...], dict[...], Literal[...], X | None"


class FunctionTool(Tool):
    """A :class:`Tool` from a plain function (sync or async) and its JSON schema.

    A sync function runs on the event loop (keep it quick) unless ``blocking=True``,
    which runs it on a worker thread (the timeout then abandons it, it cannot stop it).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: dict[str, Any] | None = None,
        blocking: bool = False,
    ):
        self.fn, self.blocking = fn, blocking
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description if description is not None else doc.split("\n\n")[0]
        self.parameters = parameters if parameters is not None else schema_from_signature(fn)
        check_parameters(self.parameters, self.name)

    def schema(self) -> dict[str, Any]:  # type: ignore[override]  # per instance, not class
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    async def run(self, **arguments: Any) -> str:
        if inspect.iscoroutinefunction(self.fn):
            out = await self.fn(**arguments)
        elif self.blocking:
            out = await asyncio.to_thread(self.fn, **arguments)
        else:
            out = self.fn(**arguments)
        return out if isinstance(out, str) else str(out)


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON schema of ``fn``'s keyword arguments from its type hints (``str``, ``int``,
    ``float``, ``bool``, ``list``, ``dict``, ``Literal[...]``, ``X | None``); an argument
    with no default is required. Raises ``TypeError`` naming an argument it cannot type."""
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(f"tool {fn.__name__!r}: argument {param.name!r} is positional-only")
        if param.name not in hints:
            raise TypeError(
                f"tool {fn.__name__!r}: argument {param.name!r} has no type hint; annotate it "
                "or give @tool(parameters={...}) a JSON schema"
            )
        properties[param.name] = _json_schema_of(hints[param.name], fn.__name__, param.name)
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "object", "properties": properties, "required": required}


def _json_schema_of(hint: Any, fn: str, arg: str) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            inner = _json_schema_of(rest[0], fn, arg)
            return {"anyOf": [inner, {"type": "null"}]}
    if origin in (list, dict):
        hint = origin
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    raise TypeError(
        f"tool {fn!r}: argument {arg!r} has type {hint!r}, which has no JSON schema here "
        f"(a tool's hints can be {_HINTS}); give @tool(parameters={{...}}) a JSON schema"
    )


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: dict[str, Any] | None = None,
    blocking: bool = False,
) -> Any:
    """Marks a function, or a :class:`ToolEnvironment` method, as a tool: ``@tool`` or
    ``@tool(parameters={...})``.

    The name defaults to the function's, the description to its docstring's first
    paragraph, the ``parameters`` JSON schema to one read from its type hints
    (:func:`schema_from_signature`); arguments are checked against it (``jsonschema``)
    before the function runs. Return the text the agent sees; raise
    :class:`~tunix_agentic.envs.tools.ToolError` to refuse an input. The schema is
    checked here: a bad one raises ``ValueError`` at import."""

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        FunctionTool(f, name=name, description=description, parameters=parameters)  # checks
        f.__tool_spec__ = {  # type: ignore[attr-defined]
            "name": name,
            "description": description,
            "parameters": parameters,
            "blocking": blocking,
        }
        return f

    return mark(fn) if fn is not None else mark


def as_tool(item: Any) -> Tool:
    """A :class:`Tool` instance from a Tool, a Tool subclass (instantiated with no
    arguments) or a function (marked with :func:`tool` or not)."""
    if isinstance(item, Tool):
        return item
    if isinstance(item, type) and issubclass(item, Tool):
        return item()
    if callable(item):
        return FunctionTool(item, **getattr(item, "__tool_spec__", {}))
    raise TypeError(f"a tool is a Tool, a Tool subclass or a function, got {item!r}")


class ToolEnvironment(Environment):
    """An environment whose tools, timeouts, errors and metrics are handled for you.

    Declare tools as methods marked :func:`tool` and/or list them in the class attribute
    ``tools`` (Tool subclasses, Tool instances or functions); each instance gets its own
    ``self.tools`` mapping. Write ``reset(task)`` (return the prompt; keep ``task`` if
    the reward needs it) and ``reward(answer)`` (the reward of a final
    ``<answer>...</answer>``; may be async).

    The default :meth:`step`: an answer ends the episode with ``reward(answer)``
    (status ``answered``); tool calls (and malformed ones) are run by :meth:`run_tools`;
    a turn with neither ends it with 0 (status ``no_action``). Override ``step`` for
    other rules and call :meth:`run_tools` for a turn's calls. :meth:`evaluate` returns
    the answer's reward (0 without one).

    ``tool_timeout`` (seconds per call; the config's ``env.tool_timeout_s`` when set)
    defaults to the class attribute ``default_tool_timeout``.
    """

    tools: Any = ()
    default_tool_timeout: float | None = 10.0

    def __init__(self, *, tool_timeout: float | None = None) -> None:
        super().__init__()
        if tool_timeout is not None and tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be positive, got {tool_timeout}")
        self.tool_timeout = tool_timeout if tool_timeout is not None else self.default_tool_timeout
        declared = type(self).tools
        if isinstance(declared, dict):
            declared = list(declared.values())
        found: dict[str, Tool] = {}
        for item in [*declared, *self._tool_methods()]:
            made = as_tool(item)
            if made.name in found:
                raise ValueError(f"{type(self).__name__}: two tools are named {made.name!r}")
            found[made.name] = made
        self.tools = found
        self.task: Any = None
        self.outcome: float | None = None

    def _tool_methods(self) -> list[Any]:
        """The bound methods marked :func:`tool`, in definition order (bases first)."""
        names: list[str] = []
        for klass in reversed(type(self).__mro__):
            for attr, value in vars(klass).items():
                if hasattr(value, "__tool_spec__") and attr not in names:
                    names.append(attr)
        return [getattr(self, attr) for attr in names]

    def reward(self, answer: str) -> float:
        """The reward of the final answer; override it (or :meth:`step`)."""
        raise NotImplementedError(
            f"{type(self).__name__} must define reward(answer) (or override step)"
        )

    async def step(self, action: Action) -> StepResult:
        if self.outcome is not None:
            raise RuntimeError("step() after the episode ended")
        if action.answer is not None:
            value = self.reward(action.answer)
            if inspect.isawaitable(value):
                value = await value
            self.outcome = float(value)
            return StepResult("", self.outcome, True, {"status": "answered"})
        if action.tool_calls or action.parse_errors:
            return await self.run_tools(action)
        self.outcome = 0.0
        return StepResult("", 0.0, True, {"status": "no_action"})

    async def run_tools(self, action: Action) -> StepResult:
        """This turn's tool calls, run with :attr:`tool_timeout`, and its malformed calls,
        as one observation of ``tool`` messages (reward 0, not done)."""
        return await run_tool_calls(self.tools, action, timeout=self.tool_timeout)

    async def evaluate(self) -> float:
        return self.outcome or 0.0
