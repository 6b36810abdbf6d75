"""What a training step logs about its rollout: figures of the batch's groups.

:func:`rollout_stats` is a pure function of a step's groups; the trainer adds it to
the step's metrics beside the engine's (:class:`~tunix_agentic.metrics.engine.EngineWindow`).
"""

from __future__ import annotations

import numpy as np

from tunix_agentic.rollout.episode import Group


def rollout_stats(groups: list[Group]) -> dict[str, float]:
    """``rollout/*`` figures of a batch: reward, success (reward > 0) and their means per
    task source, tool use, turns, tool calls per episode, step rewards, generated tokens and episodes, response
    length (mean and max) and the share truncated at the token limit, and
    ``rollout/env/<name>``: the mean over the episodes that reported it of an environment's
    own figure (``StepResult.info["metrics"]``, summed over each episode's steps)."""
    trajs = [t for g in groups for t in g.trajectories]
    if not trajs:
        return {}
    rewards = np.asarray([t.reward for t in trajs])
    per_task: dict[str, list[float]] = {}
    for t in trajs:
        per_task.setdefault(t.task_name, []).append(t.reward)
    env_metrics: dict[str, list[float]] = {}  # an environment's own figures, per episode
    for t in trajs:
        for name, value in (t.info.get("metrics") or {}).items():
            env_metrics.setdefault(name, []).append(float(value))
    return {
        **{f"rollout/env/{name}": float(np.mean(v)) for name, v in env_metrics.items()},
        **{f"rollout/reward_mean/{name}": float(np.mean(r)) for name, r in per_task.items()},
        **{
            f"rollout/success_fraction/{name}": float((np.asarray(r) > 0).mean())
            for name, r in per_task.items()
        },
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/success_fraction": float((rewards > 0).mean()),
        "rollout/tool_use_fraction": float(
            np.mean([any(s.tool_calls for s in t.steps) for t in trajs])
        ),
        "rollout/turns_mean": float(np.mean([len(t.steps) for t in trajs])),
        "rollout/tool_calls_mean": float(
            np.mean([sum(len(s.tool_calls) for s in t.steps) for t in trajs])
        ),
        # Per-step (process) rewards beside the outcome: their sum per episode.
        "rollout/step_reward_sum_mean": float(
            np.mean([sum(s.reward for s in t.steps) for t in trajs])
        ),
        "rollout/generated_tokens": float(sum(t.num_generated for t in trajs)),
        # Response length (tokens the policy generated per episode) and the share cut off
        # at the token limit.
        "rollout/response_tokens_mean": float(np.mean([t.num_generated for t in trajs])),
        "rollout/response_tokens_max": float(max(t.num_generated for t in trajs)),
        "rollout/truncated_fraction": float(np.mean([t.status == "max_tokens" for t in trajs])),
        "rollout/trajectories": float(len(trajs)),
    }
