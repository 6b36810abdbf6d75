"""The rollout's settings: group shape, worker pools, staleness, filters and fault handling.

One frozen, validated dataclass (``rollout:`` in a run's YAML); every bound is checked
when it is made, and an error names the key.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    """How episodes are grouped, paced, filtered and retried (see the orchestrator)."""

    group_size: int = 8
    groups_per_batch: int = 8
    init_workers: int = 32
    run_workers: int = 64
    eval_workers: int = 32
    episode_timeout_s: float = 300.0
    max_staleness: int = 1
    filter_uniform_groups: bool = True  # DAPO dynamic sampling: drop groups with one reward value
    min_reward_std: float = 0.0  # RAGEN-style: also drop groups whose reward std is at most this
    min_groups_per_batch: int = (
        0  # AgentRL variable batch: return early with >= this many (0: fixed size)
    )
    max_filtered_in_a_row: int = 500  # then stop with an error instead of waiting forever
    # Episodes in a row (in completion order) that ended on an infrastructure fault, retries
    # included, before the run stops with an error quoting the last one (a dead engine, an
    # environment whose reset always raises) instead of waiting forever.
    max_infra_failures_in_a_row: int = 64
    infra_retries: int = 1  # re-run an episode that hit an infrastructure fault, with a fresh env
    # A retry waits a delay drawn uniformly from [0, min(infra_backoff_max_s, infra_backoff_s *
    # 2**(retry - 1))] (jittered exponential back-off: a burst of failures does not return as one).
    infra_backoff_s: float = 1.0
    infra_backoff_max_s: float = 30.0
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
    seed: int = 0

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
        if self.prefetch_groups < 0:
            raise ValueError(f"rollout.prefetch_groups must be >= 0, got {self.prefetch_groups}")
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
