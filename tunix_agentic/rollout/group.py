"""What a group runner hands back, and what the orchestrator hands it.

A finished group is a :class:`Group`; a member INIT'ed ahead of its run is an
:class:`InitResult`; episodes that keep failing on infrastructure stop the run with
:class:`InfraFailureError`. :class:`RunnerHooks` is the orchestrator's bookkeeping that
every :class:`~tunix_agentic.rollout.group_runner.GroupRunner` shares. Seeds come in
streams: production's and evaluation's never meet.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np

from tunix_agentic.envs.base import Environment
from tunix_agentic.metrics.sink import NULL_METRICS, MetricsSink
from tunix_agentic.trajectory import TaskLike, Trajectory

PRODUCTION_STREAM, EVAL_STREAM = 0, 1


@dataclasses.dataclass
class Group:
    """G trajectories of one task. ``trajectories`` holds only scoreable ones;
    every attempt that ended in an infrastructure fault is kept apart in
    ``dropped`` (retried ones included), and ``lost`` counts members that never
    produced a scoreable trajectory."""

    group_id: str
    index: int
    task: TaskLike
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


@dataclasses.dataclass(frozen=True)
class InitResult:
    """What INIT made of one member: its environment (``None`` if it could not be made)
    and prompt ids, or the error that ended INIT. The environment is whoever holds
    this result's to close."""

    env: Environment | None
    prompt_ids: list[int] | None = None
    error: str | None = None


class InfraFailureError(RuntimeError):
    """Episodes keep failing on infrastructure: the run cannot make progress."""


def _ignore(exc: Exception) -> None:
    """No run to stop: a runner used on its own records nothing here."""


def _spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    return asyncio.get_running_loop().create_task(coro)


@dataclasses.dataclass(frozen=True)
class RunnerHooks:
    """What an orchestrator shares with the runner of its groups.

    ``metrics``: where episode figures go; ``stats``: the orchestrator's counters (the
    runner adds ``infra_failures`` and ``infra_retries``); ``fail(exc)``: stop the run
    (the learner's next ``get_batch`` raises ``exc``); ``spawn(coro)``: start a
    background task the orchestrator cancels when it stops.
    """

    metrics: MetricsSink = NULL_METRICS
    stats: dict[str, int] = dataclasses.field(default_factory=dict)
    fail: Callable[[Exception], None] = _ignore
    spawn: Callable[[Coroutine[Any, Any, Any]], asyncio.Task] = _spawn
