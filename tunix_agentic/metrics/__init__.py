"""Run metrics: TensorBoard event files and a JSONL log, and the no-op sink host code defaults to.

The recorder (and TensorBoard's writer under it) loads on first use, so host-side
code that only needs :class:`NullMetrics` does not import it.
"""

from __future__ import annotations

from tunix_agentic.lazy import lazy_exports
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink, NullMetrics

_LAZY = {
    "MetricsRecorder": "tunix_agentic.metrics.recorder",
    "read_scalars": "tunix_agentic.metrics.recorder",
}

__all__ = ["NULL_METRICS", "MetricsRecorder", "MetricsSink", "NullMetrics", "read_scalars"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
