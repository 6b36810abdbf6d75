"""Turn groups of trajectories into padded learner arrays with few distinct shapes.

Rows and length are padded up to buckets so the jitted step compiles once per
bucket rather than once per batch. Padding rows have an all-zero mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tunix_agentic.learners.advantages import turn_advantages


def bucket_length(n: int, multiple: int = 64) -> int:
    return max(multiple, -(-n // multiple) * multiple)


def pad_rows(
    rows: Sequence[dict[str, np.ndarray]],
    *,
    pad_id: int,
    num_rows: int | None = None,
    length_multiple: int = 64,
) -> dict[str, np.ndarray]:
    """Stack per-trajectory arrays (from ``Trajectory.learner_arrays``) into ``[R, T]``."""
    if not rows:
        raise ValueError("cannot build a batch from no trajectories")
    r = max(num_rows or len(rows), len(rows))
    t = bucket_length(max(len(x["input_ids"]) for x in rows), length_multiple)
    out = {
        "input_ids": np.full((r, t), pad_id, np.int32),
        "loss_mask": np.zeros((r, t), np.float32),
        "old_logprobs": np.zeros((r, t), np.float32),
    }
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        for key in out:
            out[key][i, :n] = row[key]
    return out


def grpo_batch(
    groups: Sequence,  # Sequence[rollout.Group]
    advantage_fn: Callable[[np.ndarray], np.ndarray],
    *,
    pad_id: int,
    num_rows: int | None = None,
    length_multiple: int = 64,
    task_normalize: bool = False,
    turn_level: bool = False,
) -> dict[str, np.ndarray]:
    """Arrays for one GRPO step: advantages computed within each group.

    A trajectory gives one row, or one per step when its steps saw less than the
    whole history (``Trajectory.learner_rows``), each with the trajectory's
    advantage; the row count is then padded up to a multiple of ``num_rows`` so
    the step compiles for few shapes. With ``turn_level`` a step row's advantage
    adds the step's standardised process return-to-go (:func:`turn_advantages`). Under ``token_mean`` that weighs every
    action token as the one-row form would; under the ``seq_mean_*``
    aggregations each step row counts as a sequence, so an episode weighs in
    proportion to its steps. ``task_normalize`` (AgentRL's task advantage normalisation) then
    standardises the advantages of each task name across the batch, so tasks
    with different reward scales or group sizes pull with equal weight.
    """
    rows, advantages, names = [], [], []
    for group in groups:
        adv = advantage_fn(group.rewards)
        per_step = turn_advantages(
            adv, [np.asarray([st.reward for st in t.steps]) for t in group.trajectories]
        )
        for traj, a, steps in zip(group.trajectories, adv, per_step, strict=True):
            mine = traj.learner_rows()
            rows += mine
            if turn_level and len(mine) == len(traj.steps):  # a row per step
                advantages += [float(x) for x in steps]
            else:
                advantages += [float(a)] * len(mine)
            names += [traj.task_name] * len(mine)
    if task_normalize:
        advantages = normalize_by_task(np.asarray(advantages, np.float32), names).tolist()
    if num_rows and len(rows) > num_rows:
        num_rows = -(-len(rows) // num_rows) * num_rows
    batch = pad_rows(rows, pad_id=pad_id, num_rows=num_rows, length_multiple=length_multiple)
    adv = np.zeros(batch["input_ids"].shape[0], np.float32)
    adv[: len(advantages)] = advantages
    batch["advantages"] = adv
    return batch


def normalize_by_task(
    advantages: np.ndarray, task_names: Sequence[str], eps: float = 1e-6
) -> np.ndarray:
    """Zero mean, unit std of the advantages within each task name ([N] -> [N])."""
    out = np.asarray(advantages, np.float32).copy()
    names = np.asarray(task_names)
    for name in np.unique(names):
        idx = names == name
        a = out[idx]
        out[idx] = (a - a.mean()) / (a.std() + eps)
    return out
