"""Every scalar a run writes, mirrored to Weights & Biases (``metrics.wandb``).

The recorder stays the source of truth (TensorBoard and ``metrics.jsonl``); the
mirror gets each write as it happens (:meth:`MetricsRecorder.add_write_listener`).
Scalars are logged under the same flat names as ``metrics.jsonl`` (W&B groups their
panels by prefix, as TensorBoard groups tags) against ``rl_step`` (W&B's
``define_metric``), not W&B's own step counter, because a run writes some steps late:
an evaluation beside training logs at the step it measured. The warm start's
``sft/*`` go against ``sft_step``, their own axis (their own run in TensorBoard). ``wandb`` is an optional dependency (``pip install -e
'.[wandb]'``): asking for the mirror without it fails at start with that command.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tunix_agentic.metrics.config import WandbConfig

STEP_KEY = "rl_step"
SFT_STEP_KEY = "sft_step"  # the warm start's scalars (sft/*), by SFT step


class WandbMirror:
    """One W&B run; ``mirror(values, step)`` logs a write, :meth:`close` finishes it."""

    def __init__(self, config: WandbConfig, run_dir: str | os.PathLike, run_config: Any = None):
        if config.project is None:
            raise ValueError("metrics.wandb.project is not set: nothing to mirror to")
        try:
            import wandb
        except ImportError:
            raise ImportError(
                "metrics.wandb needs the wandb package: pip install -e '.[wandb]'"
            ) from None
        run_dir = Path(run_dir)
        out = Path(config.dir) if config.dir is not None else run_dir
        out.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=config.project,
            entity=config.entity,
            name=config.name or run_dir.name,
            mode=config.mode,
            dir=str(out),
            config=run_config,
            settings=wandb.Settings(silent=True, console="off"),
        )
        self._run.define_metric(STEP_KEY)
        self._run.define_metric(SFT_STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self._run.define_metric("sft/*", step_metric=SFT_STEP_KEY)  # its own axis, as in TB
        self._closed = False

    def __call__(self, values: Mapping[str, float], step: int) -> None:
        if not self._closed:  # a write after close stays in TensorBoard and the JSONL
            sft = all(k.startswith("sft/") for k in values)
            self._run.log({**values, SFT_STEP_KEY if sft else STEP_KEY: step})

    @property
    def run_path(self) -> str | None:
        """Where an offline run is written (its directory), else None."""
        return getattr(self._run, "dir", None)

    def close(self) -> None:
        """Finish the W&B run (idempotent)."""
        if not self._closed:
            self._closed = True
            self._run.finish()
