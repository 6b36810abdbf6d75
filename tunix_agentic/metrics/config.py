"""What a run records beyond the always-on scalars (``metrics:`` in a run's YAML).

JAX-free, so configs load on a rollout node. ``latency_samples`` bounds the sample
each span keeps per RL step for its percentiles and histogram (0 turns both off);
``layout`` writes TensorBoard's custom-scalars layout; ``peak_flops`` is the FLOP/s
MFU is measured against (:mod:`tunix_agentic.metrics.mfu`); ``wandb`` mirrors every scalar
to Weights & Biases (:mod:`tunix_agentic.metrics.wandb_mirror`).
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

WandbMode = Literal["offline", "online", "disabled"]
WANDB_MODES: tuple[WandbMode, ...] = get_args(WandbMode)


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    """``metrics.wandb``: off unless ``project`` is set. ``mode: offline`` (the default)
    writes the run under ``dir`` (default: the run directory) for a later ``wandb sync``;
    ``online`` needs a W&B login; ``disabled`` goes through the motions and keeps
    nothing. ``name`` defaults to the run directory's name."""

    project: str | None = None  # the W&B project; null: no mirror
    # "offline": written under dir for a later `wandb sync`; "online": sent (needs a W&B
    # login); "disabled": nothing kept.
    mode: WandbMode = "offline"
    entity: str | None = None  # the W&B team or user; null: the login's default
    name: str | None = None  # the W&B run's name; null: the run directory's name
    dir: str | None = None  # where W&B writes its files; null: the run directory

    def __post_init__(self):
        for key in ("project", "entity", "name", "dir"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"metrics.wandb.{key} must be a non-empty string, got {value!r}")
        if self.mode not in WANDB_MODES:
            raise ValueError(
                f"metrics.wandb.mode must be one of {', '.join(WANDB_MODES)}, got {self.mode!r}"
            )


@dataclasses.dataclass(frozen=True)
class MetricsConfig:
    """``metrics:`` in a run's YAML (see the module docstring)."""

    # Span samples kept per span name per RL step (a uniform reservoir past it) for the
    # latency/ percentiles and hist/ histograms; 0 turns both off.
    latency_samples: int = 2048
    # Write TensorBoard's custom-scalars layout (the CUSTOM SCALARS dashboard,
    # tunix_agentic.metrics.layout) as charts get data; false: none.
    layout: bool = True
    wandb: WandbConfig = WandbConfig()
    # FLOP/s that MFU is measured against; None: the chip's published peak, or on CPU (or
    # a chip not known) a matmul's measured rate (tunix_agentic.metrics.mfu).
    peak_flops: float | None = None

    def __post_init__(self):
        n = self.latency_samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"metrics.latency_samples must be an integer >= 0, got {n!r}")
        if not isinstance(self.layout, bool):
            raise ValueError(f"metrics.layout must be true or false, got {self.layout!r}")
        peak = self.peak_flops
        if peak is not None and (
            isinstance(peak, bool) or not isinstance(peak, int | float) or not 0 < peak < 1e30
        ):
            raise ValueError(f"metrics.peak_flops must be a number of FLOP/s > 0, got {peak!r}")
