"""What a reward may be before it reaches the learner: a finite real in a bounded range.

A reward of ``1e308`` (finite in float64) becomes ``inf`` in the learner's float32 arrays,
and a group's advantages then NaN: one such reward poisons every update after it. So each
place a reward enters a run checks it: an environment's ``evaluate()`` (the episode ends
``env_error``, naming the method and where it is defined) and an agent's reward on a node's
OpenAI endpoint (a 400). The limit is ``rollout.reward_limit``.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

from tunix_agentic.envs.base import Environment


class RewardError(ValueError):
    """A reward that is not a finite real within the run's limit."""


def check_reward(value: Any, limit: float, where: str = "reward") -> float:
    """``value`` as a float when it is a real number in ``[-limit, limit]``; else
    :class:`RewardError` naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        # numpy scalars are reals too (np.float32(1.0) is not a float)
        if not (hasattr(value, "dtype") and getattr(value, "shape", None) == ()):
            raise RewardError(f"{where} must be a number, got {value!r:.60}")
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RewardError(f"{where} must be a number, got {value!r:.60}") from exc
    if not math.isfinite(reward):
        raise RewardError(f"{where} must be finite, got {reward}")
    if abs(reward) > limit:
        raise RewardError(
            f"{where} must lie in [-{limit:g}, {limit:g}] (rollout.reward_limit), got {reward:g}"
        )
    return reward


def reward_site(env: Any) -> str:
    """Where an environment's reward comes from: ``Class.evaluate (file:line)`` (or its
    ``evaluate_trajectory``), for an error a user can follow."""
    scorer = getattr(type(env), "evaluate_trajectory", None)
    # The base class's evaluate_trajectory only calls evaluate(): name the one written.
    name = (
        "evaluate" if scorer in (None, Environment.evaluate_trajectory) else "evaluate_trajectory"
    )
    method = getattr(type(env), name, None)
    where = f"{type(env).__name__}.{name}"
    try:
        fn = inspect.unwrap(method)
        return f"{where} ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
    except (TypeError, OSError):
        return where


def checked_reward(value: Any, env: Any, limit: float) -> float:
    """An environment's reward, checked (:func:`check_reward` naming :func:`reward_site`)."""
    return check_reward(value, limit, f"the reward of {reward_site(env)}")
