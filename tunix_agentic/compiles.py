"""Counting XLA compilations of jitted functions, from JAX's public monitoring events.

A jitted function compiles once per distinct shape, dtype and placement of its
arguments; tests pin how many shapes a run meets (``engine.compiles``,
``learner.compiles``). :class:`CompileCounter` wraps jitted functions and counts the
backend compilations JAX reports (``jax.monitoring``'s duration event for each
backend compile) while a wrapped call runs on the calling thread, so nothing is
counted or mutated while tracing, and two engines compiling on two threads count
apart. A compilation served from JAX's persistent cache is not one.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import jax

# The event JAX records once per XLA backend compilation (jax._src.dispatch).
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_active = threading.local()  # .counts / .name: the wrapped call under way on this thread
_listening = False
_listen_lock = threading.Lock()


def _on_duration(event: str, duration_secs: float, **kwargs: Any) -> None:
    del duration_secs, kwargs
    if event != BACKEND_COMPILE_EVENT:
        return
    counts = getattr(_active, "counts", None)
    if counts is not None:
        counts[_active.name] += 1


def _listen() -> None:
    global _listening
    with _listen_lock:
        if not _listening:
            jax.monitoring.register_event_duration_secs_listener(_on_duration)
            _listening = True


class CompileCounter:
    """Compilations per name of the functions wrapped by :meth:`wrap`."""

    def __init__(self) -> None:
        self._counts: collections.Counter[str] = collections.Counter()
        _listen()

    @contextlib.contextmanager
    def counting(self, name: str) -> Iterator[None]:
        """Count the compilations on this thread under ``name`` while the block runs (for
        ahead-of-time ``fn.lower(...).compile()``)."""
        self._counts[name] += 0
        outer = (getattr(_active, "counts", None), getattr(_active, "name", None))
        _active.counts, _active.name = self._counts, name
        try:
            yield
        finally:
            _active.counts, _active.name = outer

    def wrap(self, name: str, fn: Callable) -> Callable:
        """``fn`` (a jitted function) whose compilations count under ``name``."""
        self._counts[name] += 0

        counts = self._counts

        @functools.wraps(fn)
        def call(*args, **kwargs):
            outer = (getattr(_active, "counts", None), getattr(_active, "name", None))
            _active.counts, _active.name = counts, name
            try:
                return fn(*args, **kwargs)
            finally:
                _active.counts, _active.name = outer

        return call

    @property
    def counts(self) -> dict[str, int]:
        return dict(self._counts)

    def __getitem__(self, name: str) -> int:
        return self._counts[name]
