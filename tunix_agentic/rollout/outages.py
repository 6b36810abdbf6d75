"""Backend outages: retries that back off, and failures a restarted backend excuses.

When an environment backend restarts (``tunix-agentic serve-env`` killed and
started again), every episode in flight fails on infrastructure at once, and a
retry started at once fails too. Two pieces keep such a restart from stopping a
run through ``rollout.max_infra_failures_in_a_row``:

* :func:`backoff_delay`: a retry waits a jittered, exponentially growing,
  bounded delay (AWS's "full jitter"), so a burst of failures does not return
  as a burst.
* :class:`OutageGate`: after a failure the backend is asked whether it is up.
  One that says it is down is watched (one poll loop per backend, shared by
  every failing episode) for up to ``wait_s``; the failures of episodes that
  started before it came back are the outage's, not the run's, and do not
  count. A backend that stays down longer, says it is up, or cannot tell
  leaves its failures counted as before.

A backend is keyed by the task's ``task_name`` (one task source, one backend).
How to ask: a ``probe(task)`` coroutine answering True (up), False (down) or None
(this backend cannot tell), or by default the environments themselves: the newest
environment of each source noted (:meth:`OutageGate.note_env`) that has an
``async backend_health() -> bool`` is asked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tunix_agentic.trajectory import TaskLike, task_key

_log = logging.getLogger(__name__)

HealthProbe = Callable[[TaskLike], Awaitable["bool | None"]]

# A probe that has not answered after this long counts as "down".
PROBE_TIMEOUT_S = 10.0
# Polls of a backend that is down: the first after POLL_FIRST_S, doubling up to POLL_MAX_S.
POLL_FIRST_S, POLL_MAX_S = 0.1, 2.0


def backoff_delay(retry: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Seconds to wait before retry number ``retry`` (1 for the first): uniform in
    ``[0, min(max_s, base_s * 2**(retry - 1))]``."""
    if retry < 1:
        raise ValueError(f"retry must be >= 1, got {retry}")
    return rng.uniform(0.0, min(max_s, base_s * 2.0 ** min(retry - 1, 60)))


def backend_key(task: TaskLike) -> str:
    """The backend a task's episodes run on: its task source (``task_name``)."""
    return task_key(task).name


class OutageGate:
    """Tells a failure a backend outage caused (excused) from one that counts.

    ``probe(task)`` asks the backend of ``task`` whether it is up (None: ask the
    environments noted with :meth:`note_env`); ``wait_s``
    bounds the wait for one that is down; ``spawn(coro)`` starts the watch
    (the orchestrator's, so that stopping it cancels the watch too);
    ``metrics`` (optional) gets ``rollout/backend_down`` (outages seen, and
    seconds waited) and ``rollout/infra_failures_excused``.
    """

    def __init__(
        self,
        probe: HealthProbe | None,
        *,
        wait_s: float,
        spawn: Callable[[Any], asyncio.Task],
        metrics: Any = None,
    ):
        self.probe = probe or self._ask_env
        self._env_probes: dict[str, Callable[[], Awaitable[bool]] | None] = {}
        self.wait_s = float(wait_s)
        self.spawn = spawn
        self.metrics = metrics
        # Per backend: the watch of an outage under way (True: it came back; False: it
        # stayed down past wait_s, kept until an episode succeeds so no one waits again).
        self._outages: dict[str, asyncio.Task] = {}
        self._recovered_at: dict[str, float] = {}  # time.monotonic() it came back

    async def excuses(self, task: TaskLike, began: float) -> bool:
        """Whether a failed episode of ``task`` that began at ``began`` (``time.monotonic()``)
        is an outage's: it began before its backend last came back, or the backend is down
        now and comes back within ``wait_s`` (this waits for it)."""
        key = backend_key(task)
        if began <= self._recovered_at.get(key, -math.inf):
            return self._excused()
        watch = self._outages.get(key)
        if watch is not None and watch.cancelled():  # the orchestrator was stopped meanwhile
            del self._outages[key]
            watch = None
        if watch is None:
            if await self._ask(task, key) is not False:
                return False
            if began <= self._recovered_at.get(key, -math.inf):
                return self._excused()  # it went down and came back while this probe ran
            watch = self._outages.get(key)  # another episode may have found it down meanwhile
            if watch is None:
                watch = self._outages[key] = self.spawn(self._watch(task, key))
        if watch.done() and watch.result() is False:
            return False  # it stayed down past wait_s once: its failures count again
        if await asyncio.shield(watch):
            return self._excused()
        return False

    def note_env(self, task: TaskLike, env: Any) -> None:
        """``env`` was made for ``task``: its ``backend_health`` (if any) answers for the
        task's backend from now on (it must work once ``env`` is closed)."""
        self._env_probes[backend_key(task)] = getattr(env, "backend_health", None)

    async def _ask_env(self, task: TaskLike) -> bool | None:
        probe = self._env_probes.get(backend_key(task))
        return None if probe is None else bool(await probe())

    def succeeded(self, task: TaskLike) -> None:
        """An episode of ``task`` succeeded: its backend is up (a spent wait is forgotten)."""
        key = backend_key(task)
        watch = self._outages.get(key)
        if watch is not None and watch.done():
            del self._outages[key]

    async def _ask(self, task: TaskLike, key: str) -> bool | None:
        """The probe's answer: a probe that raises cannot tell, one that hangs is down."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT_S):
                answer = await self.probe(task)
        except TimeoutError:
            return False
        except Exception as exc:  # a probe's own bug: no excuse, and no stopping the run
            _log.warning("health probe of backend %r raised %s: %s", key, type(exc).__name__, exc)
            return None
        return None if answer is None else bool(answer)

    async def _watch(self, task: TaskLike, key: str) -> bool:
        """Poll a backend that is down until it is up (True) or ``wait_s`` passed (False)."""
        t0 = time.monotonic()
        deadline = t0 + self.wait_s
        self._count("rollout/backend_down")
        _log.warning(
            "environment backend %r is down; waiting up to %gs before its failures count",
            key,
            self.wait_s,
        )
        try:
            delay = POLL_FIRST_S
            while True:
                await asyncio.sleep(max(0.0, min(delay, deadline - time.monotonic())))
                delay = min(POLL_MAX_S, delay * 2)
                if await self._ask(task, key) is not False:
                    self._recovered_at[key] = time.monotonic()
                    self._outages.pop(key, None)
                    _log.warning(
                        "environment backend %r is back after %.1fs", key, time.monotonic() - t0
                    )
                    return True
                if time.monotonic() >= deadline:
                    _log.warning(
                        "environment backend %r still down after %gs: its failures count",
                        key,
                        self.wait_s,
                    )
                    return False
        finally:
            if self.metrics is not None:
                self.metrics.add_time("rollout/backend_down", time.monotonic() - t0)

    def _excused(self) -> bool:
        self._count("rollout/infra_failures_excused")
        return True

    def _count(self, name: str) -> None:
        if self.metrics is not None:
            self.metrics.count(name)
