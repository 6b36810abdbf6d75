"""Resuming a run: read its newest readable checkpoint, and say which records it redoes.

A resume continues from the newest checkpoint whose files can be read, with the
learner, the task stream and the run's clock as they were there (the trainer
builds the rest); what was logged after that checkpoint is redone, so
:func:`logged_after` tells the records to drop, by step and name, never by clock.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunix_agentic.checkpoint import Checkpointer, UnreadableCheckpointsError
from tunix_agentic.config import ConfigError, RunConfig, to_dict
from tunix_agentic.data.sources import RunSources
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.models.transformer import Transformer

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Restored:
    """A resumed run's newest readable checkpoint: the learner loaded from it, the
    checkpoint's metadata and its RL step, and the newer checkpoints skipped as
    unreadable (newest first)."""

    learner: GRPOLearner
    meta: dict[str, Any]
    step: int
    unreadable: list[int] = dataclasses.field(default_factory=list)


def restore_newest(
    run_dir: Path, cfg: RunConfig, model: Transformer, sources: RunSources
) -> Restored | None:
    """Read the newest readable checkpoint of the run in ``run_dir``, or None if it has none.

    A checkpoint whose files cannot be read (truncated, corrupted) is skipped for
    the one before it, with a warning naming its step and why; the trainer moves the
    skipped ones to ``checkpoints_unreadable/`` once the run starts writing.

    Writes nothing: a resume that cannot go on fails here with a ConfigError
    naming what does not match, and leaves the run directory as it was.
    """
    directory = run_dir / "checkpoints"
    if not directory.is_dir():
        return None
    ckpt = Checkpointer(directory, max_to_keep=cfg.rl.keep_checkpoints)
    try:
        learner = GRPOLearner(model, cfg.learner, seed=cfg.seed)
        try:
            got = ckpt.restore_newest(
                learner.checkpoint_params(),
                learner.state.opt_state,
                check=lambda meta: _check_same_model(meta.get("model"), cfg.model),
            )
        except UnreadableCheckpointsError as exc:  # the newest's error first
            raise ConfigError(f"{exc}: does this config fit the run?") from None
        if got is None:
            return None
        learner.load_checkpoint(got.params, got.opt_state, got.step)
        probe = sources.train_stream(cfg.seed)
        try:
            probe.set_state(got.meta["rollout"]["task_iterator"])
        except (ValueError, KeyError) as exc:
            raise ConfigError(f"tasks do not match the checkpoint: {exc}") from None
        for step, why in got.skipped:
            _log.warning(
                "checkpoint %d of %s is unreadable (%s): resuming from checkpoint %d",
                step,
                run_dir,
                why,
                got.step,
            )
        return Restored(learner, got.meta, got.step, [step for step, _ in got.skipped])
    finally:
        ckpt.close()


def logged_after(checkpoint: int | None) -> Callable[[int, frozenset[str]], bool]:
    """Which metric records a run resumed from RL step ``checkpoint`` redoes (None: no
    checkpoint, the run starts over and redoes all), by step and name, never by clock.

    The warm start's ``sft/*`` records (in SFT steps) precede every checkpoint; an RL
    record is redone when its step is past the checkpoint; and ``eval/*`` at the
    checkpoint's step past 0 is the final evaluation, which follows the final checkpoint.
    """

    def late(step: int, tags: frozenset[str]) -> bool:
        if checkpoint is None:
            return True
        if tags and all(tag.startswith("sft/") for tag in tags):
            return False
        if step != checkpoint:
            return step > checkpoint
        return checkpoint > 0 and any(tag.startswith("eval/") for tag in tags)

    return late


def _check_same_model(saved: dict[str, Any] | None, model: Any) -> None:
    """ConfigError naming the first ``model.*`` key that differs from the checkpoint's."""
    if saved is None:
        return
    now = to_dict(model)
    for key, value in now.items():
        # A model directory may move, and attention and the layers may be computed another
        # way (scan_layers keeps the parameter tree): the shape and weights must match.
        if key in ("path", "attention", "scan_layers"):
            continue
        if key in saved and saved[key] != value:
            raise ConfigError(
                f"model.{key}={value} does not match the checkpoint ({saved[key]}); "
                "a resumed run keeps its model"
            )
