"""The RolloutOrchestrator: many episodes at once, grouped as they complete.

Each episode moves through three stages, INIT, RUN and EVAL, run by the
:class:`~tunix_agentic.rollout.episode.EpisodeRunner` the orchestrator owns.
G episodes of one task form a group; a group is emitted the moment its last
episode ends, in completion order, onto a queue the learner reads.

Admission pacing bounds staleness without throwing finished work away: a new
group is admitted only while the step that will consume it is at most
``max_staleness`` versions ahead of the policy that starts it. Which groups are
kept and when the next may start are decided by the pure objects of
:mod:`tunix_agentic.rollout.grouping`; this module runs the episodes.

INIT ahead of admission (``prefetch_groups``): creating and resetting a
sandbox involves no policy, so during continuous production up to that many
groups are initialised *before* the staleness gate opens. An admitted group
then starts RUN at once; the pacing window is spent on generation, tools and
the verifier only, which buys throughput at the same staleness bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import Environment
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.metrics.sink import MetricsSink, NullMetrics
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.episode import (
    EVAL_STREAM,
    PRODUCTION_STREAM,
    EpisodeRunner,
    Group,
    InfraFailureError,
    InitResult,
)
from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer, Verdict
from tunix_agentic.rollout.outages import HealthProbe


@dataclasses.dataclass(frozen=True)
class PreparedGroup:
    """A group INIT'ed ahead of admission: group ``index`` of the task stream, on ``task``."""

    index: int
    task: Any
    members: list[InitResult]


