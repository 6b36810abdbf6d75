"""Group-relative advantage estimators (pure NumPy), selectable by name.

Each maps the rewards of one group ``[G]`` to per-trajectory advantages ``[G]``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

AdvantageFn = Callable[[np.ndarray], np.ndarray]


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


def register_advantage(name: str, fn: AdvantageFn) -> None:
    ADVANTAGE_ESTIMATORS[name] = fn


def get_advantage_fn(name: str) -> AdvantageFn:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None
