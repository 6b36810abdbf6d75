"""What measuring code needs of a metrics recorder, and a recorder that keeps nothing.

Host-side code (the agent loop, the orchestrator, the RL loop) takes a
:class:`MetricsSink` and defaults to :data:`NULL_METRICS`, so it records
unconditionally instead of asking ``if metrics is not None`` at every count.
:class:`~tunix_agentic.metrics.recorder.MetricsRecorder` is the real one.
"""

from __future__ import annotations

import contextlib
from typing import Protocol


class MetricsSink(Protocol):
    """The accumulating part of :class:`~tunix_agentic.metrics.recorder.MetricsRecorder`."""

    def span(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Time the block as one ``name`` span."""
        ...

    def add_time(self, name: str, seconds: float) -> None:
        """Add ``seconds`` to ``name``'s spans."""
        ...

    def count(self, name: str, n: float = 1.0) -> None:
        """Add ``n`` to the cumulative counter ``name``."""
        ...

    def gauge(self, name: str, value: float) -> None:
        """Set the gauge ``name`` (last value wins)."""
        ...


class NullMetrics:
    """A :class:`MetricsSink` that records nothing (no recorder was given)."""

    def span(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def add_time(self, name: str, seconds: float) -> None:
        pass

    def count(self, name: str, n: float = 1.0) -> None:
        pass

    def gauge(self, name: str, value: float) -> None:
        pass


NULL_METRICS = NullMetrics()
