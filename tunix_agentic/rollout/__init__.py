"""Rollout: the orchestrator that drives episodes and groups them as they complete."""

from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.episode import EpisodeRunner
from tunix_agentic.rollout.group import Group, InitResult, RunnerHooks
from tunix_agentic.rollout.group_runner import CheckpointingRunner, GroupRunner, PrefetchingRunner
from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator
from tunix_agentic.trajectory import Step, Trajectory

__all__ = [
    "CheckpointingRunner",
    "EpisodeRunner",
    "Group",
    "GroupFilter",
    "GroupRunner",
    "InitResult",
    "PrefetchingRunner",
    "RolloutConfig",
    "RolloutOrchestrator",
    "RunnerHooks",
    "StalenessPacer",
    "Step",
    "Trajectory",
]
