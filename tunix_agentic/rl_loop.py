"""The asynchronous RL loop: take a batch, train on it, publish the weights, again.

The one loop both the trainer and ``profiling/bench_rollout.py`` run. Rollout
never stops for training: the orchestrator keeps producing groups on the
event loop while the learner's step runs on a worker thread; the new weights
go to the engine right after each step (no drain: requests under way finish
on the weights they started with), and the orchestrator's admission pacing
keeps every batch within ``max_staleness`` versions of the policy it trains.
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
    wall_s: float


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
) -> None:
    """Run steps ``start_step + 1 .. steps``; ``on_step`` sees each as it finishes.

    Production starts here and stops (every episode cancelled, environments
    closed) however the loop ends. ``race`` wraps the wait for a batch (the
    trainer's stop signals); a train step under way always finishes. Anything
    ``on_step`` raises ends the loop. ``metrics`` gets the ``wait_for_batch``,
    ``train`` and ``weight_sync`` spans.
    """
    if start_step >= steps:
        return
    loop = asyncio.get_running_loop()
    learner_thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="learner")
    orch.start()
    try:
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
                update = WeightUpdate.of(
                    engine.update_weights(learner.params_for_engine(), step + 1), step + 1
                )
                try:
                    await update  # resolved at the engine's next chunk boundary
                except EngineError as exc:
                    # No backend took them (a pool in an outage): rollout goes on with what
                    # it has, a recovering backend gets the newest weights before it serves,
                    # and a dead engine ends the run through its failed episodes.
                    _log.warning("weights of step %d were applied nowhere: %s", step + 1, exc)
                    metrics.count("weight_sync/failures")
                orch.set_version(step + 1)
            t3 = time.perf_counter()
            on_step(StepReport(step + 1, groups, out, t1 - t0, t2 - t1, t3 - t2, t3 - t0))
    finally:
        await orch.stop()
        learner_thread.shutdown(wait=True)
