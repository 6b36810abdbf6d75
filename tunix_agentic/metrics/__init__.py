"""Run metrics: TensorBoard event files and a JSONL log, and the no-op sink host code defaults to.

The recorder (and TensorBoard's writer under it) loads on first use, so host-side
code that only needs :class:`NullMetrics` does not import it.
"""

from __future__ import annotations

import importlib
from typing import Any

from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink, NullMetrics

_LAZY = {
    "MetricsRecorder": "tunix_agentic.metrics.recorder",
    "read_scalars": "tunix_agentic.metrics.recorder",
}

__all__ = ["NULL_METRICS", "MetricsRecorder", "MetricsSink", "NullMetrics", "read_scalars"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tunix_agentic.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
