"""The environment contract: actions in, observations and rewards out, plus a registry by name.

An episode is ``reset(task)`` (returns the user prompt), then ``step(action)`` until a result
has ``done=True``, then ``evaluate()`` (the verifier, run in the orchestrator's EVAL stage) and
``close()``. Environments are async because their tools may wait on sandboxes or processes.
"""

from __future__ import annotations

import abc
import asyncio
import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tunix_agentic.envs.tools import Tool, ToolCall, call_tool

if TYPE_CHECKING:  # an annotation only: environments import nothing of the pipeline
    from tunix_agentic.trajectory import Trajectory

SPLITS = ("train", "heldout")
# Seconds one reward computation may take (Environment.reward_timeout_s's default).
REWARD_TIMEOUT_S = 60.0
_T = TypeVar("_T")


class RewardTimeoutError(RuntimeError):
    """A reward computation ran past its deadline: the episode ends as an ``env_error``
    saying so (counted like any environment fault), instead of stalling the rollouts."""


async def score_off_loop(check: Callable[..., _T], *args: Any, timeout: float) -> _T:
    """``check(*args)``, a synchronous verifier, run in a worker thread and awaited for at
    most ``timeout`` seconds (:class:`RewardTimeoutError` past it).

    The event loop runs every other episode meanwhile. A thread cannot be stopped: past the
    deadline the check runs on to its end in the background, so a verifier must still be
    fast (linear in its input); the deadline turns a slow one into a clear, counted error.
    """
    try:
        async with asyncio.timeout(timeout):
            return await asyncio.to_thread(check, *args)
    except TimeoutError:
        name = getattr(check, "__qualname__", type(check).__name__)
        raise RewardTimeoutError(f"the reward check {name} took over {timeout:g}s") from None


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


async def run_tool_calls(
    tools: Mapping[str, Tool], action: Action, *, timeout: float | None
) -> StepResult:
    """The usual reply to a turn of tool calls: each call run in order (never raising for
    the agent's mistakes, see :func:`call_tool`), then one error per malformed call, as
    ``{"role": "tool"}`` messages (and ``<tool_response>`` text); reward 0, not done,
    ``info["tool_calls"]`` with each call's name, seconds, error flag and error ``kind``
    (the agent loop records them as ``time/tool/<name>`` and ``count/tool/<name>/error_total``).
    :class:`ToolUnavailable` propagates. :class:`~tunix_agentic.envs.ToolEnvironment`
    calls it for you."""
    outputs: list[str] = []
    records: list[dict[str, Any]] = []
    for call in action.tool_calls:
        res = await call_tool(tools, call, timeout=timeout)
        outputs.append(res.output)
        records.append(res.record(call.name))
    outputs.extend(f"error: {message}" for message in action.parse_errors)
    return StepResult(
        "".join(f"<tool_response>{out}</tool_response>" for out in outputs),
        reward=0.0,
        done=False,
        info={"status": "tool", "tool_calls": records, "parse_errors": len(action.parse_errors)},
        messages=[{"role": "tool", "content": out} for out in outputs],
    )


