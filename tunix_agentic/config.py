"""Run configuration: frozen, typed dataclasses loaded from YAML with dotted overrides.

``load_config("configs/calculator_tiny.yaml", ["rl.steps=20"])`` returns a
validated :class:`RunConfig`. An unknown key, a value of the wrong type or an
out-of-range value raises ``ValueError`` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml

import tunix_agentic.envs  # noqa: F401  (registers the built-in environments, validated by name below)
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import available_envs, import_env_modules
from tunix_agentic.envs.sandbox import SandboxConfig
from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.learners.configs import OptimizerConfig
from tunix_agentic.learners.grpo_config import GRPOConfig
from tunix_agentic.metrics.config import MetricsConfig
from tunix_agentic.metrics.trace import TraceConfig
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.rollout.config import RolloutConfig


class ConfigError(ValueError):
    """A config (file, override or resumed run) that cannot be run; the message names the key."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The run's environment: a registered name, the user modules that register theirs
    (``import:`` in YAML, a module path or a list), the factory's keyword arguments, the
    per-call tool timeout and the sandbox (each passed to environments whose factory takes
    ``tool_timeout`` / ``sandbox``).

    Constructing one imports nothing: :func:`load_config` imports ``imports`` and then
    checks the environment names (:func:`import_envs`; a config built in Python calls it
    itself, or imports its modules)."""

    # The registered environment (built in: arithmetic, countdown, frozenlake, math_python,
    # remote, swe_lite; env.import adds yours); the default of tasks[].env.
    name: str = "arithmetic"
    # Modules imported before environment names are checked, so they register theirs (and
    # their tool-call parsers): module paths ("mypkg.myenv") or .py files; one string is a list
    # of one.
    imports: tuple[str, ...] = ()
    # Keyword arguments of env.name's factory, for every task source whose environment is
    # env.name (tasks[].env_kwargs overrides them key by key).
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    tool_timeout_s: float | None = None  # None: each environment's own default
    # Each episode's sandbox (environments whose factory takes ``sandbox``: math_python,
    # swe_lite, yours); `tunix-agentic sandbox --config RUN.yaml -- CMD` runs CMD in it.
    sandbox: SandboxConfig = SandboxConfig()

    config_aliases = {"import": "imports"}

    def __post_init__(self):
        imports = (self.imports,) if isinstance(self.imports, str) else tuple(self.imports)
        # A .py file is kept by its absolute path: a resumed run may start elsewhere.
        imports = tuple(os.path.abspath(m) if m.endswith(".py") else m for m in imports)
        object.__setattr__(self, "imports", imports)
        if not isinstance(self.kwargs, dict):
            raise ValueError(f"env.kwargs must be a mapping, got {self.kwargs!r}")
        if self.tool_timeout_s is not None and not self.tool_timeout_s > 0:
            raise ValueError(f"env.tool_timeout_s must be > 0, got {self.tool_timeout_s}")


def import_envs(cfg: RunConfig) -> None:
    """Import ``cfg.env.imports`` (the user's modules register their environments), then
    check that every environment ``cfg`` names is registered.

    Raises ``ValueError`` naming the module that cannot be imported or the key whose
    environment is unknown.
    """
    import_env_modules(cfg.env.imports)
    _check_env_name(cfg.env.name, "env.name")
    for i, t in enumerate(cfg.tasks):
        _check_env_name(t.env, f"tasks[{i}].env")
        if t.tasks_from:
            _check_env_name(t.tasks_from, f"tasks[{i}].tasks_from")


def _check_env_name(name: str, key: str) -> None:
    if name not in available_envs():
        raise ValueError(
            f"{key}: unknown environment {name!r}; registered: {', '.join(available_envs())} "
            "(a module of yours registers its environments with tunix_agentic.envs.register_env "
            "when imported: name it in env.import)"
        )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """The warm start: supervised steps on generated demonstrations."""

    steps: int = 1500  # supervised steps before RL; 0: no warm start
    # Learner rows per step: one per demonstration, or one per step of it under a context rule
    # that shows less than the whole history (rows carry over between batches).
    batch_size: int = 32
    # Probability that a demonstration uses the tools (where its task allows both); in [0, 1].
    tool_fraction: float = 0.4
    # Pack several demonstrations into each padded row (each its own segment: positions
    # from 0, attention within itself): the same loss over fewer slots. False: one a row.
    pack: bool = True
    optimizer: OptimizerConfig = OptimizerConfig(learning_rate=3e-3, warmup_steps=50)

    def __post_init__(self):
        if self.steps < 0 or self.batch_size < 1:
            raise ValueError("sft.steps must be >= 0 and sft.batch_size >= 1")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"sft.tool_fraction must be in [0, 1], got {self.tool_fraction}")


# How an evaluation run beside training shares the engine (``rl.eval_priority``).
EvalPriority = Literal["high", "low"]
EVAL_PRIORITIES: tuple[EvalPriority, ...] = get_args(EvalPriority)


@dataclasses.dataclass(frozen=True)
class RLConfig:
    # Learner steps, each one optimizer update on one batch (rollout.groups_per_batch groups);
    # 0: no RL (the warm start and the evaluations before and after still run).
    steps: int = 60
    # Held-out tasks of each task source per evaluation (before RL, after it, and every
    # eval_every); a source with fewer held-out tasks runs all it has.
    eval_tasks: int = 200
    # The sampling temperature of evaluations (in place of agent.temperature); 0: greedy.
    eval_temperature: float = 0.0
    # Every this many RL steps (and after the warm start, and at the end) a checkpoint is
    # written in the background; 0: only after the warm start and at the end.
    checkpoint_every: int = 10
    keep_checkpoints: int = 3  # the newest this many are kept
    # Every this many RL steps the held-out split is evaluated while training goes on, at
    # the version then on the engine (logged at that step); 0: only before and after RL.
    # See tunix_agentic.rl_loop.PeriodicEval.
    eval_every: int = 0
    # How an eval_every evaluation shares the engine with training. "high": no new training
    # group is admitted while it runs (it ends sooner, and the weights it holds back reach
    # the engine sooner); "low": its tasks run one at a time beside training.
    eval_priority: EvalPriority = "high"

    def __post_init__(self):
        if self.steps < 0 or self.eval_tasks < 0 or self.checkpoint_every < 0:
            raise ValueError("rl.steps, rl.eval_tasks and rl.checkpoint_every must be >= 0")
        if self.eval_every < 0:
            raise ValueError(f"rl.eval_every must be >= 0 (0: off), got {self.eval_every}")
        if self.eval_priority not in EVAL_PRIORITIES:
            raise ValueError(
                f"rl.eval_priority must be 'high' or 'low', got {self.eval_priority!r}"
            )
        if self.keep_checkpoints < 1:
            raise ValueError(f"rl.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
        if not 0 <= self.eval_temperature < float("inf"):
            raise ValueError(
                f"rl.eval_temperature must be finite and >= 0, got {self.eval_temperature}"
            )


@dataclasses.dataclass(frozen=True)
class TaskSourceConfig:
    """One task source of a (multi-environment) run.

    ``env`` is the environment its tasks run in (default: ``env.name``); ``name`` tags
    every trajectory, metric and held-out figure (default: the environment's name).
    Tasks come from the task source registered with ``tasks_from`` (default: ``env``;
    a ``remote`` source names the served environment here), or from ``train_file`` /
    ``heldout_file`` (JSONL or parquet records: ``prompt``, ``answer``, the rest as
    data) when given. ``weight`` is the source's share of the stream (exact quotas),
    ``env_kwargs`` the keyword arguments of its environment (over ``env.kwargs`` when
    it is ``env.name``).
    """

    # Tags the source's trajectories, metrics and held-out figures; "": the environment's
    # name. Two sources of one run need distinct names.
    name: str = ""
    env: str = ""  # the environment its tasks run in; "": env.name
    # The registered environment whose task source supplies the tasks; "": env itself (with
    # env "remote", name the served environment here). Not used with train_file.
    tasks_from: str = ""
    # The source's share of the train stream, relative to the other sources' weights (exact
    # quotas); > 0.
    weight: float = 1.0
    # Added to the run's seed for this source's train stream (two sources of one
    # environment draw different tasks); >= 0.
    seed_offset: int = 0
    # Train tasks from a file instead of tasks_from: JSONL, JSON or parquet records of
    # "prompt" (required), "answer", "task_id" and other keys (the task's data).
    train_file: str | None = None
    # Held-out tasks from such a file (needs train_file); null with train_file: the source has
    # no held-out tasks and is not evaluated.
    heldout_file: str | None = None
    # Keyword arguments of the source's environment factory; when env is env.name they
    # override env.kwargs key by key.
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not self.weight > 0:
            raise ValueError(f"tasks[].weight must be > 0, got {self.weight}")
        if self.seed_offset < 0:
            raise ValueError(f"tasks[].seed_offset must be >= 0, got {self.seed_offset}")
        if not isinstance(self.env_kwargs, dict):
            raise ValueError(f"tasks[].env_kwargs must be a mapping, got {self.env_kwargs!r}")


@dataclasses.dataclass(frozen=True)
class CrossPolicyConfig:
    """AgentRL cross-policy sampling: extra engines kept ``stale_every`` versions behind."""

    stale_engines: int = 0  # 0: off
    # The stale engines get the new weights only at versions that are a multiple of this
    # (so they lag by up to stale_every - 1 versions); >= 1.
    stale_every: int = 4
    # Probability that a model call goes to the fresh engine (the newest weights); the rest
    # are spread evenly over the stale engines. In [0, 1].
    fresh_fraction: float = 0.5

    def __post_init__(self):
        if self.stale_engines < 0 or self.stale_every < 1:
            raise ValueError(
                "cross_policy.stale_engines must be >= 0 and cross_policy.stale_every >= 1"
            )
        if not 0.0 <= self.fresh_fraction <= 1.0:
            raise ValueError(
                f"cross_policy.fresh_fraction must be in [0, 1], got {self.fresh_fraction}"
            )


@dataclasses.dataclass(frozen=True)
class RunConfig:
    # Seeds the model's initialisation, the task streams (plus tasks[].seed_offset), the
    # SFT demonstrations, LoRA's adapters and cross-policy picks; episodes use rollout.seed.
    seed: int = 0
    # Where the run writes (config.yaml, checkpoints/, tensorboard/, trace/, transcripts/);
    # a fresh run where one exists goes to run_dir-2, -3, ...
    run_dir: str = "runs/calculator_tiny"
    model: ModelConfig = ModelConfig()
    engine: EngineConfig = EngineConfig()
    agent: AgentConfig = AgentConfig()
    rollout: RolloutConfig = RolloutConfig()
    learner: GRPOConfig = GRPOConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    env: EnvConfig = EnvConfig()
    tasks: tuple[TaskSourceConfig, ...] = (TaskSourceConfig(),)
    cross_policy: CrossPolicyConfig = CrossPolicyConfig()
    trace: TraceConfig = TraceConfig()  # the run's timeline (tunix_agentic.metrics.trace)
    metrics: MetricsConfig = MetricsConfig()  # percentiles, layout, W&B (metrics/config.py)

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("tasks must name at least one task source")
        resolved = []
        for t in self.tasks:
            env = t.env or self.env.name
            resolved.append(dataclasses.replace(t, env=env, name=t.name or env))
        object.__setattr__(self, "tasks", tuple(resolved))
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(
                f"tasks names must be distinct, got {names} (give tasks[].name to tell "
                "two sources of one environment apart)"
            )
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if self.agent.top_k > self.model.vocab_size:
            raise ValueError(
                f"agent.top_k ({self.agent.top_k}) must be at most model.vocab_size "
                f"({self.model.vocab_size})"
            )
        if self.agent.temperature != self.learner.temperature and self.agent.temperature > 0:
            raise ValueError(
                f"learner.temperature ({self.learner.temperature}) must equal agent.temperature "
                f"({self.agent.temperature}) so the learner scores tokens under the sampling policy"
            )


def _convert(tp: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"config key '{key}' must be a mapping, got {type(value).__name__}")
        return from_dict(tp, value, prefix=key)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, key)
            except ValueError:
                continue
        raise ValueError(f"config key '{key}': {value!r} does not fit {tp}")
    if origin is tuple:
        if isinstance(value, str) and typing.get_args(tp)[:1] == (str,):
            value = [value]  # one module path where a list is allowed
        if not isinstance(value, list | tuple):
            raise ValueError(f"config key '{key}' must be a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_convert(item, v, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"config key '{key}' must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"config key '{key}' must be an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-3" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"config key '{key}' must be a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"config key '{key}' must be a string, got {value!r}")
        return value
    return value


def from_dict(cls: type, data: dict[str, Any], *, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a nested mapping, checking keys and types."""
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    aliases = getattr(cls, "config_aliases", {})
    kwargs = {}
    for key, value in data.items():
        key = aliases.get(key, key)
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key not in names:
            # The names a user writes: an aliased field by its alias (env.import).
            shown = [next((a for a, f in aliases.items() if f == n), n) for n in names]
            close = difflib.get_close_matches(str(key), shown, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"unknown config key '{dotted}'{hint} (known keys here: {', '.join(shown)})"
            )
        kwargs[key] = _convert(hints[key], value, dotted)
    try:
        return cls(**kwargs)
    except ValueError as exc:
        where = f" (in '{prefix}')" if prefix else ""
        raise ValueError(f"{exc}{where}") from None


def to_dict(cfg: Any) -> dict[str, Any]:
    """Plain nested dict (tuples as lists) that ``from_dict`` reads back."""
    return {f.name: _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``a.b.c=value`` strings (values parsed as YAML) to a nested dict."""
    data = yaml.safe_load(yaml.safe_dump(data))  # deep copy
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} must look like key.path=value")
        path, raw = item.split("=", 1)
        keys = path.strip().split(".")
        if not all(keys):
            raise ValueError(f"override {item!r} has an empty key")
        node = data
        for k in keys[:-1]:
            nxt = node.setdefault(k, {})
            if not isinstance(nxt, dict):
                raise ValueError(f"override {item!r}: '{k}' is not a section")
            node = nxt
        node[keys[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read YAML (or start from defaults when ``path`` is None) and apply overrides, then
    import the user's environment modules (``env.import``) and check the environment names.

    Raises :class:`ConfigError` (a ValueError) naming the key that is wrong.
    """
    data: dict[str, Any] = {}
    try:
        if path is not None:
            path = Path(path)
            if not path.is_file():
                raise ValueError(f"config file {str(path)!r} does not exist")
            try:
                loaded = yaml.safe_load(path.read_text())
            except yaml.YAMLError as exc:
                raise ValueError(f"config file {str(path)!r} is not valid YAML: {exc}") from None
            if loaded is not None and not isinstance(loaded, dict):
                raise ValueError(f"config file {str(path)!r} must hold a mapping at the top level")
            data = loaded or {}
        cfg = from_dict(RunConfig, apply_overrides(data, overrides))
        import_envs(cfg)
        return resolve_model(_run_dir_of_env(cfg, overrides))
    except ConfigError:
        raise
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(str(exc)) from None


def _run_dir_of_env(cfg: RunConfig, overrides: Sequence[str]) -> RunConfig:
    """``cfg`` with its run directory named after the environment when an override changed
    the environment but not the run directory (``env.name=convert`` trains into
    ``runs/convert``, not the recipe's ``runs/calculator_tiny``)."""
    keys = {o.split("=", 1)[0].strip() for o in overrides if "=" in o}
    if "env.name" not in keys or "run_dir" in keys:
        return cfg
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", cfg.env.name).strip(".") or "run"
    return dataclasses.replace(cfg, run_dir=str(Path(cfg.run_dir).parent / name))


def resolve_model(cfg: RunConfig) -> RunConfig:
    """``cfg`` with a ``model.source: hf`` shape read from the model directory.

    Raises :class:`ConfigError` if the directory is missing or holds a model we cannot run.
    """
    if cfg.model.source != "hf":
        return cfg
    from tunix_agentic.models.hf import resolve_model_config

    try:
        return dataclasses.replace(cfg, model=resolve_model_config(cfg.model))
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"model.path={cfg.model.path!r}: {exc}") from None


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
