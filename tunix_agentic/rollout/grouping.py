"""Which groups the learner gets, and when the next may start: pure bookkeeping, no I/O.

Two small objects the orchestrator consults, apart from the machinery that runs
episodes (and testable without an engine or an event loop):

* :class:`GroupFilter` decides whether a finished group is worth training on
  (DAPO dynamic sampling: no signal in identical rewards; RAGEN's reward-std
  floor; too few scoreable members) and counts filtered groups in a row.
* :class:`StalenessPacer` holds the finished groups and the counts of running
  ones by the policy version that admitted them. It says whether a new group
  may start (the step that consumes it is at most ``max_staleness`` versions
  ahead of the policy that starts it) and which finished group goes into the
  batch being filled next (oldest admission first, holding slots for running
  groups that would otherwise go stale).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
from typing import Any, Literal, Protocol

import numpy as np

Verdict = Literal["keep", "too_small", "filtered"]


class FinishedGroup(Protocol):
    """What the pacer and the filter read of a group."""

    index: int
    admitted_version: int

    @property
    def rewards(self) -> np.ndarray: ...

    @property
    def min_version(self) -> int: ...


@dataclasses.dataclass
class GroupFilter:
    """Keep a group only if it can teach something.

    ``group_size``: the members a group was asked for (a group of one is never
    "too small"); ``uniform``: drop groups whose rewards are all equal;
    ``min_reward_std``: also drop those whose reward std is at most this.
    """

    group_size: int
    uniform: bool = True
    min_reward_std: float = 0.0
    filtered_in_a_row: int = 0  # consecutive "filtered" verdicts (a policy that never learns)

    def verdict(self, group: FinishedGroup) -> Verdict:
        rewards = np.asarray(group.rewards, np.float32)
        if rewards.size < 2 and self.group_size >= 2:
            return "too_small"
        uniform = self.uniform and rewards.size and np.all(rewards == rewards[0])
        low_signal = self.min_reward_std > 0 and float(rewards.std()) <= self.min_reward_std
        if uniform or low_signal:
            self.filtered_in_a_row += 1
            return "filtered"
        self.filtered_in_a_row = 0
        return "keep"


class StalenessPacer:
    """Admission and batch assembly under a staleness bound.

    The learner consumes batches of ``groups_per_batch`` groups and publishes
    version v after the v-th. A group admitted under version ``a`` is consumed
    by the step ``batches_taken + ahead``, so it may start only while that is at
    most ``a + max_staleness``.
    """

    def __init__(self, groups_per_batch: int, max_staleness: int):
        self.groups_per_batch = groups_per_batch
        self.max_staleness = max_staleness
        self.version = 0  # the newest policy the learner published
        self.batches_taken = 0
        self.filling = 0  # groups already taken into the batch being filled
        self._running: collections.Counter[int] = collections.Counter()  # by admitted version
        self._ready: list[tuple[int, Any]] = []  # heap by admission index: oldest first

    # ---------------------------------------------------------------- counts
    @property
    def running(self) -> int:
        """Groups admitted and not yet finished."""
        return sum(self._running.values())

    @property
    def ready(self) -> int:
        """Finished groups waiting for a batch."""
        return len(self._ready)

    # --------------------------------------------------------------- events
    def set_version(self, version: int) -> None:
        """The learner published ``version`` (v batches were consumed; also on resume)."""
        self.version = version
        self.batches_taken = max(self.batches_taken, version)

    def may_admit(self) -> bool:
        queued = self.running + self.ready + self.filling
        ahead = queued // self.groups_per_batch
        return self.batches_taken + ahead - self.version <= self.max_staleness

    def admitted(self, version: int) -> None:
        self._running[version] += 1

    def finished(self, admitted_version: int, group: FinishedGroup | None = None) -> None:
        """A group admitted under ``admitted_version`` ended; ``group`` if it is kept."""
        if self._running[admitted_version] <= 0:
            raise RuntimeError(f"no group admitted under version {admitted_version} is running")
        self._running[admitted_version] -= 1
        if not self._running[admitted_version]:
            del self._running[admitted_version]
        if group is not None:
            self.add_ready(group)

    def add_ready(self, group: FinishedGroup) -> None:
        heapq.heappush(self._ready, (group.index, group))

    # ------------------------------------------------------- batch assembly
    def urgent_running(self) -> int:
        """Running groups that go stale unless they make the batch for the current version."""
        limit = self.version - self.max_staleness
        return sum(n for admitted, n in self._running.items() if admitted <= limit)

    def too_stale(self, group: FinishedGroup) -> bool:
        """Sampled (in part) by a policy more than ``max_staleness`` versions old."""
        return self.version - group.min_version > self.max_staleness

    def next_ready(self, slots_left: int) -> Any | None:
        """The oldest finished group, unless its slot is needed by a running urgent one."""
        if not self._ready:
            return None
        _, oldest = self._ready[0]
        urgent = oldest.admitted_version <= self.version - self.max_staleness
        if not urgent and slots_left <= self.urgent_running():
            return None  # wait: taking a younger group now would strand an older one
        return heapq.heappop(self._ready)[1]

    def batch_done(self) -> None:
        self.filling = 0
        self.batches_taken += 1