class RolloutOrchestrator:
    """Drives episodes against ``engine`` and hands full groups to the learner.

    ``start()`` begins continuous production from ``tasks``; ``await
    get_batch()`` returns ``groups_per_batch`` groups (sorted by admission
    index, so a synchronous run is reproducible); ``set_version(v)`` tells the
    pacer that the learner published version v. ``run_tasks`` runs a fixed list
    once (evaluation, baselines) with the same machinery, on seeds of its own.

    ``env_factory`` builds each episode's environment: called with no argument,
    or with the task when it takes one (a multi-environment run picks the
    environment by the task's source). An environment's ``timings`` dict, if it
    has one after ``reset`` (e.g. ``{"sandbox_start": seconds}``), is recorded as
    ``env/<key>`` times.

    An episode that failed on infrastructure is retried after a jittered back-off
    (``rollout.infra_backoff_s``). Before the failure counts towards
    ``rollout.max_infra_failures_in_a_row``, ``backend_health(task)`` is asked
    whether the task's environment backend is up (True), down (False) or cannot
    tell (None); a backend that is down is waited for (``rollout.backend_wait_s``)
    and the failures of episodes begun before it came back do not count (see
    :mod:`tunix_agentic.rollout.outages`). By default an environment answers for its
    backend: the newest environment of the task's source that has an
    ``async backend_health() -> bool`` is asked (closed by then: it asks the backend,
    not the episode; :class:`~tunix_agentic.envs.remote.RemoteEnv` asks its server's
    ``/health``); sources whose environments have none cannot tell.

    ``checkpoint_state()`` / ``restore_state()`` carry the task stream across a
    restart exactly: tasks drawn but not yet trained on (running or finished
    groups) are drawn again, with the same group indices and seeds, by a
    restored orchestrator.
    """

    def __init__(
        self,
        engine: InferenceEngine,
        env_factory: Callable[..., Environment],
        template: ChatFormat,
        agent_config: AgentConfig,
        config: RolloutConfig,
        *,
        tasks: Iterator[Any] | None = None,
        metrics: MetricsSink | None = None,
        backend_health: HealthProbe | None = None,
    ):
        self.engine = engine
        self.template = template
        self.config = config
        self.tasks = tasks
        self.metrics = metrics = NullMetrics() if metrics is None else metrics
        self.pacer = StalenessPacer(config.groups_per_batch, config.max_staleness)
        self.group_filter = GroupFilter(
            config.group_size, config.filter_uniform_groups, config.min_reward_std
        )
        self._ready_changed = asyncio.Event()
        self._fatal: Exception | None = None
        self._admission_pauses = 0  # evaluations that hold new groups back (admission_paused)
        self._changed = asyncio.Event()
        self._group_counter = itertools.count()
        self._eval_counter = itertools.count()
        self._next_index = 0  # group index of the next task drawn from ``tasks``
        # Drawn, not yet trained on or filtered: group index -> the task stream's state just
        # before that draw (restored and drawn again after a restart).
        self._untrained: dict[int, Any] = {}
        self._replay: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None
        # Prefetched groups in task order, each resolving to a PreparedGroup.
        self._prepared: collections.deque[asyncio.Task[PreparedGroup]] = collections.deque()
        self.stats = {
            "groups_emitted": 0,
            "groups_filtered": 0,
            "groups_too_small": 0,
            "infra_failures": 0,
            "infra_retries": 0,
            "stale_dropped": 0,
        }
        self.episodes = EpisodeRunner(
            engine,
            env_factory,
            template,
            agent_config,
            config,
            metrics=metrics,
            backend_health=backend_health,
            spawn=self._spawn,
            fail=self._fail,
            stats=self.stats,
        )

    @property
    def env_factory(self) -> Callable[..., Environment]:
        """Builds each episode's environment (the episode runner's; settable)."""
        return self.episodes.env_factory

    @env_factory.setter
    def env_factory(self, factory: Callable[..., Environment]) -> None:
        self.episodes.env_factory = factory

    @property
    def agent_config(self) -> AgentConfig:
        """The agent settings production episodes run with (the episode runner's; settable)."""
        return self.episodes.agent_config

    @agent_config.setter
    def agent_config(self, agent_config: AgentConfig) -> None:
        self.episodes.agent_config = agent_config

    # ------------------------------------------------------------ production
    def start(self) -> None:
        if self.tasks is None:
            raise ValueError("RolloutOrchestrator.start needs a task iterator")
        if self._producer is None:
            self._producer = asyncio.get_running_loop().create_task(
                self._produce(), name="rollout-producer"
            )

    async def stop(self) -> None:
        """Cancel production and every in-flight episode; environments are closed."""
        if self._producer is not None:
            self._producer.cancel()
        pending = list(self._tasks) + ([self._producer] if self._producer else [])
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._producer = None
        await self._discard_prepared()

    async def _discard_prepared(self) -> None:
        """Close every environment initialised ahead of admission and never run."""
        prepared, self._prepared = list(self._prepared), collections.deque()
        for t in prepared:
            t.cancel()  # still initialising: the group closes what it made (see _prepare_group)
        for result in await asyncio.gather(*prepared, return_exceptions=True):
            if not isinstance(result, BaseException):
                await self.episodes.close_members(result.members)

    @property
    def version(self) -> int:
        """The newest policy version the learner published."""
        return self.pacer.version

    def set_version(self, version: int) -> None:
        """The learner published ``version``: v batches were consumed (also on resume)."""
        self.pacer.set_version(version)
        self._changed.set()

    @contextlib.contextmanager
    def admission_paused(self) -> Iterator[None]:
        """Admit no new group of the task stream inside (evaluation first): groups under
        way go on, and INIT ahead of admission too."""
        self._admission_pauses += 1
        try:
            yield
        finally:
            self._admission_pauses -= 1
            self._changed.set()

    @property
    def running_groups(self) -> int:
        """Groups admitted and not yet finished."""
        return self.pacer.running

    @property
    def pending_work(self) -> int:
        """Tasks this orchestrator still owns: episodes and groups under way, prefetches."""
        return len(self._tasks) + len(self._prepared)

    def prefetched(self) -> list[list[InitResult]]:
        """The INIT results of prefetched groups ready to run, in task order, one list per
        group (still-initialising ones left out)."""
        return [t.result().members for t in self._prepared if t.done() and not t.cancelled()]

    def _next_task(self) -> tuple[int, Any]:
        """``(group index, task)``: a task to replay after a restart, else the stream's next."""
        if self._replay:
            index, task, before = self._replay.popleft()
        else:
            before = self.tasks.get_state() if hasattr(self.tasks, "get_state") else None
            try:
                task = next(self.tasks)
            except StopIteration:
                raise RuntimeError("the task iterator is exhausted") from None
            index, self._next_index = self._next_index, self._next_index + 1
        self._untrained[index] = before
        return index, task

    def _done_with(self, group: Group) -> None:
        """``group``'s task needs no rerun after a restart (trained on, filtered or dropped)."""
        self._untrained.pop(group.index, None)

    def checkpoint_state(self) -> dict[str, Any]:
        """The task stream's position, JSON-serialisable, for :meth:`restore_state`."""
        if not hasattr(self.tasks, "get_state"):
            raise ValueError("the task iterator has no get_state(): it cannot be checkpointed")
        pending = sorted(self._untrained.items()) + [(i, st) for i, _, st in self._replay]
        return {
            "task_iterator": self.tasks.get_state(),
            "next_index": self._next_index,
            "pending": [[index, before] for index, before in pending],
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue the task stream saved by :meth:`checkpoint_state` (before ``start()``)."""
        self._replay.clear()
        for index, before in state.get("pending", []):
            self.tasks.set_state(before)
            self._replay.append((int(index), next(self.tasks), before))
        self.tasks.set_state(state["task_iterator"])
        self._next_index = int(state.get("next_index", 0))

    def _fill_prefetch(self) -> None:
        while len(self._prepared) < self.config.prefetch_groups:
            index, task = self._next_task()
            self._prepared.append(
                asyncio.get_running_loop().create_task(self._prepare_group(index, task))
            )

    async def _produce(self) -> None:
        try:
            while True:
                if self.config.prefetch_groups:
                    self._fill_prefetch()
                while self._admission_pauses or not self.pacer.may_admit():
                    self._changed.clear()
                    await self._changed.wait()
                if self.config.prefetch_groups:
                    prepared = await self._prepared[0]  # in task order
                    self._prepared.popleft()
                    index, task, members = prepared.index, prepared.task, prepared.members
                else:
                    (index, task), members = self._next_task(), None
                # The version is read once: the pacer's count and the group's stamp must agree
                # even when a new version is published before the group's task first runs.
                admitted = self.version
                self.pacer.admitted(admitted)
                self._spawn(self._produce_group(index, task, members, admitted))
        except Exception as exc:  # surface it to the learner instead of hanging get_batch
            self._fail(exc)
            raise

    async def _prepare_group(self, index: int, task: Any) -> PreparedGroup:
        """INIT for every member of a group ahead of admission (see
        :meth:`EpisodeRunner.init_group <tunix_agentic.rollout.episode.EpisodeRunner.init_group>`)."""
        return PreparedGroup(
            index, task, await self.episodes.init_group(task, self.config.group_size)
        )

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _produce_group(
        self, index: int, task: Any, members: list[InitResult] | None, admitted: int
    ) -> None:
        kept = None
        try:
            group = await self.run_group(task, prepared=members, index=index, version=admitted)
            if self.judge(group) == "keep":
                kept = group
                self.stats["groups_emitted"] += 1
            else:
                self._done_with(group)
        except Exception as exc:  # a bug of ours: surface it instead of losing the group
            self._fail(exc)
            raise
        finally:
            self.pacer.finished(admitted, kept)
            self._changed.set()
            self._ready_changed.set()
            self.metrics.gauge("queue/ready_groups", self.pacer.ready)
            self.metrics.gauge("queue/in_flight_groups", self.pacer.running)

    def judge(self, group: Group) -> Verdict:
        """The group filter's verdict on ``group`` ("keep", "too_small" or "filtered"),
        counted; too many "filtered" in a row stop the run with an error."""
        verdict = self.group_filter.verdict(group)
        if verdict == "too_small":
            self.stats["groups_too_small"] += 1
            self.metrics.count("rollout/groups_too_small")
        elif verdict == "filtered":
            self.stats["groups_filtered"] += 1
            self.metrics.count("rollout/groups_filtered")
            streak = self.group_filter.filtered_in_a_row
            if streak >= self.config.max_filtered_in_a_row:
                self._fail(RuntimeError(_all_filtered_message(streak, group.rewards.tolist())))
        return verdict

    def _fail(self, exc: Exception) -> None:
        """Stop the run with ``exc``: the learner's next (or current) ``get_batch`` raises it."""
        if self._fatal is None:
            self._fatal = exc
        self._ready_changed.set()

    def offer(self, group: Group) -> None:
        """Hand a finished group straight to batch assembly (groups from :meth:`run_group`
        outside production: tests, replays); it is not filtered."""
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
            if self._fatal is not None:
                raise self._fatal
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
                self._done_with(group)
                continue
            batch.append(group)
            pacer.filling = len(batch)
        pacer.batch_done()
        self._changed.set()
        for group in batch:
            self._done_with(group)
        return sorted(batch, key=lambda g: g.index)

    # ------------------------------------------------------------- episodes
    async def run_tasks(
        self, tasks: list[Any], *, group_size: int = 1, agent_config: AgentConfig | None = None
    ) -> list[Group]:
        """Run each task once as a group of ``group_size``; returns groups in task order.

        Episodes draw their seeds from the evaluation stream (``tasks[i]`` is
        group ``i`` of it, counting on across calls), so running an evaluation
        changes no training episode's seed. Raises :class:`InfraFailureError`
        when episodes kept failing on infrastructure meanwhile.
        """
        groups = list(
            await asyncio.gather(
                *(
                    self.run_group(
                        t,
                        group_size=group_size,
                        agent_config=agent_config,
                        index=next(self._eval_counter),
                        stream=EVAL_STREAM,
                    )
                    for t in tasks
                )
            )
        )
        if isinstance(self._fatal, InfraFailureError):
            raise self._fatal
        return groups

    async def run_group(
        self,
        task: Any,
        *,
        group_size: int | None = None,
        agent_config: AgentConfig | None = None,
        prepared: list[InitResult] | None = None,
        index: int | None = None,
        stream: int = PRODUCTION_STREAM,
        version: int | None = None,
    ) -> Group:
        """Run one group of ``task``; ``prepared`` holds environments already INIT'ed.

        ``index`` numbers the group within its seed ``stream`` (by default the
        next of a private counter); with the run's seed it fixes every member's
        sampling seed. ``version``: the policy version that admitted the group
        (default: the current one).
        """
        if index is None:
            index = 1_000_000_000 + next(self._group_counter)  # apart from the task stream's
        return await self.episodes.run_group(
            task,
            index=index,
            version=self.version if version is None else version,
            group_size=group_size,
            agent_config=agent_config,
            prepared=prepared,
            stream=stream,
        )


def _all_filtered_message(streak: int, rewards: list[float]) -> str:
    """Why the run stopped with every group filtered, and the knobs that change it."""
    low = max(rewards, default=0.0) <= 0.0
    cause = (
        "the policy never succeeds: warm it up longer (sft.steps; check that the "
        "demonstrations solve the tasks and the reward scores them 1)"
        if low
        else "the policy gets the same reward on every try: make the tasks harder or the "
        "reward finer"
    )
    return (
        f"{streak} groups in a row had identical or low-variance rewards (last: {rewards}) "
        f"and were filtered out, so there is nothing to learn from: {cause}; or keep them "
        "with rollout.filter_uniform_groups=false (and rollout.min_reward_std=0), or wait "
        "longer with a higher rollout.max_filtered_in_a_row"
    )
