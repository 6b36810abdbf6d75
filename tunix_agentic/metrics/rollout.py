"""What a training step logs about its rollout and its engine, from the batch and the clock.

Pure functions of a step's groups (:func:`rollout_stats`) and of two readings of
the engine's clock (:func:`engine_fractions`); the trainer adds them to the
step's metrics.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tunix_agentic.rollout.episode import Group


def rollout_stats(groups: list[Group]) -> dict[str, float]:
    """``rollout/*`` figures of a batch: reward, success (reward > 0) and their means per
    task source, tool use, turns, step rewards, generated tokens and episodes."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    rewards = np.asarray([t.reward for t in trajs])
    per_task: dict[str, list[float]] = {}
    for t in trajs:
        per_task.setdefault(t.task_name, []).append(t.reward)
    return {
        **{f"rollout/reward_mean/{name}": float(np.mean(r)) for name, r in per_task.items()},
        **{
            f"rollout/success/{name}": float((np.asarray(r) > 0).mean())
            for name, r in per_task.items()
        },
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/success": float((rewards > 0).mean()),
        "rollout/tool_use": float(np.mean([any(s.tool_calls for s in t.steps) for t in trajs])),
        "rollout/turns_mean": float(np.mean([len(t.steps) for t in trajs])),
        # Per-step (process) rewards beside the outcome: their sum per episode.
        "rollout/step_reward_sum_mean": float(
            np.mean([sum(s.reward for s in t.steps) for t in trajs])
        ),
        "rollout/generated_tokens": float(sum(t.num_generated for t in trajs)),
        "rollout/trajectories": float(len(trajs)),
    }


def engine_fractions(
    clock: dict[str, float], start: dict[str, float], since: float
) -> dict[str, float]:
    """``engine/<part>_fraction``: each part's share of the wall time since ``since``."""
    wall = time.perf_counter() - since
    return {
        f"engine/{k.removesuffix('_s')}_fraction": (v - start[k]) / wall for k, v in clock.items()
    }
