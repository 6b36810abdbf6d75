"""Context rules: what the model sees next, derived from the episode history.

A rule maps the trajectory so far (and the agent's ``context_window``) to the
prompt ids of the next model call. ``append_only`` (the default) sends the whole
history; ``sliding_window`` keeps the task prompt and the last ``k`` steps (each
an action and the environment's reply; Agent-R1's window), so long episodes fit
the model's context. When a step saw less than the whole history the learner
trains it on exactly what it saw (``Trajectory.learner_rows``). Rules are looked
up by name; a user may add one to :data:`CONTEXT_RULES`.
"""

from __future__ import annotations

from collections.abc import Callable

from tunix_agentic.trajectory import Trajectory

ContextRule = Callable[[Trajectory, int], list[int]]


def append_only(traj: Trajectory, window: int = 0) -> list[int]:
    """The whole history (``window`` is ignored)."""
    return traj.token_ids


def sliding_window(traj: Trajectory, window: int) -> list[int]:
    """The prompt, then the last ``window`` steps (action and observation) of the history."""
    if window < 1:
        raise ValueError(f"the sliding_window rule needs agent.context_window >= 1, got {window}")
    if len(traj.steps) <= window:
        return traj.token_ids
    start = traj.action_starts()[len(traj.steps) - window]
    return traj.token_ids[: traj.prompt_len] + traj.token_ids[start:]


CONTEXT_RULES: dict[str, ContextRule] = {
    "append_only": append_only,
    "sliding_window": sliding_window,
}


def get_context_rule(name: str) -> ContextRule:
    try:
        return CONTEXT_RULES[name]
    except KeyError:
        raise ValueError(f"unknown context rule {name!r}; known: {sorted(CONTEXT_RULES)}") from None
