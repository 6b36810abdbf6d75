"""Where one RL step's wall time went, in parts that add up to it.

A step runs from the end of the step before (the start of RL for the first) to the
end of its weight sync. The learner's own parts are measured by the loop: waiting
for the batch, train, weight sync, and ``other`` (the loop's work between two
steps: logging, transcripts, checkpoints). The wait for the batch is split by what
the rollout was doing meanwhile, each instant charged to the first of:

1. ``evaluation``: an evaluation beside training was under way (it shares the
   engine and holds back the new weights);
2. ``generation``: a model call was under way (``model_call`` spans);
3. ``environment``: an environment step, tool call or start-up was (``env_step``,
   ``tool/*``, ``env/*``, ``stage/init``);
4. ``reward``: a reward was being computed (``stage/eval``);
5. ``wait``: none of these (admission paused by the staleness bound, bookkeeping).

:class:`StepTime` hears every span as it ends (a
:meth:`~tunix_agentic.metrics.recorder.MetricsRecorder.add_span_listener`), and the
batch's own episodes have all ended by the time the wait does, so what held the
learner up is known when the step is written. Spans reported after the fact from
rollout nodes (``rollout.service``) end when they arrive, so there the split is
approximate; the parts still add up to the step's wall time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

# The rollout's work the wait for a batch is charged to, first match first.
WAIT_CAUSES = ("evaluation", "generation", "environment", "reward")
_EXACT = {
    "eval": "evaluation",
    "model_call": "generation",
    "env_step": "environment",
    "stage/init": "environment",
    "stage/eval": "reward",
}
_PREFIXES = (("tool/", "environment"), ("env/", "environment"))


def cause_of(span: str) -> str | None:
    """The part of the wait a span of this name explains, if any."""
    cause = _EXACT.get(span)
    if cause is None:
        cause = next((c for p, c in _PREFIXES if span.startswith(p)), None)
    return cause


def split_window(
    start: float, end: float, intervals: dict[str, list[tuple[float, float]]]
) -> dict[str, float]:
    """Seconds of ``[start, end]`` charged to each of :data:`WAIT_CAUSES` (each instant to
    the first cause with an interval over it) and to ``wait`` (no cause): they sum to
    ``end - start``."""
    free = [(start, end)] if end > start else []
    out = {}
    for cause in WAIT_CAUSES:
        covered, left = 0.0, []
        spans = sorted(intervals.get(cause, ()))
        for a, b in free:
            cursor = a
            for s, e in spans:
                if e <= cursor or s >= b:
                    continue
                if s > cursor:
                    left.append((cursor, s))
                covered += min(e, b) - max(s, cursor)
                cursor = max(cursor, min(e, b))
                if cursor >= b:
                    break
            if cursor < b:
                left.append((cursor, b))
        out[cause] = covered
        free = left
    out["wait"] = sum(b - a for a, b in free)
    return out


class StepTime:
    """The spans of the rollout's work, kept until no step's wait can overlap them; a span
    listener of the run's recorder."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._intervals: dict[str, list[tuple[float, float]]] = {c: [] for c in WAIT_CAUSES}
        self._eval_since: float | None = None  # an evaluation under way, from then

    def __call__(self, name: str, end: float, seconds: float) -> None:
        cause = cause_of(name)
        if cause is not None:
            with self._lock:
                self._intervals[cause].append((end - seconds, end))

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        """Mark an evaluation beside training under way (its ``eval`` span, which comes
        when it ends, may end after a step that waited on it)."""
        self._eval_since = time.perf_counter()
        try:
            yield
        finally:
            self._eval_since = None

    def parts(
        self, wait_start: float, wait_end: float, *, train_s: float, sync_s: float, other_s: float
    ) -> dict[str, float]:
        """``step_time/<part>_s`` for a step whose wait for the batch ran from ``wait_start``
        to ``wait_end`` (``time.perf_counter()`` readings), and ``step_time/wall_s``, their
        sum. Spans that ended before ``wait_end`` are then forgotten."""
        with self._lock:
            intervals = {c: list(v) for c, v in self._intervals.items()}
            if self._eval_since is not None:
                intervals["evaluation"].append((self._eval_since, wait_end))
            self._intervals = {
                c: [iv for iv in v if iv[1] > wait_end] for c, v in self._intervals.items()
            }
        split = split_window(wait_start, wait_end, intervals)
        parts = {**split, "train": train_s, "weight_sync": sync_s, "other": other_s}
        out = {f"step_time/{k}_s": v for k, v in parts.items()}
        out["step_time/wall_s"] = sum(parts.values())
        return out