class Environment(abc.ABC):
    """Async environment: ``reset``, ``step`` until done, ``evaluate``, ``close``.

    ``reset(task)`` returns the first observation text (the user prompt); ``step(action)``
    returns a :class:`StepResult`; ``evaluate()`` returns the final reward (the verifier, run in
    the EVAL stage); ``close()`` frees resources and is idempotent. ``tools`` maps tool names to
    :class:`~tunix_agentic.envs.tools.Tool` objects and may be empty.

    A tool-using environment is simplest as a
    :class:`~tunix_agentic.envs.tool_env.ToolEnvironment`, which runs the tool calls and
    records them for the metrics; one written on this class directly answers a turn of
    calls with :func:`run_tool_calls` (or its own code, e.g. ``call_tool`` per call). The
    agent loop counts the calls from the agent's parsed action either way (``tool_use``,
    ``count/tool/<name>/calls_total``); ``time/tool/<name>`` and the error counts come from the
    environment's report in ``info["tool_calls"]``, which :func:`run_tool_calls` fills,
    else from the ``call_tool`` calls the step made.

    Subclasses call ``super().__init__()``. The default :meth:`evaluate` sums
    ``self.step_rewards``; a subclass that keeps it appends each step's reward there and
    clears it in ``reset``, or overrides ``evaluate``.
    """

    tools: Mapping[str, Tool] = MappingProxyType({})
    # The EVAL stage's deadline for evaluate() / evaluate_trajectory(): past it the episode
    # ends as an env_error (counted as rollout/reward_timeouts), never a stalled rollout.
    reward_timeout_s: float = REWARD_TIMEOUT_S

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

    async def evaluate_trajectory(self, trajectory: Trajectory) -> float:
        """The episode's final reward, seeing the whole episode: every turn's text, tool
        calls and per-step rewards (``trajectory.steps``). The EVAL stage calls this;
        by default it returns :meth:`evaluate`. Override it for a reward over all turns
        (a process-aware verifier, a penalty on repeated calls)."""
        return await self.evaluate()

    async def close(self) -> None:  # noqa: B027 - a deliberate no-op default.
        """Frees the episode's resources; safe to call more than once. Default: nothing."""

    def tool_schemas(self) -> list[dict[str, Any]]:
        """OpenAI function schemas of :attr:`tools`, in their mapping order."""
        return [tool.schema() for tool in self.tools.values()]


@dataclass(frozen=True)
class Task:
    """A task any environment can take: a prompt, the expected answer, free-form data.

    ``task_name`` is the task source's name in a run (set by the task mixture; it
    tags every trajectory and its metrics). ``data`` holds what else the
    environment needs (numbers, a grid, a repository...), JSON-serialisable so a
    task can travel to a remote environment or be read from a file.
    """

    task_id: str
    prompt: str
    answer: Any = None
    data: Mapping[str, Any] = field(default_factory=dict)
    task_name: str = "default"

    @classmethod
    def from_record(cls, record: Mapping[str, Any], *, index: int, split: str) -> Task:
        """A task from one JSONL/parquet record: ``prompt`` (required), ``answer``,
        ``task_id`` (default ``"<split>-<index>"``), and every other key into ``data``."""
        if not isinstance(record, Mapping) or "prompt" not in record:
            raise ValueError(f"{split} record {index} has no 'prompt' field: {record!r:.200}")
        rest = {k: v for k, v in record.items() if k not in ("prompt", "answer", "task_id")}
        return cls(
            task_id=str(record.get("task_id", f"{split}-{index}")),
            prompt=str(record["prompt"]),
            answer=record.get("answer"),
            data=rest,
        )


class TaskSource(abc.ABC):
    """Where an environment's tasks come from: train and held-out tasks by index, and
    optionally demonstrations for a supervised warm start.

    ``task(index, seed=, split=)`` must be deterministic in its arguments (tasks are
    generated on the fly, so a stream of a million costs no memory, and a
    checkpointed stream position is enough to resume). The train and held-out
    splits should not share tasks. ``num_tasks(split)`` bounds the index.
    """

    def num_tasks(self, split: str) -> int:
        """How many distinct tasks ``split`` has (default: 1,000,000 train, 10,000 held-out)."""
        return 1_000_000 if split == "train" else 10_000

    @abc.abstractmethod
    def task(self, index: int, *, seed: int, split: str) -> Any:
        """The ``index``-th task of ``split`` for ``seed``."""

    def demonstration(
        self, task: Any, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]] | None:
        """A worked episode for ``task`` as chat messages after the prompt: ``{"role":
        "assistant", "content": text}`` turns (with ``"tool_calls": [{"name": ...,
        "arguments": {...}}]`` for calls, which the agent's parser format renders after
        the text), each followed (except the last) by the environment's reply as
        ``{"role": "tool" | "user", "content": ...}`` messages.
        ``use_tools`` asks for one that uses the tools where the task allows both.
        None (the default): this source has no demonstrations."""
        return None

    @property
    def has_demonstrations(self) -> bool:
        """Whether :meth:`demonstration` is overridden."""
        return type(self).demonstration is not TaskSource.demonstration


