"""The rollout service's wire format: tasks, trajectories, groups and group requests as JSON.

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
from typing import Any, Literal, get_args

from tunix_agentic.envs.base import SPLITS, Task
from tunix_agentic.envs.remote import task_from_json as remote_task_from_json
from tunix_agentic.envs.remote import task_to_json as remote_task_to_json
from tunix_agentic.rollout.episode import Group
from tunix_agentic.serving.client import LOGPROB_TOLERANCE
from tunix_agentic.trajectory import Step, Trajectory

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


# ------------------------------------------------------------------ checks
def _obj(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a JSON object, got {type(raw).__name__}")
    return raw


def _int(raw: Any, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ValueError(f"{where} must be an integer, got {raw!r:.80}")
    if lo is not None and raw < lo:
        raise ValueError(f"{where} must be >= {lo}, got {raw}")
    if hi is not None and raw > hi:
        raise ValueError(f"{where} must be <= {hi}, got {raw}")
    return raw


def _float(raw: Any, where: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise ValueError(f"{where} must be a number, got {raw!r:.80}")
    return float(raw)


def _bool(raw: Any, where: str) -> bool:
    if not isinstance(raw, bool):
        raise ValueError(f"{where} must be true or false, got {raw!r:.80}")
    return raw


def _str(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"{where} must be a string, got {raw!r:.80}")
    return raw


def _ints(raw: Any, where: str) -> list[int]:
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of integers")
    # One pass without a call per element in the usual case (a group holds thousands);
    # the slow path names the first bad element.
    if all(type(x) is int for x in raw):
        return list(raw)
    return [_int(x, f"{where}[{i}]") for i, x in enumerate(raw)]


def _floats(raw: Any, where: str) -> list[float]:
    if not isinstance(raw, list):
        raise ValueError(f"{where} must be a list of numbers")
    if all(type(x) is float for x in raw):
        return list(raw)
    return [_float(x, f"{where}[{i}]") for i, x in enumerate(raw)]


def _logprobs(raw: Any, where: str) -> list[float]:
    """Sampler logprobs: numbers, finite and <= 0 (up to ``LOGPROB_TOLERANCE`` of float
    noise); a node that sends others is refused, naming the first."""
    values = _floats(raw, where)
    if not all(-math.inf < x <= LOGPROB_TOLERANCE for x in values):
        i = next(i for i, x in enumerate(values) if not -math.inf < x <= LOGPROB_TOLERANCE)
        raise ValueError(f"{where}[{i}] must be a finite logprob <= 0, got {values[i]!r}")
    return values


def _times(raw: Any, where: str) -> dict[str, float]:
    return {_str(k, f"{where} key"): _float(v, f"{where}.{k}") for k, v in _obj(raw, where).items()}


def _unknown(obj: Mapping[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(obj) - known)
    if extra:
        raise ValueError(f"{where}.{extra[0]} is not a known field (known: {sorted(known)})")


def _need(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise ValueError(f"{where}.{key} is required")
    return obj[key]


# ------------------------------------------------------------------- tasks
def task_to_json(task: Any) -> dict[str, Any]:
    """A task (a dataclass instance: :class:`~tunix_agentic.envs.base.Task` or an
    environment's own, such as the calculator's) as ``{"type": "module:QualName",
    "fields": {...}}``, as remote environments send it (tuples arrive as lists)."""
    return remote_task_to_json(task)


def task_from_json(
    obj: Any, where: str = "task", *, types: Mapping[str, type] | None = None
) -> Any:
    """The task :func:`task_to_json` wrote. ``types``: the classes accepted, by wire name
    (a server passes its environments' task classes); None: any dataclass of a module
    already imported (for answers from a trusted node). A plain ``{task_id, prompt,
    answer?, data?, task_name?}`` object is an :class:`~tunix_agentic.envs.base.Task`."""
    obj = _obj(obj, where)
    if "type" not in obj:
        _unknown(obj, {"task_id", "prompt", "answer", "data", "task_name"}, where)
        return Task(
            task_id=_str(_need(obj, "task_id", where), f"{where}.task_id"),
            prompt=_str(_need(obj, "prompt", where), f"{where}.prompt"),
            answer=obj.get("answer"),
            data=dict(_obj(obj.get("data", {}), f"{where}.data")),
            task_name=_str(obj.get("task_name", "default"), f"{where}.task_name"),
        )
    if types is None:
        name = _str(obj["type"], f"{where}.type")
        module, _, qualname = name.partition(":")
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


_STEP_FIELDS = {f.name for f in dataclasses.fields(Step)}
_TRAJ_FIELDS = {f.name for f in dataclasses.fields(Trajectory)}


def _step_from_json(obj: Any, where: str) -> Step:
    obj = _obj(obj, where)
    _unknown(obj, _STEP_FIELDS, where)
    done = obj.get("done", False)
    if not isinstance(done, bool):
        raise ValueError(f"{where}.done must be a boolean")
    calls = obj.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls must be a list")
    context = obj.get("context_ids")
    return Step(
        context_len=_int(_need(obj, "context_len", where), f"{where}.context_len", lo=0),
        action_ids=_ints(_need(obj, "action_ids", where), f"{where}.action_ids"),
        logprobs=_logprobs(_need(obj, "logprobs", where), f"{where}.logprobs"),
        versions=_ints(_need(obj, "versions", where), f"{where}.versions"),
        finish_reason=_str(_need(obj, "finish_reason", where), f"{where}.finish_reason"),
        observation_ids=_ints(obj.get("observation_ids", []), f"{where}.observation_ids"),
        reward=_float(obj.get("reward", 0.0), f"{where}.reward"),
        done=done,
        action_text=_str(obj.get("action_text", ""), f"{where}.action_text"),
        tool_calls=list(calls),
        timings=_times(obj.get("timings", {}), f"{where}.timings"),
        context_ids=None if context is None else _ints(context, f"{where}.context_ids"),
        constrained=_bool(obj.get("constrained", False), f"{where}.constrained"),
    )


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
    obj = _obj(obj, where)
    _unknown(obj, _TRAJ_FIELDS, where)
    steps = obj.get("steps", [])
    if not isinstance(steps, list):
        raise ValueError(f"{where}.steps must be a list")
    error = obj.get("error")
    return Trajectory(
        task_id=_str(_need(obj, "task_id", where), f"{where}.task_id"),
        episode_id=_str(_need(obj, "episode_id", where), f"{where}.episode_id"),
        task_name=_str(obj.get("task_name", "default"), f"{where}.task_name"),
        group_id=_str(obj.get("group_id", ""), f"{where}.group_id"),
        prompt_len=_int(obj.get("prompt_len", 0), f"{where}.prompt_len", lo=0),
        token_ids=_ints(obj.get("token_ids", []), f"{where}.token_ids"),
        steps=[_step_from_json(s, f"{where}.steps[{i}]") for i, s in enumerate(steps)],
        reward=_float(obj.get("reward", 0.0), f"{where}.reward"),
        status=_str(obj.get("status", "ok"), f"{where}.status"),
        error=None if error is None else _str(error, f"{where}.error"),
        timings=_times(obj.get("timings", {}), f"{where}.timings"),
        info=dict(_obj(obj.get("info", {}), f"{where}.info")),
    )


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
    obj = _obj(obj, where)
    _unknown(
        obj,
        {"group_id", "index", "task", "admitted_version", "trajectories", "dropped", "lost"},
        where,
    )
    trajs, dropped = obj.get("trajectories", []), obj.get("dropped", [])
    for key, value in (("trajectories", trajs), ("dropped", dropped)):
        if not isinstance(value, list):
            raise ValueError(f"{where}.{key} must be a list")
    return Group(
        group_id=_str(_need(obj, "group_id", where), f"{where}.group_id"),
        index=_int(_need(obj, "index", where), f"{where}.index"),
        task=task_from_json(_need(obj, "task", where), f"{where}.task"),
        admitted_version=_int(_need(obj, "admitted_version", where), f"{where}.admitted_version"),
        trajectories=[
            trajectory_from_json(t, f"{where}.trajectories[{i}]") for i, t in enumerate(trajs)
        ],
        dropped=[trajectory_from_json(t, f"{where}.dropped[{i}]") for i, t in enumerate(dropped)],
        lost=_int(obj.get("lost", 0), f"{where}.lost", lo=0),
    )


# ---------------------------------------------------------------- requests
MAX_GROUP_ID_CHARS = 200
MAX_NUM_SAMPLES = 1024
_SEED_MAX = 2**64 - 1


@dataclasses.dataclass(frozen=True)
class TaskRef:
    """Task ``index`` of ``split`` of the node config's task source ``source``."""

    source: str
    split: str
    index: int

    @classmethod
    def from_json(cls, raw: Any, where: str = "task_ref") -> TaskRef:
        obj = _obj(raw, where)
        _unknown(obj, {"source", "split", "index"}, where)
        split = _str(obj.get("split", "train"), f"{where}.split")
        if split not in SPLITS:
            raise ValueError(f"{where}.split must be one of {SPLITS}, got {split!r}")
        return cls(
            source=_str(_need(obj, "source", where), f"{where}.source"),
            split=split,
            index=_int(_need(obj, "index", where), f"{where}.index", lo=0),
        )

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
        obj = _obj(raw, where)
        _unknown(obj, {"temperature", "top_p", "top_k", "max_tokens"}, where)

        def opt(key, conv):
            return None if obj.get(key) is None else conv(obj[key], f"{where}.{key}")

        return cls(
            temperature=opt("temperature", _float),
            top_p=opt("top_p", _float),
            top_k=opt("top_k", _int),
            max_tokens=opt("max_tokens", _int),
        )

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
        obj = _obj(raw, where)
        _unknown(obj, {"run_seed", "stream", "index"}, where)
        return cls(
            **{
                k: _int(obj.get(k, 0), f"{where}.{k}", lo=0, hi=_SEED_MAX)
                for k in ("run_seed", "stream", "index")
            }
        )

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


_REQUEST_FIELDS = {
    "group_id",
    "env",
    "env_kwargs",
    "task",
    "task_ref",
    "num_samples",
    "sampling",
    "max_turns",
    "policy_version",
    "priority",
    "timeout_s",
    "min_usable",
    "seed",
    "agent",
}

# Who runs a group's episodes: the node's own agent loop; outside agents that claim them
# (``POST /v1/episodes/claim``) and call the node's OpenAI-compatible endpoint; or outside
# agents that run tasks of their own through that endpoint and close each episode with a
# reward and a task id (the node groups those by task id).
AgentKind = Literal["builtin", "external", "own_tasks"]
AGENT_KINDS: tuple[str, ...] = get_args(AgentKind)


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
    task: Any = None  # a task dataclass (envs.base.Task or an environment's own)
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
        obj = _obj(raw, "request body")
        _unknown(obj, _REQUEST_FIELDS, "request")
        task, ref = obj.get("task"), obj.get("task_ref")
        if isinstance(task, Mapping) and "source" in task and "prompt" not in task:
            if ref is not None:
                raise ValueError("task: give exactly one of task and task_ref")
            task, ref = None, task
        env = obj.get("env")
        kwargs = obj.get("env_kwargs") or {}
        timeout = obj.get("timeout_s")
        turns, usable = obj.get("max_turns"), obj.get("min_usable")
        return cls(
            group_id=_str(_need(obj, "group_id", "request"), "group_id"),
            num_samples=_int(_need(obj, "num_samples", "request"), "num_samples"),
            policy_version=_int(obj.get("policy_version", 0), "policy_version"),
            task=None if task is None else task_from_json(task, types=task_types),
            task_ref=None if ref is None else TaskRef.from_json(ref),
            env=None if env is None else _str(env, "env"),
            env_kwargs=dict(_obj(kwargs, "env_kwargs")),
            sampling=SamplingSpec.from_json(obj.get("sampling") or {}),
            max_turns=None if turns is None else _int(turns, "max_turns"),
            priority=_int(obj.get("priority", 0), "priority", lo=-(2**31), hi=2**31),
            timeout_s=None if timeout is None else _float(timeout, "timeout_s"),
            min_usable=None if usable is None else _int(usable, "min_usable"),
            seed=SeedSpec.from_json(obj.get("seed") or {}),
            agent=_str(obj.get("agent", "builtin"), "agent"),
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
