"""Trajectories: what an episode did, token for token, and the learner's arrays.

An episode's tokens live once, in the trajectory's ``token_ids`` history; a
step only records where its context ended and which ids it appended (memory
grows linearly with turns instead of copying the chat per step).

A trajectory records which task it ran by the task's id and name: :class:`TaskLike` is
what every task has, and :func:`task_key` the one place a task's id and name are read.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import numpy as np

# Episode outcomes. The first group is the policy's doing; the second are
# infrastructure faults that must never be scored into group statistics.
# "agent_timeout" and "timeout" both mean the episode ran past its deadline; which one
# is decided by :func:`timeout_status`.
POLICY_STATUSES = ("ok", "max_turns", "max_tokens", "agent_timeout")
INFRA_STATUSES = ("timeout", "env_error", "engine_error", "tool_error", "cancelled")
# What the learner does with a step sampled under a grammar (learner.constrained_tokens).
ConstrainedTokens = Literal["train", "mask"]
CONSTRAINED_TOKENS: tuple[ConstrainedTokens, ...] = get_args(ConstrainedTokens)
TimeoutStatus = Literal["agent_timeout", "timeout"]
EpisodeStage = Literal["init", "run", "eval"]
# The share of the episode's deadline the agent's actions must have taken for a timeout
# to be the agent's.
AGENT_TIMEOUT_SHARE = 0.5


def check_constrained(how: str) -> None:
    if how not in CONSTRAINED_TOKENS:
        raise ValueError(f"constrained must be one of {CONSTRAINED_TOKENS}, got {how!r}")


def timeout_status(stage: EpisodeStage, actions_s: float, timeout_s: float) -> TimeoutStatus:
    """Whose an episode timeout is: ``"agent_timeout"`` (the policy's, scored) or
    ``"timeout"`` (the machinery's, infrastructure: retried, never scored).

    The rule: the timeout is the agent's when the deadline passed in the RUN stage (the
    agent loop) and the environment's steps on the agent's actions (``actions_s``: its
    tool calls, the step the deadline cut off included) took at least
    :data:`AGENT_TIMEOUT_SHARE` of the ``timeout_s`` deadline. Otherwise it is the
    machinery's: a deadline passed in INIT (making or resetting the environment) or EVAL
    (the verifier), or a RUN stage spent mostly waiting for the engine (or for a free run
    slot). Every tool call has its own timeout and a turn at most
    ``agent.max_tool_calls_per_turn`` calls, so a step can only take long by the agent's
    choice of calls, unless the environment itself hangs for half the deadline (then this
    rule blames the agent).
    """
    if stage == "run" and actions_s >= AGENT_TIMEOUT_SHARE * timeout_s:
        return "agent_timeout"
    return "timeout"


# The name of a task that names no task source (and of a trajectory's task by default).
DEFAULT_TASK_NAME = "default"


@runtime_checkable
class TaskLike(Protocol):
    """What every task has: :class:`~tunix_agentic.envs.base.Task` and the environments'
    own task dataclasses (the calculator's ``ArithmeticTask``, ...).

    ``task_id`` names the task (trajectories, group ids, transcripts); ``task_name`` the
    task source it came from in a run (set by the task mixture); ``prompt`` and
    ``answer`` are what its environment shows and checks. Read the id and name with
    :func:`task_key`, which also answers for an object that is not a whole task.
    """

    @property
    def task_id(self) -> str: ...

    @property
    def task_name(self) -> str: ...

    @property
    def prompt(self) -> str: ...

    @property
    def answer(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class TaskKey:
    """A task's id and the name of its task source, as trajectories record them."""

    id: str
    name: str


_MISSING = object()


def task_key(task: object) -> TaskKey:
    """The id and name of ``task``: its own ``task_id`` and ``task_name``, as strings.

    The one fallback, for an object without them (a bare prompt string in a test, a task
    dataclass of one's own): the id is ``str(task)`` when that is short and safe in a group
    id (at most 64 printable characters, none of ``/?#``), else ``task-`` and 12 hex digits
    of its SHA-1 (the same object, the same id); the name is :data:`DEFAULT_TASK_NAME`.
    """
    task_id = getattr(task, "task_id", _MISSING)
    name = getattr(task, "task_name", _MISSING)
    return TaskKey(
        _fallback_id(task) if task_id is _MISSING else str(task_id),
        DEFAULT_TASK_NAME if name is _MISSING else str(name),
    )


def _fallback_id(task: object) -> str:
    text = str(task)
    if len(text) <= 64 and text.isprintable() and not set(text) & set("/?#"):
        return text
    return "task-" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:12]


@dataclasses.dataclass
class Step:
    """One agent turn: the model's action on a context, then the environment's reply.

    ``context_len`` is the length of the context the action was generated from.
    With the whole history as context (``context_ids`` None) that context is the
    history's prefix; a context rule that shows less (a sliding window) records
    the ids the model actually saw in ``context_ids``. Either way the action's ids
    follow in the history, then the observation's.
    """

    context_len: int
    action_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    observation_ids: list[int] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    action_text: str = ""
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    context_ids: list[int] | None = None
    # A grammar masked its sampling (constrained decoding): the logprobs are the masked
    # distribution's, which the learner cannot recompute, and the policy did not choose
    # the masked-out tokens away; its tokens stay in the row as context, loss mask 0.
    constrained: bool = False


@dataclasses.dataclass
class Trajectory:
    task_id: str
    episode_id: str
    task_name: str = DEFAULT_TASK_NAME
    group_id: str = ""
    prompt_len: int = 0
    token_ids: list[int] = dataclasses.field(default_factory=list)  # the whole history
    steps: list[Step] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    status: str = "ok"
    error: str | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def is_infra_failure(self) -> bool:
        return self.status in INFRA_STATUSES

    @property
    def num_generated(self) -> int:
        return sum(len(s.action_ids) for s in self.steps)

    @property
    def min_version(self) -> int | None:
        versions = [v for s in self.steps for v in s.versions]
        return min(versions) if versions else None

    def append_prompt(self, ids: list[int]) -> None:
        self.token_ids.extend(ids)
        self.prompt_len = len(self.token_ids)

    @property
    def whole_history(self) -> bool:
        """Whether every step saw the whole history (one learner row suffices)."""
        return all(s.context_ids is None for s in self.steps)

    def append_action(self, step: Step) -> None:
        if step.context_ids is None and step.context_len != len(self.token_ids):
            raise ValueError("step context does not end where the history ends")
        if step.context_ids is not None and step.context_len != len(step.context_ids):
            raise ValueError("step context_len is not the length of its context_ids")
        self.token_ids.extend(step.action_ids)
        self.steps.append(step)

    def append_observation(self, ids: list[int]) -> None:
        self.steps[-1].observation_ids = list(ids)
        self.token_ids.extend(ids)

    def learner_arrays(self, *, constrained: str = "train") -> dict[str, np.ndarray]:
        """Per-position arrays over ``token_ids`` (length T).

        ``loss_mask[t]`` is 1 where token t was generated by the agent; a
        ``constrained`` step's tokens (sampled under a grammar) are 1 with
        ``constrained="train"`` and 0 with ``"mask"`` (``learner.constrained_tokens``);
        ``constrained[t]`` is 1 on those tokens (their logprob is the masked
        distribution's, which the learner does not recompute);
        ``old_logprobs[t]`` is the engine's logprob of token t (0 elsewhere);
        ``versions[t]`` the policy version that sampled it (-1 elsewhere).
        The learner scores token t from the logits at t-1.
        """
        n = len(self.token_ids)
        check_constrained(constrained)
        mask = np.zeros(n, np.float32)
        forced = np.zeros(n, np.float32)
        old = np.zeros(n, np.float32)
        versions = np.full(n, -1, np.int32)
        for step, a in zip(self.steps, self.action_starts(), strict=True):
            b = a + len(step.action_ids)
            mask[a:b] = 0.0 if step.constrained and constrained == "mask" else 1.0
            forced[a:b] = float(step.constrained)
            old[a:b] = step.logprobs
            versions[a:b] = step.versions
        return {
            "input_ids": np.asarray(self.token_ids, np.int32),
            "loss_mask": mask,
            "constrained": forced,
            "old_logprobs": old,
            "versions": versions,
        }

    def action_starts(self) -> list[int]:
        """Where each step's action begins in ``token_ids``."""
        starts, pos = [], self.prompt_len
        for step in self.steps:
            starts.append(pos)
            pos += len(step.action_ids) + len(step.observation_ids)
        return starts

    def learner_rows(self, *, constrained: str = "train") -> list[dict[str, np.ndarray]]:
        """What the learner trains on: what the model saw and did, token for token.

        One row (:meth:`learner_arrays`) when every step saw the whole history;
        otherwise one row per step, its context followed by its action (mask on
        the action), so a step is trained on the context it was sampled from.
        ``constrained``: a grammar-sampled step's tokens, as in :meth:`learner_arrays`.
        """
        if self.whole_history:
            return [self.learner_arrays(constrained=constrained)]
        check_constrained(constrained)
        rows = []
        for step, start in zip(self.steps, self.action_starts(), strict=True):
            context = self.token_ids[:start] if step.context_ids is None else step.context_ids
            k, n = len(context), len(step.action_ids)
            mask = np.zeros(k + n, np.float32)
            mask[k:] = 0.0 if step.constrained and constrained == "mask" else 1.0
            forced = np.zeros(k + n, np.float32)
            forced[k:] = float(step.constrained)
            old = np.zeros(k + n, np.float32)
            old[k:] = step.logprobs
            versions = np.full(k + n, -1, np.int32)
            versions[k:] = step.versions
            rows.append(
                {
                    "input_ids": np.asarray(list(context) + step.action_ids, np.int32),
                    "loss_mask": mask,
                    "constrained": forced,
                    "old_logprobs": old,
                    "versions": versions,
                }
            )
        return rows
