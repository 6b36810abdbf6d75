"""The asynchronous RL loop: take a batch, train on it, publish the weights, again.

The one loop both the trainer and ``profiling/bench_rollout.py`` run. Rollout
never stops for training: the orchestrator keeps producing groups on the
event loop while the learner's step runs on a worker thread; the new weights
go to the engine right after each step (no drain: requests under way finish
on the weights they started with), and the orchestrator's admission pacing
keeps every batch within ``max_staleness`` versions of the policy it trains.

Evaluation beside training (:class:`PeriodicEval`, ``rl.eval_every``): the engine
serves one version at a time, so an evaluation started once version v is on the
engine holds back the weights published after it until it ends (then the newest
goes out); the learner goes on training meanwhile on groups the pacer admitted under
version v, and waits only when the staleness bound stops admission (an evaluation
that outlasts about ``max_staleness + 1`` train steps) or when a high-priority
evaluation's pause in admission leaves it without a batch. Every token of that
evaluation is sampled by version v, and it is logged at step v.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from tunix_agentic.inference.base import EngineError, InferenceEngine, WeightUpdate
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator

_log = logging.getLogger(__name__)


class StepLearner(Protocol):
    """What the loop needs of a learner."""

    def train_on(self, groups: list[Group]) -> dict[str, float]:
        """One train step on a batch of groups (runs on the learner's thread)."""
        ...

    def params_for_engine(self) -> Any:
        """The parameters to publish after a step (a tree the engine takes ownership of)."""
        ...


@dataclasses.dataclass
class StepReport:
    """One finished step. ``step`` is the version published after it (1 for the first)."""

    step: int
    groups: list[Group]
    out: dict[str, float]  # the learner's figures
    wait_s: float  # waiting for the batch
    train_s: float
    sync_s: float  # publishing the weights, until the engine generates with them
    wall_s: float  # since the step before ended (the loop's start for the first)
    other_s: float = 0.0  # the loop's own work since the step before ended (its on_step)
    wait_start: float = 0.0  # time.perf_counter() when the wait for the batch began


@dataclasses.dataclass(frozen=True)
class PeriodicEval:
    """Evaluate the policy every ``every`` RL steps while training goes on.

    ``run(v)`` evaluates what the engine holds, version ``v`` (its weights stay there
    until it returns), and ``done(v, result)`` sees the result (the trainer logs it at
    step ``v``). A due version (a multiple of ``every``, past 0, before the last step:
    the trainer evaluates that one itself) is evaluated once it reaches the engine; one
    superseded before it got there (an evaluation was still running) is passed to
    ``skipped(v)`` instead, so every due version is either evaluated or skipped.
    """

    every: int
    run: Callable[[int], Awaitable[Any]]
    done: Callable[[int, Any], None]
    skipped: Callable[[int], None] = lambda version: None


class _Publisher:
    """Puts each step's weights on the engine, holding them back while an evaluation
    measures the engine's version (only the newest held weights are pushed when it ends)."""

    def __init__(
        self,
        orch: RolloutOrchestrator,
        engine: InferenceEngine,
        metrics: MetricsSink,
        periodic: PeriodicEval | None,
        last_step: int,
    ):
        self.orch, self.engine, self.metrics = orch, engine, metrics
        self.periodic, self.last_step = periodic, last_step
        self.error: Exception | None = None  # an evaluation's, raised by the loop
        self._held: tuple[Any, int] | None = None
        self._eval: asyncio.Task | None = None

    async def publish(self, params: Any, version: int) -> None:
        if self._eval is not None:  # the engine is measured: these wait for its end
            if self._held is not None:
                self._skip(self._held[1])
            self._held = (params, version)
            self.metrics.count("eval/held_weight_updates")
            return
        await self._push(params, version)
        self.maybe_evaluate(version)

    async def _push(self, params: Any, version: int) -> None:
        update = WeightUpdate.of(self.engine.update_weights(params, version), version)
        try:
            await update  # resolved at the engine's next chunk boundary
        except EngineError as exc:
            # No backend took them (a pool in an outage): rollout goes on with what
            # it has, a recovering backend gets the newest weights before it serves,
            # and a dead engine ends the run through its failed episodes.
            _log.warning("weights of step %d were applied nowhere: %s", version, exc)
            self.metrics.count("weight_sync/failures")
        self.orch.set_version(version)

    def _due(self, version: int) -> bool:
        p = self.periodic
        return p is not None and 0 < version < self.last_step and version % p.every == 0

    def _skip(self, version: int) -> None:
        if self._due(version):
            _log.warning(
                "no evaluation at step %d: the one before was still running "
                "(raise rl.eval_every or lower rl.eval_tasks)",
                version,
            )
            self.periodic.skipped(version)

    def maybe_evaluate(self, version: int) -> None:
        """Start the evaluation of ``version`` (on the engine now) if it is due."""
        if self._eval is None and self._due(version):
            self._eval = asyncio.get_running_loop().create_task(
                self._evaluate(version), name=f"eval-{version}"
            )

    async def _evaluate(self, version: int) -> None:
        try:
            result = await self.periodic.run(version)
            self.periodic.done(version, result)
        except asyncio.CancelledError:
            self._eval = None
            raise
        except Exception as exc:  # surfaced by the loop at its next step
            self.error = self.error or exc
        pushed = None
        try:
            while self._held is not None:  # weights held meanwhile: the newest goes out
                if pushed is not None:
                    self._skip(pushed)  # newer ones came while it went out
                (params, held), self._held = self._held, None
                await self._push(params, held)
                pushed = held
        finally:
            self._eval = None
        if pushed is not None:
            self.maybe_evaluate(pushed)

    async def finish(self) -> None:
        """Wait for the evaluations under way (and any they lead to)."""
        while self._eval is not None:
            await asyncio.shield(self._eval)

    async def cancel(self) -> None:
        """Cancel the evaluation under way (its episodes and engine requests end)."""
        while self._eval is not None:
            task = self._eval
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def run_rl_steps(
    orch: RolloutOrchestrator,
    engine: InferenceEngine,
    learner: StepLearner,
    *,
    start_step: int,
    steps: int,
    on_step: Callable[[StepReport], None],
    race: Callable[[Awaitable[Any]], Awaitable[Any]] | None = None,
    metrics: MetricsSink = NULL_METRICS,
    periodic: PeriodicEval | None = None,
) -> None:
    """Run steps ``start_step + 1 .. steps``; ``on_step`` sees each as it finishes.

    Production starts here and stops (every episode cancelled, environments
    closed) however the loop ends. ``race`` wraps the wait for a batch (the
    trainer's stop signals); a train step under way always finishes. Anything
    ``on_step`` raises ends the loop. ``metrics`` gets the ``wait_for_batch``,
    ``train`` and ``weight_sync`` spans.

    ``periodic`` evaluates beside training (see :class:`PeriodicEval`; the version
    ``start_step`` too when it is due, as on a resume from that checkpoint); the
    evaluations under way when the last step ends are awaited (through ``race``), and
    one under way when the loop ends otherwise is cancelled and logs nothing.
    """
    if start_step >= steps:
        return
    loop = asyncio.get_running_loop()
    learner_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")
    publisher = _Publisher(orch, engine, metrics, periodic, steps)
    orch.start()
    publisher.maybe_evaluate(start_step)
    try:
        ended = time.perf_counter()  # when the step before ended
        for step in range(start_step, steps):
            t0 = time.perf_counter()
            with metrics.span("wait_for_batch"):
                wait = orch.get_batch()
                groups = await (race(wait) if race is not None else wait)
            t1 = time.perf_counter()
            with metrics.span("train"):
                out = await loop.run_in_executor(learner_thread, learner.train_on, groups)
            t2 = time.perf_counter()
            with metrics.span("weight_sync"):
                await publisher.publish(learner.params_for_engine(), step + 1)
            t3 = time.perf_counter()
            if publisher.error is not None:
                raise publisher.error
            report = StepReport(
                step + 1, groups, out, t1 - t0, t2 - t1, t3 - t2, t3 - ended, t0 - ended, t0
            )
            ended = t3
            on_step(report)
        finish = publisher.finish()
        await (race(finish) if race is not None else finish)
        if publisher.error is not None:
            raise publisher.error
    finally:
        await publisher.cancel()
        await orch.stop()
        learner_thread.shutdown(wait=True)