EnvFactory = Callable[..., Environment]
_F = TypeVar("_F", bound=EnvFactory)
_REGISTRY: dict[str, EnvFactory] = {}
_TASKS: dict[str, TaskSource] = {}
_CLIENT_KWARGS: dict[str, frozenset[str]] = {}
ENTRY_POINT_GROUP = "tunix_agentic.envs"


def register_env(
    name: str, *, tasks: TaskSource | None = None, client_kwargs: Iterable[str] = ()
) -> Callable[[_F], _F]:
    """Class/function decorator registering an environment factory under ``name``,
    with the :class:`TaskSource` its tasks come from (None: tasks come from a file
    or are given to the orchestrator directly).

    ``client_kwargs``: the factory keywords a remote client may set when
    ``tunix-agentic serve-env`` builds an episode for it (``POST /envs`` ``kwargs``).
    List only task-level knobs (episode rules, reward shaping); resource limits, paths
    and the sandbox are the server operator's, fixed when the server starts. Default:
    none. ``"sandbox"`` is refused, and so is a keyword the factory does not take.

    Registering a different factory under a name already taken raises ``ValueError``;
    registering the same one again (e.g. a module reload) is allowed.
    """
    if tasks is not None and not isinstance(tasks, TaskSource):
        raise TypeError(f"tasks must be a TaskSource, got {type(tasks).__name__}")
    if isinstance(client_kwargs, str):
        raise ValueError(f"client_kwargs must be a list of names, got {client_kwargs!r}")
    allowed = frozenset(client_kwargs)
    for key in sorted(allowed, key=repr):
        if not isinstance(key, str) or not key.isidentifier():
            raise ValueError(f"client_kwargs of {name!r}: {key!r} is not a keyword name")
    if "sandbox" in allowed:
        raise ValueError(
            f"client_kwargs of {name!r}: 'sandbox' cannot come from a client; the sandbox "
            "is the server operator's (serve-env --config)"
        )

    def decorator(factory: _F) -> _F:
        existing = _REGISTRY.get(name)
        if existing is not None and _origin(existing) != _origin(factory):
            raise ValueError(f"environment {name!r} is already registered to {existing!r}")
        takes = _keywords(factory)
        unknown = sorted(allowed - takes) if takes is not None else []
        if unknown:
            raise ValueError(
                f"client_kwargs of {name!r}: {unknown[0]!r} is not a keyword of {factory!r}"
            )
        _REGISTRY[name] = factory
        _CLIENT_KWARGS[name] = allowed
        if tasks is not None:
            _TASKS[name] = tasks
        else:
            _TASKS.pop(name, None)
        return factory

    return decorator


def _keywords(factory: EnvFactory) -> frozenset[str] | None:
    """The keyword names ``factory`` takes; None when it takes any (``**kwargs``, or no
    signature to read)."""
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))


