"""The RolloutOrchestrator: many episodes at once, grouped as they complete.

Each episode moves through three stages, each with its own worker pool so a
slow stage never holds another's slot: INIT (make the environment, reset it
on the task), RUN (the agent loop against the engine) and EVAL (the verifier's
reward). G episodes of one task form a group; a group is emitted the moment
its last episode ends, in completion order, onto a queue the learner reads.

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
import dataclasses
import inspect
import itertools
import math
import random
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.envs.base import Environment
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.rollout.grouping import GroupFilter, StalenessPacer
from tunix_agentic.rollout.outages import HealthProbe, OutageGate, backoff_delay
from tunix_agentic.trajectory import EpisodeStage, Trajectory, timeout_status


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 8
    groups_per_batch: int = 8
    init_workers: int = 32
    run_workers: int = 64
    eval_workers: int = 32
    episode_timeout_s: float = 300.0
    max_staleness: int = 1
    filter_uniform_groups: bool = True  # DAPO dynamic sampling: drop groups with one reward value
    min_reward_std: float = 0.0  # RAGEN-style: also drop groups whose reward std is at most this
    min_groups_per_batch: int = (
        0  # AgentRL variable batch: return early with >= this many (0: fixed size)
    )
    max_filtered_in_a_row: int = 500  # then stop with an error instead of waiting forever
    # Episodes in a row (in completion order) that ended on an infrastructure fault, retries
    # included, before the run stops with an error quoting the last one (a dead engine, an
    # environment whose reset always raises) instead of waiting forever.
    max_infra_failures_in_a_row: int = 64
    infra_retries: int = 1  # re-run an episode that hit an infrastructure fault, with a fresh env
    # A retry waits a delay drawn uniformly from [0, min(infra_backoff_max_s, infra_backoff_s *
    # 2**(retry - 1))] (jittered exponential back-off: a burst of failures does not return as one).
    infra_backoff_s: float = 1.0
    infra_backoff_max_s: float = 30.0
    # An environment backend that says it is down (see RolloutOrchestrator: backend_health) is
    # waited for up to this long; failures of episodes begun before it came back do not count
    # towards max_infra_failures_in_a_row. Past it, they count again.
    backend_wait_s: float = 120.0
    # Interaction-budget curriculum (ScalingInter-RL): ((from_version, max_turns), ...), e.g.
    # ((0, 8), (100, 12), (200, 15)). Empty: agent.max_turns throughout.
    max_turns_schedule: tuple[tuple[int, int], ...] = ()
    # Groups whose environments are created and reset ahead of admission (a warm pool of
    # sandboxes; continuous production only). 0: INIT starts when the group is admitted.
    prefetch_groups: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.group_size < 1:
            raise ValueError(f"rollout.group_size must be >= 1, got {self.group_size}")
        if self.groups_per_batch < 1:
            raise ValueError(f"rollout.groups_per_batch must be >= 1, got {self.groups_per_batch}")
        for name in ("init_workers", "run_workers", "eval_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_staleness < 0:
            raise ValueError(f"rollout.max_staleness must be >= 0, got {self.max_staleness}")
        if self.episode_timeout_s <= 0:
            raise ValueError(f"rollout.episode_timeout_s must be > 0, got {self.episode_timeout_s}")
        if self.min_reward_std < 0:
            raise ValueError(f"rollout.min_reward_std must be >= 0, got {self.min_reward_std}")
        if not 0 <= self.min_groups_per_batch <= self.groups_per_batch:
            raise ValueError(
                f"rollout.min_groups_per_batch must be in [0, groups_per_batch={self.groups_per_batch}], "
                f"got {self.min_groups_per_batch}"
            )
        if self.infra_retries < 0:
            raise ValueError(f"rollout.infra_retries must be >= 0, got {self.infra_retries}")
        for name in ("infra_backoff_s", "infra_backoff_max_s", "backend_wait_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"rollout.{name} must be a finite number >= 0, got {value!r}")
        if self.infra_backoff_max_s < self.infra_backoff_s:
            raise ValueError(
                f"rollout.infra_backoff_max_s ({self.infra_backoff_max_s}) must be >= "
                f"rollout.infra_backoff_s ({self.infra_backoff_s})"
            )
        if self.prefetch_groups < 0:
            raise ValueError(f"rollout.prefetch_groups must be >= 0, got {self.prefetch_groups}")
        if self.max_filtered_in_a_row < 1 or self.max_infra_failures_in_a_row < 1:
            raise ValueError(
                "rollout.max_filtered_in_a_row and rollout.max_infra_failures_in_a_row must be >= 1"
            )
        steps = [entry[0] for entry in self.max_turns_schedule]
        if any(len(entry) != 2 for entry in self.max_turns_schedule):
            raise ValueError(
                "rollout.max_turns_schedule entries must be [from_version, max_turns] pairs"
            )
        if steps != sorted(steps) or len(set(steps)) != len(steps) or any(v < 0 for v in steps):
            raise ValueError(
                f"rollout.max_turns_schedule versions must be distinct, ascending and >= 0, got {steps}"
            )
        if any(turns < 1 for _, turns in self.max_turns_schedule):
            raise ValueError("rollout.max_turns_schedule turn budgets must be >= 1")

    def max_turns_at(self, version: int, default: int) -> int:
        """The interaction budget for an episode started under policy ``version``."""
        turns = default
        for start, budget in self.max_turns_schedule:
            if version >= start:
                turns = budget
        return turns


@dataclasses.dataclass
class Group:
    """G trajectories of one task. ``trajectories`` holds only scoreable ones;
    every attempt that ended in an infrastructure fault is kept apart in
    ``dropped`` (retried ones included), and ``lost`` counts members that never
    produced a scoreable trajectory."""

    group_id: str
    index: int
    task: Any
    admitted_version: int
    trajectories: list[Trajectory]
    dropped: list[Trajectory] = dataclasses.field(default_factory=list)
    lost: int = 0

    @property
    def rewards(self) -> np.ndarray:
        return np.asarray([t.reward for t in self.trajectories], np.float32)

    @property
    def min_version(self) -> int:
        versions = [t.min_version for t in self.trajectories if t.min_version is not None]
        return min(versions) if versions else self.admitted_version


class InfraFailureError(RuntimeError):
    """Episodes keep failing on infrastructure: the run cannot make progress."""


def episode_seed(run_seed: int, stream: int, index: int, member: int, attempt: int) -> int:
    """A 63-bit sampling seed for one episode attempt (SplitMix64 finaliser over the parts).

    ``stream`` keeps evaluation's seeds apart from production's, so evaluating
    (or skipping the evaluation on resume) never shifts the training episodes' seeds.
    """
    x = 0
    for part in (run_seed, stream, index, member, attempt):
        x = (x ^ (part & 0xFFFFFFFFFFFFFFFF)) * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return (x ^ (x >> 31)) >> 1


PRODUCTION_STREAM, EVAL_STREAM = 0, 1


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
        metrics=None,
        backend_health: HealthProbe | None = None,
    ):
        self.engine = engine
        self.env_factory = env_factory
        self.template = template
        self.agent_config = agent_config
        self.config = config
        self.tasks = tasks
        self.metrics = metrics
        self.pacer = StalenessPacer(config.groups_per_batch, config.max_staleness)
        self.group_filter = GroupFilter(
            config.group_size, config.filter_uniform_groups, config.min_reward_std
        )
        self._ready_changed = asyncio.Event()
        self._infra_streak = 0
        self._outages = OutageGate(
            backend_health,
            wait_s=config.backend_wait_s,
            spawn=self._spawn,
            metrics=metrics,
        )
        self._jitter = random.Random(config.seed)  # back-off delays only: no episode's seed
        self._fatal: Exception | None = None
        self._changed = asyncio.Event()
        self._init_sem = asyncio.Semaphore(config.init_workers)
        self._run_sem = asyncio.Semaphore(config.run_workers)
        self._eval_sem = asyncio.Semaphore(config.eval_workers)
        self._group_counter = itertools.count()
        self._eval_counter = itertools.count()
        self._next_index = 0  # group index of the next task drawn from ``tasks``
        # Drawn, not yet trained on or filtered: group index -> the task stream's state just
        # before that draw (restored and drawn again after a restart).
        self._untrained: dict[int, Any] = {}
        self._replay: collections.deque[tuple[int, Any, Any]] = collections.deque()
        self._tasks: set[asyncio.Task] = set()
        self._producer: asyncio.Task | None = None
        # Prefetched groups in task order: each resolves to (task, [(env, prompt, error), ...]).
        self._prepared: collections.deque[asyncio.Task] = collections.deque()
        self.stats = {
            "groups_emitted": 0,
            "groups_filtered": 0,
            "groups_too_small": 0,
            "infra_failures": 0,
            "infra_retries": 0,
            "stale_dropped": 0,
        }

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
                await self._close_members(result[2])

    async def _close_members(self, members: list) -> None:
        """Close the environment of every INIT result in ``members`` (exceptions skipped)."""
        await asyncio.gather(
            *(self._close_env(m[0]) for m in members if isinstance(m, tuple) and m[0] is not None)
        )

    async def _close_env(self, env: Environment) -> None:
        try:
            await asyncio.shield(env.close())
        except Exception:  # closing must never mask the episode's own outcome
            self._count("rollout/env_close_errors")

    @property
    def version(self) -> int:
        """The newest policy version the learner published."""
        return self.pacer.version

    def set_version(self, version: int) -> None:
        """The learner published ``version``: v batches were consumed (also on resume)."""
        self.pacer.set_version(version)
        self._changed.set()

    @property
    def running_groups(self) -> int:
        """Groups admitted and not yet finished."""
        return self.pacer.running

    @property
    def pending_work(self) -> int:
        """Tasks this orchestrator still owns: episodes and groups under way, prefetches."""
        return len(self._tasks) + len(self._prepared)

    def prefetched(self) -> list[list[tuple[Any, Any, str | None]]]:
        """The INIT results of prefetched groups ready to run, in task order:
        ``[(env, prompt_ids, error), ...]`` per group (still-initialising ones left out)."""
        return [t.result()[2] for t in self._prepared if t.done() and not t.cancelled()]

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
                while not self.pacer.may_admit():
                    self._changed.clear()
                    await self._changed.wait()
                if self.config.prefetch_groups:
                    index, task, members = await self._prepared[0]  # in task order
                    self._prepared.popleft()
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

    async def _prepare_group(
        self, index: int, task: Any
    ) -> tuple[int, Any, list[tuple[Any, Any, str | None]]]:
        """INIT for every member of a group ahead of admission.

        Returns ``(index, task, [(env, prompt_ids, error), ...])``; a member whose
        INIT failed carries the error instead (its episode records it, then is
        retried with a fresh environment like any infrastructure fault). If
        cancelled, closes what it created.
        """
        members = [
            asyncio.get_running_loop().create_task(self._init_env(task))
            for _ in range(self.config.group_size)
        ]
        try:
            return index, task, list(await asyncio.gather(*members))
        except asyncio.CancelledError:
            for m in members:
                m.cancel()
            await self._close_members(await asyncio.gather(*members, return_exceptions=True))
            raise

    async def _init_env(self, task: Any) -> tuple[Any, Any, str | None]:
        """Create and reset one environment: ``(env, prompt_ids, None)`` or ``(env|None, None, error)``."""
        async with self._init_sem:
            t = time.perf_counter()
            env = None
            try:
                factory = self.env_factory
                env = factory(task) if _takes_one_argument(factory) else factory()
                self._outages.note_env(task, env)  # how to ask its backend after a failure
                prompt = await env.reset(task)
                for key, seconds in getattr(env, "timings", {}).items():
                    self._time(f"env/{key}", seconds)  # e.g. sandbox start-up
                ids = self.template.prompt_ids(prompt, tools=env.tool_schemas())
            except asyncio.CancelledError:
                if env is not None:
                    await self._close_env(env)
                raise
            except Exception as exc:
                return env, None, f"INIT: {type(exc).__name__}: {exc}"
            self._time("stage/init", time.perf_counter() - t)
            return env, ids, None

    def _spawn(self, coro) -> asyncio.Task:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

    async def _produce_group(
        self, index: int, task: Any, members: list | None, admitted: int
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
            if self.metrics is not None:
                self.metrics.gauge("queue/ready_groups", self.pacer.ready)
                self.metrics.gauge("queue/in_flight_groups", self.pacer.running)

    def judge(self, group: Group) -> str:
        """The group filter's verdict on ``group`` ("keep", "too_small" or "filtered"),
        counted; too many "filtered" in a row stop the run with an error."""
        verdict = self.group_filter.verdict(group)
        if verdict == "too_small":
            self.stats["groups_too_small"] += 1
            self._count("rollout/groups_too_small")
        elif verdict == "filtered":
            self.stats["groups_filtered"] += 1
            self._count("rollout/groups_filtered")
            streak = self.group_filter.filtered_in_a_row
            if streak >= self.config.max_filtered_in_a_row:
                self._fail(
                    RuntimeError(
                        f"{streak} groups in a row had identical or low-variance rewards "
                        f"(last: {group.rewards.tolist()}) and were filtered out: the policy "
                        "never or always succeeds. Check the reward, the warm start, or set "
                        "rollout.filter_uniform_groups=false"
                    )
                )
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
                self._count("rollout/stale_dropped")
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
        prepared: list | None = None,
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
        g = len(prepared) if prepared is not None else (group_size or self.config.group_size)
        prefix = "g" if stream == PRODUCTION_STREAM else f"s{stream}g"
        group_id = f"{prefix}{index}-{getattr(task, 'task_id', index)}"
        version = self.version if version is None else version
        if agent_config is None:
            turns = self.config.max_turns_at(version, self.agent_config.max_turns)
            agent_config = dataclasses.replace(self.agent_config, max_turns=turns)
            if self.metrics is not None:
                self.metrics.gauge("rollout/max_turns", turns)
        results = await asyncio.gather(
            *(
                self._member(
                    task,
                    group_id,
                    episode_seed(self.config.seed, stream, index, member, 0),
                    member,
                    agent_config,
                    None if prepared is None else prepared[member],
                )
                for member in range(g)
            )
        )
        good = [traj for traj, _ in results if not traj.is_infra_failure]
        bad = [failure for _, failures in results for failure in failures]
        if bad:
            self.stats["infra_failures"] += len(bad)
            self._count("rollout/infra_failures", len(bad))
        return Group(group_id, index, task, version, good, bad, lost=g - len(good))

    async def _member(
        self,
        task: Any,
        group_id: str,
        seed: int,
        member: int,
        agent_config: AgentConfig,
        prepared: tuple | None = None,
    ) -> tuple[Trajectory, list[Trajectory]]:
        """One group member, retried on infrastructure faults; returns (final, failed attempts).

        A prefetched environment serves the first attempt only; retries start fresh
        (each attempt on its own seed).
        """
        failures: list[Trajectory] = []
        cfg = self.config
        if prepared is not None and prepared[0] is not None:
            self._outages.note_env(task, prepared[0])  # made elsewhere: it answers for its backend
        for attempt in range(cfg.infra_retries + 1):
            began = time.monotonic()
            traj = await self._episode(
                task, group_id, (seed + attempt) % 2**63, member, agent_config, attempt, prepared
            )
            prepared = None
            if not traj.is_infra_failure:
                self._infra_streak = 0
                self._outages.succeeded(task)
                return traj, failures
            failures.append(traj)
            # A backend that is down is waited for here; what its outage caused does not count.
            if not await self._outages.excuses(task, began):
                self._infra_streak += 1
                if self._infra_streak >= cfg.max_infra_failures_in_a_row:
                    self._fail(
                        InfraFailureError(
                            f"{self._infra_streak} episodes in a row failed on infrastructure; "
                            f"the last ({traj.episode_id}): {traj.status}: {traj.error}"
                        )
                    )
            if attempt < cfg.infra_retries:
                self.stats["infra_retries"] += 1
                self._count("rollout/infra_retries")
                await asyncio.sleep(
                    backoff_delay(
                        attempt + 1, cfg.infra_backoff_s, cfg.infra_backoff_max_s, self._jitter
                    )
                )
        return failures[-1], failures

    async def _episode(
        self,
        task: Any,
        group_id: str,
        seed: int,
        member: int,
        agent_config: AgentConfig,
        attempt: int = 0,
        prepared: tuple | None = None,
    ) -> Trajectory:
        """One attempt. Whatever it raises (a user's env or reward function, an observation
        the tokenizer cannot encode) ends this episode with a recorded status and error.

        Past ``episode_timeout_s`` the episode ends with the status of
        :func:`~tunix_agentic.trajectory.timeout_status`: ``"agent_timeout"`` (reward 0,
        kept and scored like any failure of the policy) when the deadline passed in the
        agent loop and the agent's actions took at least half of it, else ``"timeout"``
        (infrastructure: the engine, the environment's reset or the verifier hung)."""
        traj = Trajectory(
            task_id=str(getattr(task, "task_id", group_id)),
            episode_id=f"{group_id}-{member}" + (f"-retry{attempt}" if attempt else ""),
            task_name=str(getattr(task, "task_name", "default")),
            group_id=group_id,
        )
        t0 = time.perf_counter()
        # A prefetched environment is this episode's to close from here on, whatever happens.
        env: Environment | None = None if prepared is None else prepared[0]
        stage: EpisodeStage = "init"  # where the deadline found it, for timeout_status
        try:
            async with asyncio.timeout(self.config.episode_timeout_s):
                if prepared is None:
                    env, prompt_ids, error = await self._init_env(task)
                else:
                    _, prompt_ids, error = prepared
                if error is not None:
                    traj.status, traj.error = "env_error", error
                    return traj
                traj.append_prompt(prompt_ids)
                stage = "run"
                async with self._run_sem:
                    t = time.perf_counter()
                    await run_agent(
                        self.engine,
                        env,
                        traj,
                        self.template,
                        agent_config,
                        seed=seed,
                        metrics=self.metrics,
                    )
                    self._time("stage/run", time.perf_counter() - t)
                if traj.is_infra_failure:
                    return traj
                stage = "eval"
                async with self._eval_sem:
                    t = time.perf_counter()
                    try:
                        score = getattr(env, "evaluate_trajectory", None)  # duck-typed envs
                        reward = await (score(traj) if score is not None else env.evaluate())
                        traj.reward = float(reward)
                    except Exception as exc:
                        traj.status, traj.error = "env_error", f"EVAL: {type(exc).__name__}: {exc}"
                    self._time("stage/eval", time.perf_counter() - t)
        except TimeoutError:
            limit, actions_s = self.config.episode_timeout_s, traj.timings.get("actions_s", 0.0)
            traj.status = timeout_status(stage, actions_s, limit)
            traj.error = f"episode exceeded {limit}s in {stage}, {actions_s:.1f}s of it on actions"
            if traj.status == "agent_timeout":
                traj.reward = 0.0
        except Exception as exc:  # anything else is this episode's fault, not the run's
            traj.status, traj.error = "env_error", f"{type(exc).__name__}: {exc}"
            traj.info["traceback"] = traceback.format_exc(limit=-8)
        finally:
            if env is not None:
                await self._close_env(env)
            traj.timings["episode_s"] = time.perf_counter() - t0
            self._count("rollout/episodes")
            self._count(f"rollout/status/{traj.status}")  # every attempt, by how it ended
        return traj

    def _count(self, name: str, n: float = 1.0) -> None:
        if self.metrics is not None:
            self.metrics.count(name, n)

    def _time(self, name: str, seconds: float) -> None:
        if self.metrics is not None:
            self.metrics.add_time(name, seconds)


def _takes_one_argument(factory: Callable[..., Any]) -> bool:
    """Whether ``factory`` takes the task (one positional argument) or nothing."""
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: called bare
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(positional) == 1
