"""Rollout: the orchestrator that drives episodes and groups them as they complete."""

from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer
from tunix_agentic.rollout.orchestrator import Group, RolloutConfig, RolloutOrchestrator
from tunix_agentic.trajectory import Step, Trajectory

__all__ = [
    "Group",
    "GroupFilter",
    "RolloutConfig",
    "RolloutOrchestrator",
    "StalenessPacer",
    "Step",
    "Trajectory",
]
