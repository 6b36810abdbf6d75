"""The naming rule every scalar tag follows: its last word says its unit, or that it is a
share, a ratio or a count.

A tag's last path component ends in a unit (``step_time/part_s``, ``latency/tool_ms``,
``rollout/response_tokens_max``, ``learner/entropy_nats``) or in a word that says what
kind of number it is (``engine/kv_occupancy_fraction``, ``learner/ratio_mean``,
``count/rollout/episodes_total``), optionally followed by how it was aggregated over the
step (``_mean``, ``_max``, ``_min``, ``_sum``, a percentile ``_p95``). MFU
(``perf/mfu_train``) is a share of the peak by definition.

Environment-reported figures (``rollout/env/<name>``) are named by the environment's
author and are exempt; see docs/observability.md.
"""

from __future__ import annotations

import re

# Units: time, memory, work, and the things a run counts.
UNITS = (
    "s", "ms", "gib", "flops", "nats", "tokens", "blocks", "turns", "calls", "groups",
    "episodes", "trajectories", "steps", "versions", "version", "reward",
)  # fmt: skip
# Dimensionless kinds: a share of 1, a quotient, a loss or norm, a running or per-step count.
KINDS = (
    "fraction", "ratio", "accuracy", "weight", "loss", "norm", "count", "total",
    "per_step", "per_episode",
)  # fmt: skip
AGGREGATES = r"_(?:mean|max|min|sum|p\d\d)"
EXEMPT = ("rollout/env/",)

_RULE = re.compile(rf"(?:^|[_/])(?:{'|'.join(UNITS + KINDS)})(?:{AGGREGATES})*$|(?:^|/)mfu_[a-z]+$")


def says_its_unit(tag: str) -> bool:
    """Whether the TensorBoard tag (or flat scalar name) ``tag`` follows the rule above."""
    return tag.startswith(EXEMPT) or _RULE.search(tag) is not None
