"""The environment contract: actions in, observations and rewards out, plus a registry by name.

An episode is ``reset(task)`` (returns the user prompt), then ``step(action)`` until a result
has ``done=True``, then ``evaluate()`` (the verifier, run in the orchestrator's EVAL stage) and
``close()``. Environments are async because their tools may wait on sandboxes or processes.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from tunix_agentic.envs.tools import Tool, ToolCall


@dataclass(frozen=True)
class Action:
    """What the agent did in one turn, already parsed by the agent's parser.

    ``answer`` is the content of ``<answer>...</answer>`` if present. ``parse_errors`` holds
    one message per malformed ``<tool_call>`` block; the environment reports each back to the
    agent as an error observation instead of failing the rollout.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    answer: str | None = None
    parse_errors: tuple[str, ...] = ()


@dataclass
class StepResult:
    """The environment's reply to one action.

    ``observation`` is the text of the next user/tool turn (``""`` when ``done``).
    ``messages``, when given, is that turn as chat messages (``{"role": "tool",
    "content": ...}`` per tool output), which the chat template frames in its own
    format; without it the observation is one user message. ``info`` carries
    diagnostics such as ``{"status": "answered", "tool_calls": [...]}``.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None


class Environment(abc.ABC):
    """Async environment: ``reset``, ``step`` until done, ``evaluate``, ``close``.

    ``reset(task)`` returns the first observation text (the user prompt); ``step(action)``
    returns a :class:`StepResult`; ``evaluate()`` returns the final reward (the verifier, run in
    the EVAL stage); ``close()`` frees resources and is idempotent. ``tools`` maps tool names to
    :class:`~tunix_agentic.envs.tools.Tool` objects and may be empty.

    Subclasses call ``super().__init__()``. The default :meth:`evaluate` sums
    ``self.step_rewards``; a subclass that keeps it appends each step's reward there and
    clears it in ``reset``, or overrides ``evaluate``.
    """

    tools: Mapping[str, Tool] = MappingProxyType({})

    def __init__(self) -> None:
        self.step_rewards: list[float] = []

    @abc.abstractmethod
    async def reset(self, task: Any) -> str:
        """Starts an episode on ``task`` and returns the first observation (the user prompt)."""

    @abc.abstractmethod
    async def step(self, action: Action) -> StepResult:
        """Applies one agent action and returns the next observation, reward and done flag."""

    async def evaluate(self) -> float:
        """The episode's final reward; by default the sum of the step rewards so far."""
        return float(sum(self.step_rewards))

    async def close(self) -> None:  # noqa: B027 - a deliberate no-op default.
        """Frees the episode's resources; safe to call more than once. Default: nothing."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of :attr:`tools`, in their mapping order."""
        return [tool.schema() for tool in self.tools.values()]


EnvFactory = Callable[..., Environment]
_F = TypeVar("_F", bound=EnvFactory)
_REGISTRY: dict[str, EnvFactory] = {}


def register_env(name: str) -> Callable[[_F], _F]:
    """Class/function decorator registering an environment factory under ``name``.

    Registering a different factory under a name already taken raises ``ValueError``;
    registering the same one again (e.g. a module reload) is allowed.
    """

    def decorator(factory: _F) -> _F:
        existing = _REGISTRY.get(name)
        if existing is not None and _origin(existing) != _origin(factory):
            raise ValueError(f"environment {name!r} is already registered to {existing!r}")
        _REGISTRY[name] = factory
        return factory

    return decorator


def _origin(factory: EnvFactory) -> tuple[str, str]:
    """Where a factory was defined, so a reloaded module may re-register its own names."""
    return (getattr(factory, "__module__", ""), getattr(factory, "__qualname__", repr(factory)))


def make_env(name: str, **kwargs: Any) -> Environment:
    """Builds the environment registered as ``name`` with ``kwargs``.

    Raises ``ValueError`` naming the known environments if ``name`` is not registered.
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        known = ", ".join(available_envs()) or "none"
        raise ValueError(f"unknown environment {name!r}; available environments: {known}")
    return factory(**kwargs)


def available_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(_REGISTRY)
