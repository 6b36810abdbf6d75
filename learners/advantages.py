"""Advantage estimators (pure NumPy), selectable by name.

Two kinds, in two registries:

* group-level (:data:`ADVANTAGE_ESTIMATORS`): the rewards of one group ``[G]`` to
  per-trajectory advantages ``[G]``;
* batch-level (:data:`BATCH_ADVANTAGE_ESTIMATORS`): every trajectory of the batch at once,
  ``fn(rewards [N], group_ids [N], task_names [N]) -> [N]``, for baselines or scales that
  look beyond the group. :func:`get_advantage_fn` returns these wrapped in
  :class:`BatchAdvantage` so a caller can tell the kinds apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

AdvantageFn = Callable[[np.ndarray], np.ndarray]
BatchAdvantageFn = Callable[[np.ndarray, np.ndarray, Sequence[str]], np.ndarray]


def grpo(rewards: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """GRPO (Shao et al. 2024, eq. 3): (r - mean(r)) / (std(r) + eps), population std."""
    r = np.asarray(rewards, np.float64)
    return ((r - r.mean()) / (r.std() + eps)).astype(np.float32)


def grpo_bessel(rewards: np.ndarray, eps: float = 1e-4) -> np.ndarray:
    """GRPO as TRL computes it: (r - mean(r)) / (std(r) + eps) with the Bessel-corrected
    (n - 1) std and eps 1e-4; at group size G that is sqrt((G-1)/G) times :func:`grpo`'s
    advantages (0.87 at G=4). A group of one has advantage 0."""
    r = np.asarray(rewards, np.float64)
    if r.size < 2:
        return np.zeros_like(r, np.float32)
    return ((r - r.mean()) / (r.std(ddof=1) + eps)).astype(np.float32)


def dr_grpo(rewards: np.ndarray) -> np.ndarray:
    """Dr. GRPO (Liu et al. 2025): mean-centred only; dividing by std biases toward easy/hard groups."""
    r = np.asarray(rewards, np.float64)
    return (r - r.mean()).astype(np.float32)


def rloo(rewards: np.ndarray) -> np.ndarray:
    """RLOO (Ahmadian et al. 2024): r_i minus the mean of the other G-1 rewards."""
    r = np.asarray(rewards, np.float64)
    g = r.size
    if g < 2:
        return np.zeros_like(r, np.float32)
    return (r - (r.sum() - r) / (g - 1)).astype(np.float32)


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo,  # the default: population std + 1e-6 (DeepSeekMath's formula)
    "grpo_bessel": grpo_bessel,  # TRL's: Bessel-corrected std + 1e-4
    "dr_grpo": dr_grpo,
    "rloo": rloo,
}


def turn_advantages(
    trajectory_advantages: np.ndarray, step_rewards: list[np.ndarray], eps: float = 1e-6
) -> list[np.ndarray]:
    """Turn-level advantages from per-step (process) rewards, for one group.

    Step t of trajectory i gets its trajectory's advantage plus its standardised
    process return-to-go: ``A[i] + (g[i][t] - mean(g)) / (std(g) + eps)``, with
    ``g[i][t] = sum(step_rewards[i][t:])`` and the mean and (population) std over every
    step of the group. Without process rewards (all zero: std 0) each step keeps the
    trajectory's advantage, so this reduces to the trajectory-level form. ``[G]`` and G
    arrays ``[T_i]`` -> G arrays ``[T_i]``.
    """
    returns = [np.cumsum(np.asarray(r, np.float64)[::-1])[::-1] for r in step_rewards]
    flat = np.concatenate(returns) if returns else np.zeros(0)
    mean, std = (flat.mean(), flat.std()) if flat.size else (0.0, 0.0)
    out = []
    for a, g in zip(np.asarray(trajectory_advantages, np.float64), returns, strict=True):
        shaped = (g - mean) / (std + eps) if std > 0 else np.zeros_like(g)
        out.append((a + shaped).astype(np.float32))
    return out


def reinforce(rewards: np.ndarray, group_ids: np.ndarray, task_names: Sequence[str]) -> np.ndarray:
    """REINFORCE with a batch baseline (Williams 1992, "Simple Statistical Gradient-Following
    Algorithms"): ``r - mean(r over the whole batch)``, groups ignored. ``[N] -> [N]``."""
    r = np.asarray(rewards, np.float64)
    return dr_grpo(r) if r.size else np.zeros(0, np.float32)  # dr_grpo over the batch


def reinforce_pp(
    rewards: np.ndarray, group_ids: np.ndarray, task_names: Sequence[str], eps: float = 1e-6
) -> np.ndarray:
    """REINFORCE++ (Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for
    Aligning Large Language Models"): global batch normalisation, ``(r - mean) / (std +
    eps)`` with the mean and (population) std over the whole batch. ``[N] -> [N]``."""
    r = np.asarray(rewards, np.float64)
    return grpo(r, eps) if r.size else np.zeros(0, np.float32)  # grpo over the batch


def erpo(
    rewards: np.ndarray, group_ids: np.ndarray, task_names: Sequence[str], eps: float = 1e-6
) -> np.ndarray:
    """ERPO-style environment-level scale: ``(r - mean of the trajectory's group) / (std over
    every trajectory of the batch with the same task name + eps)`` (population std).

    The group mean keeps GRPO's per-prompt baseline; the std pooled over the whole
    environment (all its groups in the batch) stops a group with nearly equal rewards from
    being blown up to unit scale, as GRPO's per-group std does, while environments with
    different reward scales still pull with comparable weight (the same group-mean /
    wider-std split as Lite PPO, Liu et al. 2025, "Part I: Tricks or Traps?"). ``[N] -> [N]``.
    """
    r = np.asarray(rewards, np.float64)
    groups = np.asarray(group_ids)
    names = np.asarray(task_names)
    centred = np.zeros_like(r)
    for g in np.unique(groups):
        idx = groups == g
        centred[idx] = r[idx] - r[idx].mean()
    out = np.zeros_like(r)
    for name in np.unique(names):
        idx = names == name
        out[idx] = centred[idx] / (r[idx].std() + eps)
    return out.astype(np.float32)


BATCH_ADVANTAGE_ESTIMATORS: dict[str, BatchAdvantageFn] = {
    "reinforce": reinforce,
    "reinforce_pp": reinforce_pp,
    "erpo": erpo,
}


@dataclasses.dataclass(frozen=True)
class BatchAdvantage:
    """A batch-level estimator as :func:`get_advantage_fn` returns it: call it with
    ``(rewards [N], group_ids [N], task_names [N])`` for the whole batch at once."""

    name: str
    fn: BatchAdvantageFn

    def __call__(
        self, rewards: np.ndarray, group_ids: np.ndarray, task_names: Sequence[str]
    ) -> np.ndarray:
        out = np.asarray(self.fn(rewards, group_ids, task_names), np.float32)
        if out.shape != np.shape(rewards):
            raise ValueError(
                f"advantage estimator {self.name!r} returned shape {out.shape} "
                f"for rewards of shape {np.shape(rewards)}"
            )
        return out


def overlong_penalty(lengths: np.ndarray, max_len: int, cache_len: int) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), added to the reward.

    0 up to ``max_len - cache_len`` generated tokens, then linearly down to -1 at
    ``max_len``, and -1 beyond: ``clip((max_len - cache_len - n) / cache_len, -1, 0)``.
    ``[N] -> [N]``.
    """
    if not 0 < cache_len <= max_len:
        raise ValueError(
            f"overlong penalty needs 0 < cache_len <= max_len, got {cache_len}, {max_len}"
        )
    n = np.asarray(lengths, np.float64)
    return np.clip((max_len - cache_len - n) / cache_len, -1.0, 0.0).astype(np.float32)


def register_advantage(name: str, fn: AdvantageFn) -> None:
    """Add a group-level estimator ``fn(rewards [G]) -> [G]`` under ``name`` (the value of
    ``learner.advantage``); a name already taken is replaced."""
    ADVANTAGE_ESTIMATORS[name] = fn


def register_batch_advantage(name: str, fn: BatchAdvantageFn) -> None:
    """Add a batch-level estimator ``fn(rewards [N], group_ids [N], task_names [N]) -> [N]``."""
    BATCH_ADVANTAGE_ESTIMATORS[name] = fn


def get_advantage_fn(name: str) -> AdvantageFn | BatchAdvantage:
    """The estimator called ``name``: a group-level function, or a :class:`BatchAdvantage`."""
    if name in ADVANTAGE_ESTIMATORS:
        return ADVANTAGE_ESTIMATORS[name]
    if name in BATCH_ADVANTAGE_ESTIMATORS:
        return BatchAdvantage(name, BATCH_ADVANTAGE_ESTIMATORS[name])
    raise ValueError(
        f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}; "
        f"batch-level: {sorted(BATCH_ADVANTAGE_ESTIMATORS)}"
    )
