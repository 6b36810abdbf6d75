"""Rollout: trajectories, grouping, and the orchestrator that drives episodes."""

from tunix_agentic.rollout.trajectory import Step, Trajectory

__all__ = ["Group", "RolloutConfig", "RolloutOrchestrator", "Step", "Trajectory"]


def __getattr__(name: str):
    # The orchestrator imports the agent loop, which imports trajectories from
    # here; loading it on first use keeps that import order acyclic.
    if name in ("Group", "RolloutConfig", "RolloutOrchestrator"):
        from tunix_agentic.rollout import orchestrator

        return getattr(orchestrator, name)
    raise AttributeError(name)
