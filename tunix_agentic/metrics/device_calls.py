"""Who hears of the engines' device calls: the observers of every engine clock in a process.

An :class:`~tunix_agentic.inference.clock.EngineClock` tells :func:`notify` of each
device call and host gap as it accounts them; a run's timeline
(:class:`~tunix_agentic.metrics.trace.TraceWriter`) listens with :func:`add_observer`.
The registry lives with the metrics so that a listener needs no engine: the engine
reports here, the way it reports to a :class:`~tunix_agentic.metrics.sink.MetricsSink`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

_log = logging.getLogger(__name__)

# fn(engine_id, name, start, end): name is the call's kind ("prefill", "decode") or
# "host_gap"; start and end are time.perf_counter() readings.
Observer = Callable[[int, str, float, float], None]
_observers: tuple[Observer, ...] = ()  # replaced, never mutated: read without a lock


def add_observer(fn: Observer) -> None:
    """Call ``fn(engine_id, name, start, end)`` for each device call and host gap of every
    engine clock in this process from now on (``engine_id`` tells the engines apart).

    ``fn`` runs on the engine's scheduler thread: it must be quick and thread-safe. One
    that raises is removed (and its error logged), so the engine never fails for it.
    """
    global _observers
    _observers = (*_observers, fn)


def remove_observer(fn: Observer) -> None:
    """Stop calling ``fn`` (no error if it was not added)."""
    global _observers
    _observers = tuple(o for o in _observers if o != fn)  # a bound method: equal, not same


def observed() -> bool:
    """Whether anyone listens (a clock skips working out the events when no one does)."""
    return bool(_observers)


def notify(engine_id: int, events: Iterable[tuple[str, float, float]]) -> None:
    """Hand ``(name, start, end)`` events of engine ``engine_id`` to every observer; one
    that raises is removed."""
    events = list(events)
    for fn in _observers:
        try:
            for name, start, end in events:
                fn(engine_id, name, start, end)
        except Exception:
            remove_observer(fn)
            _log.exception("engine clock observer %r failed; removed", fn)
