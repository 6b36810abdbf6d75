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


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {"grpo": grpo, "dr_grpo": dr_grpo, "rloo": rloo}


def register_advantage(name: str, fn: AdvantageFn) -> None:
    ADVANTAGE_ESTIMATORS[name] = fn


def get_advantage_fn(name: str) -> AdvantageFn:
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None
