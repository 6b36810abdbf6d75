"""The RolloutOrchestrator: many episodes at once, grouped as they complete.

Each episode moves through three stages, INIT, RUN and EVAL, run by the
orchestrator's :class:`~tunix_agentic.rollout.group_runner.GroupRunner`: in process
(:class:`~tunix_agentic.rollout.episode.EpisodeRunner`, built by
:meth:`RolloutOrchestrator.in_process`) or on rollout nodes
(:class:`~tunix_agentic.rollout.client.runner.ServiceEpisodeRunner`).
G episodes of one task form a group; a group is emitted the moment its last
episode ends, in completion order, onto a queue the learner reads.

Admission pacing bounds staleness without throwing finished work away: a new
group is admitted only while the step that will consume it is at most
``max_staleness`` versions ahead of the policy that starts it. Which groups are
kept and when the next may start are decided by the pure objects of
:mod:`tunix_agentic.rollout.grouping`; this module runs the episodes.

INIT ahead of admission (``prefetch_groups``, :mod:`tunix_agentic.rollout.prefetch`):
creating and resetting a sandbox involves no policy, so during continuous production
up to that many groups are initialised *before* the staleness gate opens (a
:class:`~tunix_agentic.rollout.group_runner.PrefetchingRunner` only). An admitted
group then starts RUN at once; the pacing window is spent on generation, tools and
the verifier only, which buys throughput at the same staleness bound. Finished
groups wait for the learner in a :class:`~tunix_agentic.rollout.batch_queue.BatchQueue`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import Environment
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.metrics.sink import MetricsSink, NullMetrics
from tunix_agentic.rollout.batch_queue import BatchQueue
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.episode import EpisodeRunner
from tunix_agentic.rollout.group import (
    EVAL_STREAM,
    PRODUCTION_STREAM,
    Group,
    InfraFailureError,
    InitResult,
    RunnerHooks,
)
from tunix_agentic.rollout.group_runner import (
    CheckpointingRunner,
    GroupRunner,
    PrefetchingRunner,
)
from tunix_agentic.rollout.grouping import StalenessPacer, Verdict
from tunix_agentic.rollout.outages import HealthProbe
from tunix_agentic.rollout.prefetch import Prefetch
from tunix_agentic.rollout.task_stream import TaskStream
from tunix_agentic.trajectory import TaskLike


class RolloutOrchestrator:
    """Drives episodes against ``engine`` and hands full groups to the learner.

    ``start()`` begins continuous production from ``tasks``; ``await
    get_batch()`` returns ``groups_per_batch`` groups (sorted by admission
    index, so a synchronous run is reproducible); ``set_version(v)`` tells the
    pacer that the learner published version v. ``run_tasks`` runs a fixed list
    once (evaluation, baselines) with the same machinery, on seeds of its own.

    ``runner`` runs the groups (a :class:`~tunix_agentic.rollout.group_runner.GroupRunner`,
    given the orchestrator's bookkeeping on arrival); :meth:`in_process` builds the
    orchestrator of an in-process :class:`~tunix_agentic.rollout.episode.EpisodeRunner`.
    ``rollout.prefetch_groups`` needs a runner that makes the environments here (a
    :class:`~tunix_agentic.rollout.group_runner.PrefetchingRunner`).

    ``checkpoint_state()`` / ``restore_state()`` carry the task stream across a
    restart exactly (:class:`~tunix_agentic.rollout.task_stream.TaskStream`): tasks drawn
    but not yet trained on (running or finished groups) are drawn again, with the same
    group indices and seeds, by a restored orchestrator; with the runner's own state
    where it keeps any (a :class:`~tunix_agentic.rollout.group_runner.CheckpointingRunner`;
    rollout nodes: the finished groups, handed back instead of run again).
    """

    def __init__(
        self,
        runner: GroupRunner,
        config: RolloutConfig,
        *,
        tasks: Iterator[TaskLike] | None = None,
        metrics: MetricsSink | None = None,
    ):
        self.config = config
        self.stream = TaskStream(tasks)
        self.metrics = metrics = NullMetrics() if metrics is None else metrics
        self.pacer = StalenessPacer(config.groups_per_batch, config.max_staleness)
        self._admission_pauses = 0  # evaluations that hold new groups back (admission_paused)
        self._changed = asyncio.Event()
        self._group_counter = itertools.count()
        self._eval_counter = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None
        self.stats = {
            "groups_emitted": 0,
            "groups_filtered": 0,
            "groups_too_small": 0,
            "infra_failures": 0,
            "infra_retries": 0,
            "stale_dropped": 0,
        }
        self.batches = BatchQueue(
            config,
            self.pacer,
            stats=self.stats,
            metrics=metrics,
            done_with=self.stream.done_with,
            freed=self._changed.set,
        )
        self._fail = self.batches.fail  # stops the run: the learner's get_batch raises
        self._prefetch: Prefetch | None = None  # INIT ahead of admission (prefetch_groups)
        if config.prefetch_groups:
            if not isinstance(runner, PrefetchingRunner):
                raise ValueError(
                    f"rollout.prefetch_groups must be 0 with a {type(runner).__name__}: its "
                    "environments are made elsewhere (the nodes run INIT)"
                )
            self._prefetch = Prefetch(
                runner, self.stream, config.prefetch_groups, config.group_size
            )
        runner.bind(RunnerHooks(metrics, self.stats, self._fail, self._spawn))
        self._runner: GroupRunner = runner

    @classmethod
    def in_process(
        cls,
        engine: InferenceEngine,
        env_factory: Callable[..., Environment],
        template: ChatFormat,
        agent_config: AgentConfig,
        config: RolloutConfig,
        *,
        tasks: Iterator[TaskLike] | None = None,
        metrics: MetricsSink | None = None,
        backend_health: HealthProbe | None = None,
    ) -> RolloutOrchestrator:
        """An orchestrator whose groups run here: an
        :class:`~tunix_agentic.rollout.episode.EpisodeRunner` on ``engine``, ``env_factory``,
        ``template`` and ``agent_config``.

        ``env_factory`` builds each episode's environment: called with no argument, or with
        the task when it takes one (a multi-environment run picks the environment by the
        task's source). An environment's ``timings`` dict, if it has one after ``reset``
        (e.g. ``{"sandbox_start": seconds}``), is recorded as ``env/<key>`` times.
        ``backend_health(task)`` tells whether a task's environment backend is up when its
        episodes fail on infrastructure (see the runner).
        """
        runner = EpisodeRunner(
            engine, env_factory, template, agent_config, config, backend_health=backend_health
        )
        return cls(runner, config, tasks=tasks, metrics=metrics)

    @property
    def runner(self) -> GroupRunner:
        """What runs the groups (given at construction)."""
        return self._runner

    @property
    def tasks(self) -> Iterator[TaskLike] | None:
        """The task iterator production draws from (settable before ``start()``)."""
        return self.stream.tasks

    @tasks.setter
    def tasks(self, tasks: Iterator[TaskLike]) -> None:
        self.stream.tasks = tasks

    @property
    def env_factory(self) -> Callable[..., Environment] | None:
        """Builds each episode's environment; None when the runner makes none here (rollout
        nodes make their own). Settable (``ValueError`` on such a runner)."""
        runner = self._runner
        return runner.env_factory if isinstance(runner, PrefetchingRunner) else None

    @env_factory.setter
    def env_factory(self, factory: Callable[..., Environment]) -> None:
        runner = self._runner
        if not isinstance(runner, PrefetchingRunner):
            raise ValueError(
                f"a {type(runner).__name__} makes no environments here: "
                "with rollout.service.urls the nodes make the environments"
            )
        runner.env_factory = factory

    @property
    def agent_config(self) -> AgentConfig:
        """The agent settings production episodes run with (the runner's; settable)."""
        return self._runner.agent_config

    @agent_config.setter
    def agent_config(self, agent_config: AgentConfig) -> None:
        self._runner.agent_config = agent_config

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
        if self._prefetch is not None:
            await self._prefetch.discard()

    @property
    def version(self) -> int:
        """The newest policy version the learner published."""
        return self.pacer.version

    def set_version(self, version: int) -> None:
        """The learner published ``version``: v batches were consumed (also on resume); the
        runner is told too (rollout nodes learn the version on the engine)."""
        self.pacer.set_version(version)
        self._runner.set_version(version)
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
        return len(self._tasks) + (0 if self._prefetch is None else len(self._prefetch))

    def prefetched(self) -> list[list[InitResult]]:
        """The INIT results of prefetched groups ready to run, in task order, one list per
        group (still-initialising ones left out)."""
        return [] if self._prefetch is None else self._prefetch.ready()

    def checkpoint_state(self) -> dict[str, Any]:
        """The task stream's position, JSON-serialisable, for :meth:`restore_state`; under
        ``"service"`` the runner's own state, if it keeps any (a
        :class:`~tunix_agentic.rollout.group_runner.CheckpointingRunner`; the key dates from
        when the rollout nodes' runner was the only one that did)."""
        state = self.stream.checkpoint_state()
        if isinstance(self._runner, CheckpointingRunner):
            kept = self._runner.checkpoint_state(index for index, _ in state["pending"])
            if kept is not None:
                state["service"] = kept
        return state

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue the task stream (and the runner) saved by :meth:`checkpoint_state`
        (before ``start()``); a runner that keeps no state of its own ignores the
        runner's state in ``state``."""
        self.stream.restore_state(state)
        if state.get("service") is not None and isinstance(self._runner, CheckpointingRunner):
            self._runner.restore_state(state["service"])

    async def _produce(self) -> None:
        try:
            while True:
                if self._prefetch is not None:
                    self._prefetch.fill()
                while self._admission_pauses or not self.pacer.may_admit():
                    self._changed.clear()
                    await self._changed.wait()
                if self._prefetch is not None:
                    prepared = await self._prefetch.take()  # in task order
                    index, task, members = prepared.index, prepared.task, prepared.members
                else:
                    (index, task), members = self.stream.next(), None
                # The version is read once: the pacer's count and the group's stamp must agree
                # even when a new version is published before the group's task first runs.
                admitted = self.version
                self.pacer.admitted(admitted)
                self._spawn(self._produce_group(index, task, members, admitted))
        except Exception as exc:  # surface it to the learner instead of hanging get_batch
            self._fail(exc)
            raise

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _produce_group(
        self, index: int, task: TaskLike, members: list[InitResult] | None, admitted: int
    ) -> None:
        kept = None
        try:
            group = await self.run_group(task, prepared=members, index=index, version=admitted)
            if self.judge(group) == "keep":
                kept = group
                self.stats["groups_emitted"] += 1
            else:
                self.stream.done_with(group.index)
        except Exception as exc:  # a bug of ours: surface it instead of losing the group
            self._fail(exc)
            raise
        finally:
            self.pacer.finished(admitted, kept)
            self._changed.set()
            self.batches.changed()
            self.metrics.gauge("queue/ready_groups", self.pacer.ready)
            self.metrics.gauge("queue/in_flight_groups", self.pacer.running)

    def judge(self, group: Group) -> Verdict:
        """The group filter's verdict on ``group`` (see :meth:`BatchQueue.judge
        <tunix_agentic.rollout.batch_queue.BatchQueue.judge>`)."""
        return self.batches.judge(group)

    def offer(self, group: Group) -> None:
        """Hand a finished group straight to batch assembly (groups from :meth:`run_group`
        outside production: tests, replays); it is not filtered."""
        self.batches.offer(group)

    async def get_batch(self) -> list[Group]:
        """The next ``groups_per_batch`` groups, oldest admission first; waits for them while
        rollout goes on (see :meth:`BatchQueue.get_batch
        <tunix_agentic.rollout.batch_queue.BatchQueue.get_batch>`)."""
        return await self.batches.get_batch()

    # ------------------------------------------------------------- episodes
    async def run_tasks(
        self,
        tasks: list[TaskLike],
        *,
        group_size: int = 1,
        agent_config: AgentConfig | None = None,
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
        if isinstance(self.batches.fatal, InfraFailureError):
            raise self.batches.fatal
        return groups

    async def run_group(
        self,
        task: TaskLike,
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
        return await self._runner.run_group(
            task,
            index=index,
            version=self.version if version is None else version,
            group_size=group_size,
            agent_config=agent_config,
            prepared=prepared,
            stream=stream,
        )
