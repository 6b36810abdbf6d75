"""The run's resolved config as TensorBoard HParams: one row per run in the HPARAMS
dashboard, its scalar settings as columns beside the metrics, to compare runs by.

Written once when the run's metrics open, with TensorBoard's own protos (its
``hparams_pb`` builds the plugin's ``session_start_info`` summary without
TensorFlow). Every scalar leaf of the config is one hyperparameter named by its dotted
path (``learner.optimizer.learning_rate``); lists and unset (None) fields are left out
(the text card ``config/resolved`` holds the whole config).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorboard.plugins.hparams.summary_v2 import hparams_pb

from tunix_agentic.metrics.recorder import MetricsRecorder


def scalar_leaves(tree: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{dotted.path: value}`` for every bool, int, float and str leaf of a nested mapping."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(scalar_leaves(value, name))
        elif isinstance(value, bool | int | float | str):
            out[name] = value
    return out


def write_hparams(
    metrics: MetricsRecorder, config: Mapping[str, Any], step: int, *, trial_id: str | None = None
) -> dict[str, bool | int | float | str]:
    """Write ``config``'s scalar leaves as the run's HParams at ``step``; returns them.
    ``trial_id`` names the run's session group in the dashboard (default: a hash of the
    values)."""
    values = scalar_leaves(config)
    metrics.write_summaries(list(hparams_pb(values, trial_id=trial_id).value), step)
    return values
