"""Context rules: what the model sees next, derived from the episode history.

A rule maps the trajectory so far to the prompt ids of the next model call.
``append_only`` (the default) sends the whole history, which is also exactly
what the learner trains on. Rules are looked up by name.
"""

from __future__ import annotations

from collections.abc import Callable

from tunix_agentic.trajectory import Trajectory

ContextRule = Callable[[Trajectory], list[int]]


def append_only(traj: Trajectory) -> list[int]:
    return traj.token_ids


CONTEXT_RULES: dict[str, ContextRule] = {"append_only": append_only}


def get_context_rule(name: str) -> ContextRule:
    try:
        return CONTEXT_RULES[name]
    except KeyError:
        raise ValueError(f"unknown context rule {name!r}; known: {sorted(CONTEXT_RULES)}") from None
