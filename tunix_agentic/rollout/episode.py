"""Running one group's episodes: INIT, RUN and EVAL for each member, retried on faults.

An episode moves through three stages, each bounded by its own worker pool so a
slow stage never holds another's slot: INIT (make the environment, reset it on
the task: an :class:`InitResult`), RUN (the agent loop against the engine) and
EVAL (the verifier's reward). An attempt that ends on an infrastructure fault
is retried with a fresh environment after a jittered back-off; the outage gate
of :mod:`tunix_agentic.rollout.outages` decides whether it counts towards
``rollout.max_infra_failures_in_a_row``.

:class:`EpisodeRunner` does this for the
:class:`~tunix_agentic.rollout.orchestrator.RolloutOrchestrator`, which decides
which groups run and when; a finished group is a :class:`Group`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import random
import time
import traceback
from collections.abc import Callable
from typing import Any

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.envs.base import REWARD_TIMEOUT_S, Environment
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink
from tunix_agentic.metrics.trace import EPISODE
from tunix_agentic.rollout.config import RolloutConfig
from tunix_agentic.rollout.group import (
    EVAL_STREAM,
    PRODUCTION_STREAM,
    Group,
    InfraFailureError,
    InitResult,
    RunnerHooks,
)
from tunix_agentic.rollout.outages import HealthProbe, OutageGate, backoff_delay
from tunix_agentic.rollout.rewards import RewardError, checked_reward
from tunix_agentic.trajectory import EpisodeStage, TaskLike, Trajectory, task_key, timeout_status

# The records a group runner hands back live in :mod:`tunix_agentic.rollout.group`; they
# are this module's API too (a runner's results, where runners are).
__all__ = [
    "EVAL_STREAM",
    "PRODUCTION_STREAM",
    "EpisodeRunner",
    "Group",
    "InfraFailureError",
    "InitResult",
    "StageSlots",
    "episode_seed",
]


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


class EpisodeRunner:
    """Runs the episodes of one group at a time (many groups may run at once): the
    in-process :class:`~tunix_agentic.rollout.group_runner.GroupRunner`.

    ``env_factory`` builds each episode's environment: called with no argument,
    or with the task when it takes one. An environment's ``timings`` dict, if it
    has one after ``reset``, is recorded as ``env/<key>`` times.

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

    The runner shares its owner's bookkeeping (:class:`~tunix_agentic.rollout.group.RunnerHooks`,
    given here or by :meth:`bind`): it adds ``infra_failures`` and ``infra_retries`` to
    ``stats``, stops the run through ``fail`` when episodes keep failing on
    infrastructure, and starts outage watches with ``spawn`` (so stopping the owner
    cancels them).
    """

    def __init__(
        self,
        engine: InferenceEngine,
        env_factory: Callable[..., Environment],
        template: ChatFormat,
        agent_config: AgentConfig,
        config: RolloutConfig,
        *,
        metrics: MetricsSink = NULL_METRICS,
        backend_health: HealthProbe | None = None,
        spawn: Callable[[Any], asyncio.Task] | None = None,
        fail: Callable[[Exception], None] | None = None,
        stats: dict[str, int] | None = None,
    ):
        self.engine = engine
        self.env_factory = env_factory
        self.template = template
        self.agent_config = agent_config
        self.config = config
        self._backend_health = backend_health
        self._infra_streak = 0
        self._jitter = random.Random(config.seed)  # back-off delays only: no episode's seed
        hooks = RunnerHooks(metrics, {} if stats is None else stats)
        hooks = dataclasses.replace(hooks, fail=fail or hooks.fail, spawn=spawn or hooks.spawn)
        self.bind(hooks)

    def bind(self, hooks: RunnerHooks) -> None:
        """Share ``hooks`` (an orchestrator's bookkeeping); before any group runs."""
        metrics, config = hooks.metrics, self.config
        self.metrics, self.stats, self._fail = metrics, hooks.stats, hooks.fail
        for key in ("infra_failures", "infra_retries"):
            self.stats.setdefault(key, 0)
        self._outages = OutageGate(
            self._backend_health, wait_s=config.backend_wait_s, spawn=hooks.spawn, metrics=metrics
        )
        # Each reports gauges queue/<stage>_waiting_episodes and queue/<stage>_running_episodes.
        self._init_sem = StageSlots(config.init_workers, "init", metrics)
        self._run_sem = StageSlots(config.run_workers, "run", metrics)
        self._eval_sem = StageSlots(config.eval_workers, "eval", metrics)

    def set_version(self, version: int) -> None:
        """Nothing to tell: each group carries the version that admitted it."""

    async def close(self) -> None:
        """Nothing held between groups: each episode closes its own environment."""

    def stage_load(self) -> dict[str, dict[str, int]]:
        """Per stage (``init``, ``run``, ``eval``): episodes in it now and waiting for a slot."""
        return {
            name: {"in_flight": slots.in_flight, "queued": slots.waiting}
            for name, slots in (
                ("init", self._init_sem),
                ("run", self._run_sem),
                ("eval", self._eval_sem),
            )
        }

    async def run_group(
        self,
        task: TaskLike,
        *,
        index: int,
        version: int,
        group_size: int | None = None,
        agent_config: AgentConfig | None = None,
        prepared: list[InitResult] | None = None,
        stream: int = PRODUCTION_STREAM,
        run_seed: int | None = None,
        min_usable: int | None = None,
    ) -> Group:
        """Run group ``index`` of seed ``stream`` on ``task``, admitted under ``version``.

        ``prepared`` holds its members' environments already INIT'ed; without an
        ``agent_config`` the interaction budget follows ``rollout.max_turns_schedule``.
        ``run_seed`` (default ``rollout.seed``) seeds the members' sampling. With
        ``min_usable``, once that many members ended without an infrastructure fault the
        others are cancelled (their environments closed); they count in ``lost``.
        Cancelling the call cancels every member the same way.
        """
        g = len(prepared) if prepared is not None else (group_size or self.config.group_size)
        prefix = "g" if stream == PRODUCTION_STREAM else f"s{stream}g"
        group_id = f"{prefix}{index}-{task_key(task).id}"
        if agent_config is None:
            turns = self.config.max_turns_at(version, self.agent_config.max_turns)
            agent_config = dataclasses.replace(self.agent_config, max_turns=turns)
            self.metrics.gauge("rollout/max_turns", turns)
        seed = self.config.seed if run_seed is None else run_seed
        members = [
            asyncio.ensure_future(
                self._member(
                    task,
                    group_id,
                    episode_seed(seed, stream, index, member, 0),
                    member,
                    agent_config,
                    None if prepared is None else prepared[member],
                )
            )
            for member in range(g)
        ]
        if min_usable is None:
            results = await asyncio.gather(*members)
        else:
            results = await _until_usable(members, min_usable)
        good = [traj for traj, _ in results if not traj.is_infra_failure]
        bad = [failure for _, failures in results for failure in failures]
        if bad:
            self.stats["infra_failures"] += len(bad)
            self.metrics.count("rollout/infra_failures", len(bad))
        return Group(group_id, index, task, version, good, bad, lost=g - len(good))

    async def _member(
        self,
        task: TaskLike,
        group_id: str,
        seed: int,
        member: int,
        agent_config: AgentConfig,
        prepared: InitResult | None = None,
    ) -> tuple[Trajectory, list[Trajectory]]:
        """One group member, retried on infrastructure faults; returns (final, failed attempts).

        A prefetched environment serves the first attempt only; retries start fresh
        (each attempt on its own seed).
        """
        failures: list[Trajectory] = []
        cfg = self.config
        if prepared is not None and prepared.env is not None:
            self._outages.note_env(task, prepared.env)  # made elsewhere: it answers for its backend
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
                self.metrics.count("rollout/infra_retries")
                await asyncio.sleep(
                    backoff_delay(
                        attempt + 1, cfg.infra_backoff_s, cfg.infra_backoff_max_s, self._jitter
                    )
                )
        return failures[-1], failures

    async def _episode(
        self,
        task: TaskLike,
        group_id: str,
        seed: int,
        member: int,
        agent_config: AgentConfig,
        attempt: int = 0,
        prepared: InitResult | None = None,
    ) -> Trajectory:
        """One attempt. Whatever it raises (a user's env or reward function, an observation
        the tokenizer cannot encode) ends this episode with a recorded status and error.

        Past ``episode_timeout_s`` the episode ends with the status of
        :func:`~tunix_agentic.trajectory.timeout_status`: ``"agent_timeout"`` (reward 0,
        kept and scored like any failure of the policy) when the deadline passed in the
        agent loop and the agent's actions took at least half of it, else ``"timeout"``
        (infrastructure: the engine, the environment's reset or the verifier hung)."""
        key = task_key(task)
        traj = Trajectory(
            task_id=key.id,
            episode_id=f"{group_id}-{member}" + (f"-retry{attempt}" if attempt else ""),
            task_name=key.name,
            group_id=group_id,
        )
        EPISODE.set(traj.episode_id)  # (each member runs in a task of its own) for the trace
        t0 = time.perf_counter()
        # A prefetched environment is this episode's to close from here on, whatever happens.
        env: Environment | None = None if prepared is None else prepared.env
        stage: EpisodeStage = "init"  # where the deadline found it, for timeout_status
        try:
            async with asyncio.timeout(self.config.episode_timeout_s):
                init = prepared if prepared is not None else await self.init_env(task)
                env = init.env
                if init.error is not None:
                    traj.status, traj.error = "env_error", init.error
                    return traj
                traj.append_prompt(init.prompt_ids)
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
                    self.metrics.add_time("stage/run", time.perf_counter() - t)
                if traj.is_infra_failure:
                    return traj
                stage = "eval"
                async with self._eval_sem:
                    t = time.perf_counter()
                    limit = float(getattr(env, "reward_timeout_s", REWARD_TIMEOUT_S))
                    deadline = asyncio.timeout(limit)  # a slow verifier: an error, not a stall
                    try:
                        async with deadline:
                            score = getattr(env, "evaluate_trajectory", None)  # duck-typed envs
                            reward = await (score(traj) if score is not None else env.evaluate())
                        traj.reward = checked_reward(reward, env, self.config.reward_limit)
                    except RewardError as exc:
                        traj.status, traj.error = "env_error", f"EVAL: {exc}"
                        self.metrics.count("rollout/bad_rewards")
                    except Exception as exc:
                        traj.status, traj.error = "env_error", f"EVAL: {type(exc).__name__}: {exc}"
                        if deadline.expired():
                            self.metrics.count("rollout/reward_timeouts")
                            traj.error = f"EVAL: the reward took over {limit:g}s (reward_timeout_s)"
                    self.metrics.add_time("stage/eval", time.perf_counter() - t)
                self.metrics.add_time("episode", time.perf_counter() - t0)  # admission to reward
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
                await self.close_env(env)
            traj.timings["episode_s"] = time.perf_counter() - t0
            self.metrics.count("rollout/episodes")
            self.metrics.count(f"rollout/status/{traj.status}")  # every attempt, by how it ended
        return traj

    # ------------------------------------------------------------------ INIT
    async def init_group(self, task: TaskLike, size: int) -> list[InitResult]:
        """INIT for ``size`` members of a group of ``task`` (ahead of admission).

        A member whose INIT failed carries the error instead (its episode records it,
        then is retried with a fresh environment like any infrastructure fault). If
        cancelled, closes what it created.
        """
        members = [asyncio.get_running_loop().create_task(self.init_env(task)) for _ in range(size)]
        try:
            return list(await asyncio.gather(*members))
        except asyncio.CancelledError:
            for m in members:
                m.cancel()
            await self.close_members(await asyncio.gather(*members, return_exceptions=True))
            raise

    async def init_env(self, task: TaskLike) -> InitResult:
        """Create and reset one environment: its prompt ids, or the error (the environment
        too, if it was made)."""
        async with self._init_sem:
            t = time.perf_counter()
            env = None
            try:
                factory = self.env_factory
                env = factory(task) if _takes_one_argument(factory) else factory()
                self._outages.note_env(task, env)  # how to ask its backend after a failure
                prompt = await env.reset(task)
                for key, seconds in getattr(env, "timings", {}).items():
                    self.metrics.add_time(f"env/{key}", seconds)  # e.g. sandbox start-up
                ids = self.template.prompt_ids(prompt, tools=env.tool_schemas())
            except asyncio.CancelledError:
                if env is not None:
                    await self.close_env(env)
                raise
            except Exception as exc:
                return InitResult(env, error=f"INIT: {type(exc).__name__}: {exc}")
            self.metrics.add_time("stage/init", time.perf_counter() - t)
            return InitResult(env, ids)

    async def close_members(self, members: list[InitResult | BaseException]) -> None:
        """Close the environment of every INIT result in ``members`` (exceptions skipped)."""
        await asyncio.gather(
            *(
                self.close_env(m.env)
                for m in members
                if isinstance(m, InitResult) and m.env is not None
            )
        )

    async def close_env(self, env: Environment) -> None:
        try:
            await asyncio.shield(env.close())
        except Exception:  # closing must never mask the episode's own outcome
            self.metrics.count("rollout/env_close_errors")


class StageSlots:
    """A stage's worker slots (``async with``): a semaphore that counts the episodes
    holding a slot (``in_flight``) and those waiting for one (``waiting``: only while
    every slot is taken, so an episode that finds a free one never counts), and reports
    both to ``metrics`` as the gauges ``queue/<name>_running`` and ``queue/<name>_waiting``
    (0 from the start, then each time they change)."""

    def __init__(self, n: int, name: str = "stage", metrics: MetricsSink = NULL_METRICS):
        self._sem = asyncio.Semaphore(n)
        self._running_gauge, self._waiting_gauge = (
            f"queue/{name}_running_episodes",
            f"queue/{name}_waiting_episodes",
        )
        self._metrics = metrics
        self.in_flight = 0
        self.waiting = 0
        metrics.gauge(self._running_gauge, 0)
        metrics.gauge(self._waiting_gauge, 0)

    async def __aenter__(self) -> None:
        if self._sem.locked():
            self.waiting += 1
            self._metrics.gauge(self._waiting_gauge, self.waiting)
            try:
                await self._sem.acquire()
            finally:
                self.waiting -= 1
                self._metrics.gauge(self._waiting_gauge, self.waiting)
        else:
            await self._sem.acquire()  # a free slot: taken at once
        self.in_flight += 1
        self._metrics.gauge(self._running_gauge, self.in_flight)

    async def __aexit__(self, *exc: object) -> None:
        self.in_flight -= 1
        self._sem.release()
        self._metrics.gauge(self._running_gauge, self.in_flight)


async def _until_usable(
    members: list[asyncio.Future], min_usable: int
) -> list[tuple[Trajectory, list[Trajectory]]]:
    """Await ``members`` until ``min_usable`` of them ended usable, then cancel the rest;
    the results of those that ended, in member order (cancelling this cancels them all)."""
    pending, usable = set(members), 0
    try:
        while pending and usable < min_usable:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            usable += sum(not m.result()[0].is_infra_failure for m in done)
    finally:
        for m in pending:
            m.cancel()
        await asyncio.gather(*members, return_exceptions=True)
    return [m.result() for m in members if not m.cancelled()]


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
