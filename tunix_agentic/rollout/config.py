"""The rollout's settings: group shape, worker pools, staleness, filters and fault handling.

One frozen, validated dataclass (``rollout:`` in a run's YAML); every bound is checked
when it is made, and an error names the key.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, get_args

from tunix_agentic.inference.config import check_urls

# Who runs a group's episodes (``rollout.service.agent``, and a group request's ``agent``
# on the wire): the node's own agent loop; outside agents that claim them
# (``POST /v1/episodes/claim``) and call the node's OpenAI-compatible endpoint; or outside
# agents that run tasks of their own through that endpoint and close each episode with a
# reward and a task id (the node groups those by task id).
AgentKind = Literal["builtin", "external", "own_tasks"]
AGENT_KINDS: tuple[AgentKind, ...] = get_args(AgentKind)


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """Rollout on ``tunix-agentic serve-rollout`` nodes instead of in this process.

    ``urls``: the nodes (empty: episodes run in the trainer's process). ``api_key``: the
    nodes' key (``Authorization: Bearer``), and the key the trainer's engine server asks of
    the nodes when it listens beyond loopback (default ``$TUNIX_AGENTIC_API_KEY``, which
    stays out of the run's saved ``config.yaml``). ``engine_urls``: engines the nodes generate
    with (``serve-engine`` or SGLang servers); empty: the trainer serves its own engine to
    the nodes on ``engine_host``:``engine_port`` (0: a free port) and the nodes are told
    its URL (``engine_advertise``: the address nodes reach it by, when it is not
    ``engine_host``). With ``engine_urls`` the trainer publishes each version's weights
    by writing them under ``weights_dir`` (default: a temporary directory, so the same
    machine) and asking each server to load them (``serve-engine --weights-dir DIR``
    must allow it). ``poll_s``: one long poll's wait; ``health_every_s``: how often a
    node taken out is asked for ``/health``. ``agent``: ``builtin`` (the nodes run the
    run's agent loop), ``external`` (groups are submitted with ``"agent": "external"``:
    agents running elsewhere claim their members, the run's tasks, from the nodes and call
    the nodes' OpenAI-compatible endpoint) or ``own_tasks`` (agents running elsewhere run
    tasks of their own choosing through that endpoint, closing each episode with a reward
    and a ``task_id``; each group is the next ``group_size`` episodes of one task id, and the
    run's task source is not used for training). See ``examples/openai_agent.py``.
    """

    urls: tuple[str, ...] = ()
    api_key: str | None = None
    engine_urls: tuple[str, ...] = ()
    # The address the trainer's engine server listens on for the nodes (without
    # engine_urls); beyond loopback it asks for api_key.
    engine_host: str = "127.0.0.1"
    engine_port: int = 0  # that server's port; 0: a free port
    # The URL the nodes are told to reach that server at (http(s)://HOST:PORT), when it is
    # not engine_host:port (a NAT, a container); null: http://engine_host:port.
    engine_advertise: str | None = None
    # Where the trainer writes each policy version for engine servers to load (engine_urls,
    # rollout.ray.engines, engine.backend sglang/vllm); they must see it at the same path.
    # null: a temporary directory (servers on this machine only).
    weights_dir: str | None = None
    poll_s: float = 10.0
    health_every_s: float = 1.0
    agent: AgentKind = "builtin"

    def __post_init__(self):
        if self.agent not in AGENT_KINDS:
            raise ValueError(
                "rollout.service.agent must be 'builtin', 'external' or 'own_tasks', "
                f"got {self.agent!r}"
            )
        if self.agent != "builtin" and not self.urls:
            raise ValueError(
                f"rollout.service.agent={self.agent} needs rollout.service.urls (the nodes)"
            )
        for name in ("urls", "engine_urls"):
            value = getattr(self, name)
            value = (value,) if isinstance(value, str) else tuple(value)
            object.__setattr__(self, name, value)
            check_urls(value, f"rollout.service.{name}")
        if self.api_key is not None and not (isinstance(self.api_key, str) and self.api_key):
            raise ValueError("rollout.service.api_key must be a non-empty string or null")
        if self.engine_urls and not self.urls:
            raise ValueError("rollout.service.engine_urls needs rollout.service.urls (the nodes)")
        if not 0 <= self.engine_port < 65536:
            raise ValueError(
                f"rollout.service.engine_port must be in [0, 65535], got {self.engine_port}"
            )
        if self.engine_advertise is not None:
            check_urls((self.engine_advertise,), "rollout.service.engine_advertise")
        for name in ("poll_s", "health_every_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(
                    f"rollout.service.{name} must be a finite number > 0, got {value!r}"
                )

    @property
    def enabled(self) -> bool:
        """Whether episodes run on rollout nodes."""
        return bool(self.urls)


# Resource names Ray schedules by keyword rather than in ``resources``.
_RAY_KEYWORDS = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}


def _check_resources(field: str, value: object) -> None:
    if not isinstance(value, dict):
        raise ValueError(
            f"rollout.ray.{field} must be a mapping of resource to amount, e.g. {{CPU: 8}}, "
            f"got {value!r}"
        )
    for name, amount in value.items():
        if not (isinstance(name, str) and name):
            raise ValueError(f"rollout.ray.{field}: bad resource name {name!r}")
        if isinstance(amount, bool) or not isinstance(amount, int | float):
            raise ValueError(f"rollout.ray.{field}.{name} must be a number, got {amount!r}")
        if not (math.isfinite(amount) and amount >= 0):
            raise ValueError(
                f"rollout.ray.{field}.{name} must be a finite number >= 0, got {amount}"
            )


@dataclasses.dataclass(frozen=True)
class RayConfig:
    """Rollout nodes (and engines) started by the trainer as Ray actors (see
    :mod:`tunix_agentic.cluster`).

    ``nodes``: how many rollout nodes (0: off). ``address``: the cluster, as ``ray.init``
    takes it (``auto``, ``ray://HOST:10001``, or the GCS ``HOST:6379``).
    ``node_resources``: what each node asks of Ray, e.g. ``{CPU: 8}`` or a custom
    ``{rollout: 1}`` (CPU defaults to 1 when not named). ``engines``: engine servers to
    start as actors for the nodes to sample from (0: the nodes use the trainer's own
    engine); they need ``rollout.service.weights_dir``, a directory every machine sees,
    where the trainer writes each policy version. ``engine_resources``: what each engine
    asks for (``{GPU: 1}``, ``{TPU: 4}``). ``max_restarts``: how often Ray restarts an
    actor whose process died (-1: without end). ``start_timeout_s``: how long the actors
    may take to be placed and listening before the run stops with an error naming the
    resources. ``state_root``: where on each Ray node the actors keep their state dirs
    (default: the system's temporary directory).
    """

    nodes: int = 0
    address: str = "auto"
    node_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    engines: int = 0
    engine_resources: dict[str, float] = dataclasses.field(default_factory=dict)
    max_restarts: int = 10
    start_timeout_s: float = 60.0
    state_root: str | None = None

    def __post_init__(self):
        for field in ("nodes", "engines"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"rollout.ray.{field} must be an integer >= 0, got {value!r}")
        if self.engines and not self.nodes:
            raise ValueError(
                "rollout.ray.engines needs rollout.ray.nodes: the engines serve the rollout nodes"
            )
        if not (isinstance(self.address, str) and self.address):
            raise ValueError(
                f"rollout.ray.address must be a non-empty string, got {self.address!r}"
            )
        _check_resources("node_resources", self.node_resources)
        _check_resources("engine_resources", self.engine_resources)
        if isinstance(self.max_restarts, bool) or not isinstance(self.max_restarts, int):
            raise ValueError(
                f"rollout.ray.max_restarts must be an integer, got {self.max_restarts!r}"
            )
        if self.max_restarts < -1:
            raise ValueError(
                f"rollout.ray.max_restarts must be >= -1 (-1: without end), got {self.max_restarts}"
            )
        value = self.start_timeout_s
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(
                f"rollout.ray.start_timeout_s must be a finite number > 0, got {value!r}"
            )

    @property
    def enabled(self) -> bool:
        """Whether the trainer starts rollout nodes on Ray."""
        return self.nodes > 0

    def resources(self, field: str = "node_resources") -> dict[str, float]:
        """What each actor of ``field`` asks for, CPU included (1 unless named)."""
        asked = dict(getattr(self, field))
        asked.setdefault("CPU", 1)
        return asked

    def actor_options(self, field: str = "node_resources") -> dict[str, object]:
        """``node_resources`` (or ``engine_resources``) as Ray's actor options:
        ``num_cpus`` (1 unless named), ``num_gpus``, ``memory`` and ``resources`` for the
        rest (``TPU`` included)."""
        options: dict[str, object] = {"num_cpus": 1}
        custom = {}
        for name, amount in getattr(self, field).items():
            if name in _RAY_KEYWORDS:
                options[_RAY_KEYWORDS[name]] = amount
            else:
                custom[name] = amount
        if custom:
            options["resources"] = custom
        return options


def check_reward_limit(limit: object, key: str) -> None:
    """ValueError naming ``key`` unless ``limit`` is a number in (0, 1e18]: a group's
    rewards are squared in float32 (its standard deviation), which holds up to ~3e38."""
    if isinstance(limit, bool) or not (
        isinstance(limit, int | float) and math.isfinite(limit) and 0 < limit <= 1e18
    ):
        raise ValueError(f"{key} must be a number in (0, 1e18], got {limit!r}")


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are grouped, paced, filtered and retried (see the orchestrator)."""

    group_size: int = 8  # episodes per task (a GRPO group), whose rewards are compared
    groups_per_batch: int = 8  # groups per learner step
    init_workers: int = 32  # episodes at once in INIT (environment made and reset)
    run_workers: int = 64  # episodes at once in RUN (the agent loop, which keeps the engine busy)
    eval_workers: int = 32  # episodes at once in EVAL (the reward)
    # Seconds one episode attempt may take, from INIT to its reward (waits for workers
    # included). Past it the episode ends "agent_timeout" (reward 0) if it was in RUN and the
    # agent's actions took at least half of it, else "timeout" (an infrastructure fault).
    episode_timeout_s: float = 300.0
    # Policy versions a group's sampling may lag the learner step that trains on it; 0:
    # on-policy (admission waits for each update). An older group is dropped
    # (rollout/stale_dropped).
    max_staleness: int = 1
    filter_uniform_groups: bool = True  # DAPO dynamic sampling: drop groups with one reward value
    min_reward_std: float = 0.0  # RAGEN-style: also drop groups whose reward std is at most this
    min_groups_per_batch: int = (
        0  # AgentRL variable batch: return early with >= this many (0: fixed size)
    )
    max_filtered_in_a_row: int = 500  # then stop with an error (a warning at 4 batches' worth)
    # Episodes in a row (in completion order) that ended on an infrastructure fault, retries
    # included, before the run stops with an error quoting the last one (a dead engine, an
    # environment whose reset always raises) instead of waiting forever.
    max_infra_failures_in_a_row: int = 64
    infra_retries: int = 1  # re-run an episode that hit an infrastructure fault, with a fresh env
    # A retry waits a delay drawn uniformly from [0, min(infra_backoff_max_s, infra_backoff_s *
    # 2**(retry - 1))] (jittered exponential back-off: a burst of failures does not return as one).
    infra_backoff_s: float = 1.0
    infra_backoff_max_s: float = 30.0  # the back-off's cap, in seconds (>= infra_backoff_s)
    # An environment backend that says it is down (see RolloutOrchestrator: backend_health) is
    # waited for up to this long; failures of episodes begun before it came back do not count
    # towards max_infra_failures_in_a_row. Past it, they count again.
    backend_wait_s: float = 120.0
    # Interaction-budget curriculum (ScalingInter-RL): ((from_version, max_turns), ...), e.g.
    # ((0, 8), (100, 12), (200, 15)). Empty: agent.max_turns throughout.
    max_turns_schedule: tuple[tuple[int, int], ...] = ()
    # Groups whose environments are created and reset ahead of admission (a warm pool of
    # sandboxes; continuous production only). 0: INIT starts when the group is admitted.
    prefetch_groups: int = 0
    # Every reward (an environment's evaluate(), an agent's on a node's OpenAI endpoint) must be
    # a finite number in [-reward_limit, reward_limit]; one outside is the episode's error
    # (env_error) or a 400, never a learner input (1e308 overflows float32's advantages to NaN).
    reward_limit: float = 1e6
    # Seeds each episode's sampling (with its stream, group index, member and attempt:
    # rollout.episode.episode_seed) and the retries' back-off jitter.
    seed: int = 0
    # Rollout nodes (``tunix-agentic serve-rollout``); empty urls: in this process.
    service: ServiceConfig = ServiceConfig()
    # Rollout nodes the trainer starts as Ray actors (nodes: 0: none).
    ray: RayConfig = RayConfig()

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.groups_per_batch < 1:
            raise ValueError(f"rollout.groups_per_batch must be >= 1, got {self.groups_per_batch}")
        for name in ("init_workers", "run_workers", "eval_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")
        if self.episode_timeout_s <= 0:
            raise ValueError(f"rollout.episode_timeout_s must be > 0, got {self.episode_timeout_s}")
        if self.min_reward_std < 0:
            raise ValueError(f"rollout.min_reward_std must be >= 0, got {self.min_reward_std}")
        if not 0 <= self.min_groups_per_batch <= self.groups_per_batch:
            raise ValueError(
                f"rollout.min_groups_per_batch must be in [0, groups_per_batch={self.groups_per_batch}], "
                f"got {self.min_groups_per_batch}"
            )
        if self.infra_retries < 0:
            raise ValueError(f"rollout.infra_retries must be >= 0, got {self.infra_retries}")
        for name in ("infra_backoff_s", "infra_backoff_max_s", "backend_wait_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"rollout.{name} must be a finite number >= 0, got {value!r}")
        if self.infra_backoff_max_s < self.infra_backoff_s:
            raise ValueError(
                f"rollout.infra_backoff_max_s ({self.infra_backoff_max_s}) must be >= "
                f"rollout.infra_backoff_s ({self.infra_backoff_s})"
            )
        check_reward_limit(self.reward_limit, "rollout.reward_limit")
        if self.prefetch_groups < 0:
            raise ValueError(f"rollout.prefetch_groups must be >= 0, got {self.prefetch_groups}")
        if self.prefetch_groups and self.service.enabled:
            raise ValueError(
                "rollout.prefetch_groups must be 0 with rollout.service.urls (the nodes run INIT)"
            )
        if self.ray.enabled and self.service.urls:
            raise ValueError(
                "rollout.ray.nodes and rollout.service.urls both name rollout nodes: use one "
                "(with rollout.ray the trainer learns the nodes' URLs from Ray)"
            )
        if self.ray.engines and not self.service.weights_dir:
            raise ValueError(
                "rollout.ray.engines needs rollout.service.weights_dir: a directory every Ray "
                "machine sees at the same path, where the trainer writes each policy version "
                "for the engines to load"
            )
        if self.ray.engines and self.service.engine_urls:
            raise ValueError(
                "rollout.ray.engines and rollout.service.engine_urls both name engines: use one"
            )
        if self.prefetch_groups and self.ray.enabled:
            raise ValueError(
                "rollout.prefetch_groups must be 0 with rollout.ray (the nodes run INIT)"
            )
        if self.max_filtered_in_a_row < 1 or self.max_infra_failures_in_a_row < 1:
            raise ValueError(
                "rollout.max_filtered_in_a_row and rollout.max_infra_failures_in_a_row must be >= 1"
            )
        steps = [entry[0] for entry in self.max_turns_schedule]
        if any(len(entry) != 2 for entry in self.max_turns_schedule):
            raise ValueError(
                "rollout.max_turns_schedule entries must be [from_version, max_turns] pairs"
            )
        if steps != sorted(steps) or len(set(steps)) != len(steps) or any(v < 0 for v in steps):
            raise ValueError(
                f"rollout.max_turns_schedule versions must be distinct, ascending and >= 0, got {steps}"
            )
        if any(turns < 1 for _, turns in self.max_turns_schedule):
            raise ValueError("rollout.max_turns_schedule turn budgets must be >= 1")

    def max_turns_at(self, version: int, default: int) -> int:
        """The interaction budget for an episode started under policy ``version``."""
        turns = default
        for start, budget in self.max_turns_schedule:
            if version >= start:
                turns = budget
        return turns
