"""The engine's clock: every second of its life is device-busy, host gap or idle.

- *busy*: a dispatched call was running on the device;
- *host gap*: work was waiting but no call was running (host-side cost:
  scheduling, compiles, Python);
- *idle*: nothing to do (no request active or queued).

The scheduler tells the clock when idle periods start and end and, for each
device call, when it was dispatched and when it completed; completion times
come from a thread that blocks on each call, so they are taken when they
happen. Pure Python: the times are passed in.

Each device call and host gap is told, as it is accounted, to the observers of
:mod:`tunix_agentic.metrics.device_calls` (a run's timeline:
:mod:`tunix_agentic.metrics.trace`).
"""

from __future__ import annotations

import itertools
import time

from tunix_agentic.metrics import device_calls

_engine_ids = itertools.count()


class EngineClock:
    """Accumulates busy / host-gap / idle seconds from the scheduler's events."""

    def __init__(self, now: float | None = None):
        self.busy_s = 0.0
        self.sched_gap_s = 0.0
        self.idle_s = 0.0
        self.idle_since: float | None = None  # an idle period under way
        self._idle_spans: list[tuple[float, float]] = []  # since the device's last call
        self._device_done_at = time.perf_counter() if now is None else now
        self.engine_id = next(_engine_ids)  # for observers

    def start(self, now: float) -> None:
        """A scheduler thread starts: the device has been free since ``now``."""
        self._device_done_at = now

    def idle_from(self, now: float) -> None:
        self.idle_since = now

    def work_arrived(self, at: float) -> None:
        """End the idle period under way at ``at`` (when the first waiting work came)."""
        since = self.idle_since
        if since is None:
            return
        at = max(at, since)
        self.idle_s += at - since
        self._idle_spans.append((since, at))
        self.idle_since = None

    def account(self, dispatched: float, done: float, kind: str = "device") -> float:
        """One device call, dispatched and completed at these times; returns its busy seconds.

        Time between the previous call's completion and this dispatch is a host
        gap, less any idle period in between. ``kind`` names the call for observers.
        """
        free_from, free_to = self._device_done_at, dispatched
        if device_calls.observed():
            self._notify(kind, free_from, free_to, done)
        if free_to > free_from:  # the device had nothing queued in between
            idle = sum(
                max(0.0, min(end, free_to) - max(start, free_from))
                for start, end in self._idle_spans
            )
            self.sched_gap_s += max(0.0, free_to - free_from - idle)
        self._idle_spans = [span for span in self._idle_spans if span[1] > free_to]
        busy = max(0.0, done - max(free_from, free_to))
        self.busy_s += busy
        self._device_done_at = done
        return busy

    def _notify(self, kind: str, free_from: float, free_to: float, done: float) -> None:
        """Tell observers of the host gap's pieces (outside idle periods), then the call."""
        events, at = [], free_from
        for start, end in sorted(self._idle_spans):
            if end <= at or start >= free_to:
                continue
            if start > at:
                events.append(("host_gap", at, start))
            at = max(at, end)
        if free_to > at:
            events.append(("host_gap", at, free_to))
        events.append((kind, max(free_from, free_to), done))
        device_calls.notify(self.engine_id, events)

    def reading(self, now: float | None = None) -> dict[str, float]:
        """Busy, host-gap and idle seconds so far, the idle period under way included.

        Differences of two readings split the wall time between them.
        """
        idle = self.idle_s
        since = self.idle_since
        if since is not None:
            idle += (time.perf_counter() if now is None else now) - since
        return {"busy_s": self.busy_s, "sched_gap_s": self.sched_gap_s, "idle_s": idle}
