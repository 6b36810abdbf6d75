"""The learner's side of rollout: finished groups judged, queued and taken as batches.

A group that finishes is judged by the :class:`~tunix_agentic.rollout.grouping.GroupFilter`
(kept, too small or filtered: counted; too many filtered in a row stop the run) and a
kept one waits in the :class:`~tunix_agentic.rollout.grouping.StalenessPacer` until
:meth:`BatchQueue.get_batch` takes it, oldest admission first. A failure anywhere in
rollout stops the run here: the learner's next (or current) ``get_batch`` raises it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tunix_agentic.metrics.sink import MetricsSink
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.group import Group
from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer, Verdict

_log = logging.getLogger(__name__)


class BatchQueue:
    """Finished groups on their way to the learner, for one orchestrator.

    Shares the orchestrator's ``pacer``, ``stats`` and ``metrics``; ``done_with(index)``
    tells the task stream that a group needs no rerun after a restart (taken, filtered or
    dropped); ``freed()`` wakes the producer (a batch taken frees admission).
    """

    def __init__(
        self,
        config: RolloutConfig,
        pacer: StalenessPacer,
        *,
        stats: dict[str, int],
        metrics: MetricsSink,
        done_with: Callable[[int], None],
        freed: Callable[[], None],
    ):
        self.config, self.pacer, self.stats, self.metrics = config, pacer, stats, metrics
        self.group_filter = GroupFilter(
            config.group_size, config.filter_uniform_groups, config.min_reward_std
        )
        self._done_with, self._freed = done_with, freed
        self.fatal: Exception | None = None
        self._ready_changed = asyncio.Event()

    def fail(self, exc: Exception) -> None:
        """Stop the run with ``exc`` (the first failure wins)."""
        if self.fatal is None:
            self.fatal = exc
        self._ready_changed.set()

    def changed(self) -> None:
        """A group finished (kept or not): ``get_batch`` looks again."""
        self._ready_changed.set()

    @property
    def warn_filtered_at(self) -> int:
        """The streak of filtered groups that logs a warning (once a streak): four
        batches' worth, at least 16, and never past ``max_filtered_in_a_row``."""
        return min(self.config.max_filtered_in_a_row, max(16, 4 * self.config.groups_per_batch))

    def judge(self, group: Group) -> Verdict:
        """The group filter's verdict on ``group`` ("keep", "too_small" or "filtered"),
        counted; a long streak of "filtered" logs a warning naming the cause (gauge
        ``rollout/filtered_streak_groups``), and ``max_filtered_in_a_row`` stop the run."""
        verdict = self.group_filter.verdict(group)
        if verdict == "too_small":
            self.stats["groups_too_small"] += 1
            self.metrics.count("rollout/groups_too_small")
        elif verdict == "filtered":
            self.stats["groups_filtered"] += 1
            self.metrics.count("rollout/groups_filtered")
        streak = self.group_filter.filtered_in_a_row
        self.metrics.gauge("rollout/filtered_streak_groups", streak)
        if verdict != "filtered":
            return verdict
        own = self.config.service.agent == "own_tasks"
        rewards = group.rewards.tolist()
        if streak >= self.config.max_filtered_in_a_row:
            self.fail(RuntimeError(_all_filtered_message(streak, rewards, own_tasks=own)))
        elif streak == self.warn_filtered_at:
            # The trainer waits for a group it can learn from; say why it is waiting
            # long before the run stops.
            _log.warning(
                "still waiting: %s; the run stops at %d in a row",
                _all_filtered_message(streak, rewards, own_tasks=own),
                self.config.max_filtered_in_a_row,
            )
        return verdict

    def offer(self, group: Group) -> None:
        """Queue a finished group as it is (not filtered)."""
        self.pacer.add_ready(group)
        self._ready_changed.set()

    async def get_batch(self) -> list[Group]:
        """The next ``groups_per_batch`` groups; waits for them while rollout goes on.

        With ``min_groups_per_batch`` set, returns as soon as that many are in
        hand and no more are ready (a variable batch, as in AgentRL).

        Finished groups are taken oldest admission first, and slots are held for
        running groups that would exceed ``max_staleness`` if left for the next
        step: the learner waits a little for a straggler rather than discard it.
        A group that is too stale anyway (more stragglers than a batch holds) is
        dropped and counted.
        """
        batch: list[Group] = []
        pacer = self.pacer
        at_least = self.config.min_groups_per_batch or self.config.groups_per_batch
        while len(batch) < self.config.groups_per_batch:
            if self.fatal is not None:
                raise self.fatal
            group = pacer.next_ready(self.config.groups_per_batch - len(batch))
            if group is None and len(batch) >= at_least and not pacer.urgent_running():
                break  # variable batch size: enough to train on, and nothing old is left behind
            if group is None:
                self._ready_changed.clear()
                await self._ready_changed.wait()
                continue
            if pacer.too_stale(group):
                self.stats["stale_dropped"] += 1
                self.metrics.count("rollout/stale_dropped")
                self._done_with(group.index)
                continue
            batch.append(group)
            pacer.filling = len(batch)
        pacer.batch_done()
        self._freed()
        for group in batch:
            self._done_with(group.index)
        return sorted(batch, key=lambda g: g.index)


def _all_filtered_message(streak: int, rewards: list[float], *, own_tasks: bool = False) -> str:
    """Why every group is filtered, and the knobs that change it; ``own_tasks``: the
    groups are outside agents' own tasks (``rollout.service.agent=own_tasks``), which
    only the agents choose."""
    low = max(rewards, default=0.0) <= 0.0
    if own_tasks:
        cause = (
            "the policy never succeeds on the agents' own tasks: warm it up, or give the "
            "agents easier tasks"
            if low
            else "the agents' own tasks get the same reward on every try (a policy that "
            "solves them all): give the agents harder tasks or a finer reward"
        )
    elif low:
        cause = (
            "the policy never succeeds: warm it up longer (sft.steps; check that the "
            "demonstrations solve the tasks and the reward scores them 1)"
        )
    else:
        cause = (
            "the policy gets the same reward on every try: make the tasks harder or the "
            "reward finer"
        )
    return (
        f"{streak} groups in a row had identical or low-variance rewards (last: {rewards}) "
        f"and were filtered out, so there is nothing to learn from: {cause}; or keep them "
        "with rollout.filter_uniform_groups=false (and rollout.min_reward_std=0), or wait "
        "longer with a higher rollout.max_filtered_in_a_row"
    )
