"""Run metrics: TensorBoard event files and a JSONL log."""

from tunix_agentic.metrics.recorder import MetricsRecorder, read_scalars

__all__ = ["MetricsRecorder", "read_scalars"]