def offered_keywords(env: str, offered: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``offered`` (what a run gives every environment that asks for it by name: the
    ``tool_timeout`` of its tools, the ``sandbox`` of its code), the items that are not None
    and that environment ``env``'s factory names as a parameter. None of them when ``env``
    is not registered (reported where it is made) or its factory has no signature to read;
    a factory that takes only ``**kwargs`` gets none either: it names what it wants."""
    try:
        params = inspect.signature(get_env_factory(env)).parameters
    except (TypeError, ValueError):
        return {}
    return {key: value for key, value in offered.items() if value is not None and key in params}


def keyword_problem(env: str, factory: Any, kwargs: dict[str, Any], *, where: str) -> str | None:
    """Why ``factory`` (environment ``env``) cannot take ``kwargs`` (None if it can): a
    keyword it does not take, with the ones it takes and the closest match, or a required
    one that is missing. ``where`` names the config key they came from (``env.kwargs``)."""
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        accepted = None
    else:
        accepted = [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if accepted is not None:
        for key in kwargs:
            if key not in accepted:
                close = difflib.get_close_matches(key, accepted, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                takes = ", ".join(accepted) or "no keywords"
                return (
                    f"{where}: environment {env!r} takes no keyword {key!r}{hint} "
                    f"(it takes: {takes})"
                )
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        missing = [
            p.name
            for p in params
            if p.default is p.empty
            and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
            and p.name not in kwargs
        ]
        if missing:
            return f"{where}: environment {env!r} needs the keyword(s) {', '.join(missing)}"
        return f"{where}: environment {env!r}: {exc}"
    return None


def env_client_kwargs(name: str) -> frozenset[str]:
    """The factory keywords of environment ``name`` that a remote client may set (see
    :func:`register_env`); ValueError if ``name`` is not registered."""
    get_env_factory(name)
    return _CLIENT_KWARGS.get(name, frozenset())


def env_tasks(name: str) -> TaskSource | None:
    """The task source registered with environment ``name`` (None if it has none)."""
    get_env_factory(name)
    return _TASKS.get(name)


def _origin(factory: EnvFactory) -> tuple[str, str]:
    """Where a factory was defined, so a reloaded module may re-register its own names."""
    return (getattr(factory, "__module__", ""), getattr(factory, "__qualname__", repr(factory)))


def make_env(name: str, **kwargs: Any) -> Environment:
    """Builds the environment registered as ``name`` with ``kwargs``.

    Raises ``ValueError`` naming the known environments if ``name`` is not registered.
    """
    return get_env_factory(name)(**kwargs)


def get_env_factory(name: str) -> EnvFactory:
    """The factory registered as ``name`` (entry points loaded if need be); raises
    ``ValueError`` naming the registered environments if there is none."""
    if name not in _REGISTRY:
        load_entry_points()
    factory = _REGISTRY.get(name)
    if factory is None:
        known = ", ".join(available_envs()) or "none"
        raise ValueError(
            f"unknown environment {name!r}; available environments: {known} (a module of "
            "yours registers its environments when imported: env.import in the config, or "
            f"an entry point in the group {ENTRY_POINT_GROUP!r})"
        )
    return factory


def available_envs() -> list[str]:
    """Names of the registered environments, sorted (entry points loaded first)."""
    load_entry_points()
    return sorted(_REGISTRY)


_ENTRY_POINTS_LOADED = False


def load_entry_points() -> None:
    """Import every module named in the ``tunix_agentic.envs`` entry-point group once
    (an installed package declares ``[project.entry-points."tunix_agentic.envs"]
    name = "pkg.module"``; importing the module registers its environments)."""
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except Exception as exc:  # a broken plug-in must not hide the others
            import warnings

            warnings.warn(
                f"environment entry point {ep.name!r} ({ep.value}) failed to load: "
                f"{type(exc).__name__}: {exc}",
                stacklevel=2,
            )


def import_env_modules(modules: str | Sequence[str]) -> None:
    """Import the user's modules so they register their environments.

    Each item is a module path (``"mypkg.myenv"``; looked up on ``sys.path``, then in
    the working directory, as ``python -m`` would) or a ``.py`` file. A module is
    imported once. Raises ``ValueError`` naming the module that cannot be imported,
    and why.
    """
    import hashlib
    import importlib
    import importlib.util
    import os
    import sys

    for module in [modules] if isinstance(modules, str) else list(modules):
        try:
            if module.endswith(".py"):
                path = os.path.abspath(module)
                stem = os.path.splitext(os.path.basename(path))[0]
                digest = hashlib.sha1(path.encode()).hexdigest()[:8]
                name = f"tunix_agentic_user_env_{stem}_{digest}"  # one module per file
                if name in sys.modules:
                    continue
                spec = importlib.util.spec_from_file_location(name, path)
                if spec is None or not os.path.isfile(path):
                    raise FileNotFoundError(f"no file {path}")
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                try:
                    spec.loader.exec_module(mod)
                except BaseException:
                    del sys.modules[name]
                    raise
                continue
            try:
                importlib.import_module(module)
            except ModuleNotFoundError as exc:
                cwd = os.getcwd()
                if exc.name != module.split(".")[0] or cwd in sys.path:
                    raise
                sys.path.append(cwd)  # a console script does not put the cwd on sys.path
                importlib.import_module(module)
        except Exception as exc:
            raise ValueError(
                f"cannot import environment module {module!r}: {type(exc).__name__}: {exc}"
            ) from None
