"""The rollout service's wire format: tasks, trajectories, groups and group requests as JSON.

Both sides import it: the node (:mod:`tunix_agentic.rollout.service`), its OpenAI endpoint
(:mod:`tunix_agentic.rollout.openai_endpoint`) and the trainer's client
(:mod:`tunix_agentic.rollout.client`), none of which imports another for the format.

Every ``*_to_json`` returns plain JSON-able values and its ``*_from_json`` rebuilds an
equal object: token ids, logprobs (Python floats print as their shortest exact repr, so
they come back bit for bit), per-token versions, timings, info, status and error. A
``*_from_json`` raises ``ValueError`` naming the field that is missing or of the wrong
type. Host-side only: nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field

from tunix_agentic.envs.base import SPLITS, Task
from tunix_agentic.envs.remote import task_from_json as remote_task_from_json
from tunix_agentic.envs.remote import task_to_json as remote_task_to_json
from tunix_agentic.rollout.config import AGENT_KINDS, AgentKind
from tunix_agentic.rollout.episode import Group
from tunix_agentic.serving.client import LOGPROB_TOLERANCE
from tunix_agentic.serving.validation import Strict, invalid, validate
from tunix_agentic.trajectory import Step, TaskLike, Trajectory

__all__ = [
    "FINAL_STATUSES",
    "GroupRequest",
    "GroupStatus",
    "SamplingSpec",
    "SeedSpec",
    "TaskRef",
    "group_from_json",
    "group_to_json",
    "task_from_json",
    "task_to_json",
    "trajectory_from_json",
    "trajectory_to_json",
]


# A group's life on a node: queued -> running -> one final status. ``lost``: a node
# restarted before the group finished (resubmit it with the same id and body).
GroupStatus = Literal["queued", "running", "done", "cancelled", "failed", "lost"]
STATUSES: tuple[str, ...] = get_args(GroupStatus)
FINAL_STATUSES = frozenset({"done", "cancelled", "failed", "lost"})


# ------------------------------------------------------------------ models
# The JSON each *_from_json reads, checked by pydantic (tunix_agentic.serving.validation).
# A group holds thousands of ids: stop at the first bad one.
Ids = Annotated[list[int], Field(fail_fast=True)]
Count = Annotated[int, Field(ge=0)]


def _logprobs(values: list[float]) -> list[float]:
    """Sampler logprobs are finite and <= 0 (up to ``LOGPROB_TOLERANCE`` of float noise):
    a node that sends others is refused, naming the first."""
    for i, x in enumerate(values):
        if not -math.inf < x <= LOGPROB_TOLERANCE:
            raise invalid(f"must be a finite logprob <= 0, got {x!r}", i)
    return values


class _Task(Strict):
    task_id: str
    prompt: str
    answer: Any = None
    data: dict[str, Any] = {}
    task_name: str = "default"


class _Step(Strict):
    context_len: Count
    action_ids: Ids
    logprobs: Annotated[list[float], AfterValidator(_logprobs)]
    versions: Ids
    finish_reason: str
    observation_ids: Ids = []
    reward: float = 0.0
    done: bool = False
    action_text: str = ""
    tool_calls: list[Any] = []
    timings: dict[str, float] = {}
    context_ids: Ids | None = None
    constrained: bool = False


class _Trajectory(Strict):
    task_id: str
    episode_id: str
    task_name: str = "default"
    group_id: str = ""
    prompt_len: Count = 0
    token_ids: Ids = []
    steps: list[_Step] = []
    reward: float = 0.0
    status: str = "ok"
    error: str | None = None
    timings: dict[str, float] = {}
    info: dict[str, Any] = {}

    def build(self) -> Trajectory:
        return Trajectory(**{**dict(self), "steps": [Step(**dict(s)) for s in self.steps]})


class _Group(Strict):
    group_id: str
    index: int
    task: dict[str, Any]  # task_to_json's object
    admitted_version: int
    trajectories: list[_Trajectory] = []
    dropped: list[_Trajectory] = []
    lost: Count = 0


# ------------------------------------------------------------------- tasks
def task_to_json(task: TaskLike) -> dict[str, Any]:
    """A task (a dataclass instance: :class:`~tunix_agentic.envs.base.Task` or an
    environment's own, such as the calculator's) as ``{"type": "module:QualName",
    "fields": {...}}``, as remote environments send it (tuples arrive as lists)."""
    return remote_task_to_json(task)


def task_from_json(
    obj: Any, where: str = "task", *, types: Mapping[str, type] | None = None
) -> TaskLike:
    """The task :func:`task_to_json` wrote. ``types``: the classes accepted, by wire name
    (a server passes its environments' task classes); None: any dataclass of a module
    already imported (for answers from a trusted node). A plain ``{task_id, prompt,
    answer?, data?, task_name?}`` object is an :class:`~tunix_agentic.envs.base.Task`."""
    if not isinstance(obj, Mapping) or "type" not in obj:
        return Task(**dict(validate(_Task, obj, root=where, sep=" ")))
    if types is None:
        name = obj["type"]
        module, _, qualname = str(name).partition(":")
        cls = getattr(sys.modules.get(module), qualname, None)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{where}.type: no dataclass {name!r} among the imported modules")
        types = {name: cls}
    try:
        return remote_task_from_json(obj, types)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


# ------------------------------------------------------------ trajectories
def _step_to_json(step: Step) -> dict[str, Any]:
    # "constrained" only when true: the bodies of logs written before it stay the same.
    return ({"constrained": True} if step.constrained else {}) | {
        "context_len": step.context_len,
        "action_ids": [int(t) for t in step.action_ids],
        "logprobs": [float(x) for x in step.logprobs],
        "versions": [int(v) for v in step.versions],
        "finish_reason": step.finish_reason,
        "observation_ids": [int(t) for t in step.observation_ids],
        "reward": float(step.reward),
        "done": bool(step.done),
        "action_text": step.action_text,
        "tool_calls": list(step.tool_calls),
        "timings": {k: float(v) for k, v in step.timings.items()},
        "context_ids": None if step.context_ids is None else [int(t) for t in step.context_ids],
    }


def trajectory_to_json(t: Trajectory) -> dict[str, Any]:
    """Every field of ``t``, its steps included, as JSON-able values (exact round trip)."""
    return {
        "task_id": t.task_id,
        "episode_id": t.episode_id,
        "task_name": t.task_name,
        "group_id": t.group_id,
        "prompt_len": t.prompt_len,
        "token_ids": [int(x) for x in t.token_ids],
        "steps": [_step_to_json(s) for s in t.steps],
        "reward": float(t.reward),
        "status": t.status,
        "error": t.error,
        "timings": {k: float(v) for k, v in t.timings.items()},
        "info": dict(t.info),
    }


def trajectory_from_json(obj: Any, where: str = "trajectory") -> Trajectory:
    return validate(_Trajectory, obj, root=where, sep=" ").build()


# ------------------------------------------------------------------ groups
def group_to_json(g: Group) -> dict[str, Any]:
    """``{group_id, index, task, admitted_version, trajectories, dropped, lost}``."""
    return {
        "group_id": g.group_id,
        "index": g.index,
        "task": task_to_json(g.task),
        "admitted_version": g.admitted_version,
        "trajectories": [trajectory_to_json(t) for t in g.trajectories],
        "dropped": [trajectory_to_json(t) for t in g.dropped],
        "lost": g.lost,
    }


def group_from_json(obj: Any, where: str = "group") -> Group:
    g = validate(_Group, obj, root=where, sep=" ")
    return Group(
        group_id=g.group_id,
        index=g.index,
        task=task_from_json(g.task, f"{where}.task"),
        admitted_version=g.admitted_version,
        trajectories=[t.build() for t in g.trajectories],
        dropped=[t.build() for t in g.dropped],
        lost=g.lost,
    )


# ---------------------------------------------------------------- requests
MAX_GROUP_ID_CHARS = 200
MAX_NUM_SAMPLES = 1024


@dataclasses.dataclass(frozen=True)
class TaskRef:
    """Task ``index`` of ``split`` of the node config's task source ``source``."""

    source: str
    split: str
    index: int

    @classmethod
    def from_json(cls, raw: Any, where: str = "task_ref") -> TaskRef:
        return cls(**dict(validate(_TaskRef, raw, root=where, sep=" ")))

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "split": self.split, "index": self.index}


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
    """Per-group sampling; ``None`` leaves the node config's ``agent.*`` value."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None

    def __post_init__(self):
        t, p = self.temperature, self.top_p
        if t is not None and not (math.isfinite(t) and t >= 0):
            raise ValueError(f"sampling.temperature must be finite and >= 0, got {t}")
        if p is not None and not 0 < p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {p}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"sampling.top_k must be >= 0, got {self.top_k}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens must be >= 1, got {self.max_tokens}")

    @classmethod
    def from_json(cls, raw: Any, where: str = "sampling") -> SamplingSpec:
        return cls(**dict(validate(_SamplingSpec, raw, root=where, sep=" ")))

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class SeedSpec:
    """What every member's sampling seed derives from:
    ``episode_seed(run_seed, stream, index, member, attempt)``, as in-process runs do."""

    run_seed: int = 0
    stream: int = 0
    index: int = 0

    @classmethod
    def from_json(cls, raw: Any, where: str = "seed") -> SeedSpec:
        return cls(**dict(validate(_SeedSpec, raw, root=where, sep=" ")))

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


class _TaskRef(Strict):
    source: str
    split: Literal[SPLITS] = "train"  # type: ignore[valid-type]
    index: Count


class _SamplingSpec(Strict):  # ranges: SamplingSpec's own
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None


Seed = Annotated[int, Field(ge=0, le=2**64 - 1)]


class _SeedSpec(Strict):
    run_seed: Seed = 0
    stream: Seed = 0
    index: Seed = 0


class _Request(Strict):  # the rest: GroupRequest's own checks
    group_id: str
    num_samples: int
    policy_version: int = 0
    task: dict[str, Any] | None = None  # task_to_json's object
    task_ref: _TaskRef | None = None
    env: str | None = None
    env_kwargs: dict[str, Any] | None = None
    sampling: _SamplingSpec | None = None
    max_turns: int | None = None
    priority: Annotated[int, Field(ge=-(2**31), le=2**31)] = 0
    timeout_s: float | None = None
    min_usable: int | None = None
    seed: _SeedSpec | None = None
    agent: str = "builtin"


@dataclasses.dataclass(frozen=True)
class GroupRequest:
    """One group to run: ``num_samples`` episodes of one task (exactly one of ``task`` and
    ``task_ref``), admitted under ``policy_version``.

    ``group_id`` is the client's and makes a submission idempotent: the same id with the
    same :meth:`to_json` answers the same, another body is a conflict. ``env`` None: the
    node config's environment; ``env_kwargs``: only keywords the environment accepts from
    clients. ``min_usable``: once that many members ended usable (not an infrastructure
    failure), the rest are cancelled. ``timeout_s``: the group fails after it.
    ``priority``: higher runs first when groups wait for a slot. ``agent``: ``"builtin"``
    (the node's agent loop), ``"external"`` (its members are offered to outside agents) or
    ``"own_tasks"`` (the group is the next ``num_samples`` episodes that outside agents ran
    on one task of their own; ``task`` is not run): see
    :mod:`~tunix_agentic.rollout.service.node_http`. The canonical body names it only when
    not builtin, so groups logged before the field existed keep their bodies.
    """

    group_id: str
    num_samples: int
    policy_version: int = 0
    task: TaskLike | None = None  # a task dataclass (envs.base.Task or an environment's own)
    task_ref: TaskRef | None = None
    env: str | None = None
    env_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    sampling: SamplingSpec = SamplingSpec()
    max_turns: int | None = None
    priority: int = 0
    timeout_s: float | None = None
    min_usable: int | None = None
    seed: SeedSpec = SeedSpec()
    agent: AgentKind = "builtin"

    def __post_init__(self):
        if self.agent not in AGENT_KINDS:
            raise ValueError(f"agent must be one of {AGENT_KINDS}, got {self.agent!r:.80}")
        if not self.group_id or len(self.group_id) > MAX_GROUP_ID_CHARS:
            raise ValueError(f"group_id must be 1 to {MAX_GROUP_ID_CHARS} characters")
        if any(c in self.group_id for c in "/?#") or not self.group_id.isprintable():
            raise ValueError("group_id must be printable and hold no '/', '?' or '#'")
        if (self.task is None) == (self.task_ref is None):
            raise ValueError("task: give exactly one of task and task_ref")
        if not 1 <= self.num_samples <= MAX_NUM_SAMPLES:
            raise ValueError(
                f"num_samples must be in [1, {MAX_NUM_SAMPLES}], got {self.num_samples}"
            )
        if self.policy_version < 0:
            raise ValueError(f"policy_version must be >= 0, got {self.policy_version}")
        if self.max_turns is not None and self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.timeout_s is not None and not (
            math.isfinite(self.timeout_s) and self.timeout_s > 0
        ):
            raise ValueError(f"timeout_s must be a finite number > 0, got {self.timeout_s}")
        if self.min_usable is not None and not 1 <= self.min_usable <= self.num_samples:
            raise ValueError(
                f"min_usable must be in [1, num_samples={self.num_samples}], got {self.min_usable}"
            )

    @classmethod
    def from_json(cls, raw: Any, *, task_types: Mapping[str, type] | None = None) -> GroupRequest:
        """A validated request; ``ValueError`` naming the field otherwise. ``task`` may also
        be given as a ``{source, split, index}`` reference (the same as ``task_ref``);
        ``task_types``: see :func:`task_from_json`."""
        m = validate(_Request, raw, root="request", sep=" ")
        task, ref = m.task, m.task_ref and TaskRef(**dict(m.task_ref))
        if isinstance(task, Mapping) and "source" in task and "prompt" not in task:
            if ref is not None:
                raise ValueError("task: give exactly one of task and task_ref")
            task, ref = None, TaskRef.from_json(task, "request.task")
        if task is not None:
            task = task_from_json(task, "request.task", types=task_types)
        return cls(
            **{
                **dict(m),
                "task": task,
                "task_ref": ref,
                "env_kwargs": m.env_kwargs or {},
                "sampling": SamplingSpec(**dict(m.sampling or {})),
                "seed": SeedSpec(**dict(m.seed or {})),
            }
        )

    def to_json(self) -> dict[str, Any]:
        """The canonical body (defaults filled in): equal requests give equal dicts."""
        body = {
            "group_id": self.group_id,
            "env": self.env,
            "env_kwargs": dict(self.env_kwargs),
            "task": None if self.task is None else task_to_json(self.task),
            "task_ref": None if self.task_ref is None else self.task_ref.to_json(),
            "num_samples": self.num_samples,
            "sampling": self.sampling.to_json(),
            "max_turns": self.max_turns,
            "policy_version": self.policy_version,
            "priority": self.priority,
            "timeout_s": self.timeout_s,
            "min_usable": self.min_usable,
            "seed": self.seed.to_json(),
        }
        if self.agent != "builtin":
            body["agent"] = self.agent
        return body
