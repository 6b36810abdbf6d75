"""Least-loaded routing with sticky sessions: the pool's choice of backend, apart from
its failover, health and weight-update machinery.

:class:`Router` keeps one min-heap entry per backend keyed by ``(in_flight, stamp)``
(lazy invalidation: a backend's count change pushes a fresh entry and the older ones
turn stale) and a bounded LRU of session pins. Counts are the pool's own live counts:
they go down when a request ends, however it ends.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections import OrderedDict
from collections.abc import Sequence

from tunix_agentic.inference.base import InferenceEngine


@dataclasses.dataclass
class Backend:
    """The pool's view of one backend."""

    index: int
    name: str
    engine: InferenceEngine
    healthy: bool = True
    in_flight: int = 0  # requests the pool has sent it that are still awaiting
    failures: int = 0  # consecutive infrastructure failures
    served: int = 0  # successful requests
    weights_version: int | None = None  # last version it applied through the pool
    stamp: int = -1  # id of its one valid heap entry (lazy invalidation)

    def applied(self, version: int) -> None:
        """It applied ``version``; updates apply in order, so the newest confirmed stays."""
        self.weights_version = max(version, self.weights_version or version)


class Router:
    """Which backend serves a request: the session's pin, else the least-loaded one."""

    def __init__(self, backends: Sequence[Backend], max_sessions: int):
        self.backends = list(backends)
        self.max_sessions = max_sessions
        self.heap: list[tuple[int, int, int]] = []  # (in_flight, stamp, index)
        self._stamps = itertools.count()
        for b in self.backends:
            self.push(b)
        self.sessions: OrderedDict[str, int] = OrderedDict()  # session id -> backend index

    def choose(self, session_id: str | None, tried: set[int]) -> Backend | None:
        """The session's backend if it can serve, else the least-loaded candidate (re-pinned)."""
        if session_id is not None:
            idx = self.sessions.get(session_id)
            if idx is not None:
                self.sessions.move_to_end(session_id)
                pinned = self.backends[idx]
                if pinned.healthy and idx not in tried:
                    return pinned
        backend = self.least_loaded(tried)
        if backend is not None and session_id is not None:
            self.sessions[session_id] = backend.index
            self.sessions.move_to_end(session_id)
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        return backend

    def least_loaded(self, exclude: set[int]) -> Backend | None:
        """Peek the healthy, not-excluded backend with the fewest live requests.

        Entries whose stamp is not the backend's current one are stale and
        dropped; valid entries that do not qualify are pushed back, so each
        backend keeps exactly one valid entry. Ties go to the backend whose
        count changed longest ago.
        """
        popped: list[tuple[int, int, int]] = []
        chosen = None
        while self.heap:
            entry = heapq.heappop(self.heap)
            _, stamp, idx = entry
            b = self.backends[idx]
            if stamp != b.stamp:
                continue
            popped.append(entry)
            if b.healthy and idx not in exclude:
                chosen = b
                break
        for entry in popped:
            heapq.heappush(self.heap, entry)
        return chosen

    def push(self, b: Backend) -> None:
        """Give ``b`` a fresh heap entry for its current count; older ones turn stale."""
        b.stamp = next(self._stamps)
        heapq.heappush(self.heap, (b.in_flight, b.stamp, b.index))
        if len(self.heap) > 4 * len(self.backends) + 32:
            self.heap = [(x.in_flight, x.stamp, x.index) for x in self.backends]
            heapq.heapify(self.heap)

    def add_in_flight(self, b: Backend, delta: int) -> None:
        b.in_flight += delta
        self.push(b)
