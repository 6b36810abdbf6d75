"""Held-out evaluation: success and tool use over held-out tasks, overall and per source.

The trainer evaluates before and after RL with the same orchestrator (on seeds of
its own, so evaluating never shifts a training episode's seed); success is the
mean reward, and an episode lost to infrastructure counts as a failure.
"""

from __future__ import annotations

import dataclasses

from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.data.sources import RunSources
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator


@dataclasses.dataclass
class EvalResult:
    """Held-out evaluation: overall success and tool use, and success per task source."""

    success: float
    tool_use: float
    episodes: int
    statuses: dict[str, int]
    by_task: dict[str, float] = dataclasses.field(default_factory=dict)


async def evaluate(
    orchestrator: RolloutOrchestrator,
    sources: RunSources,
    n: int,
    *,
    seed: int,
    agent_config: AgentConfig,
) -> EvalResult:
    """``n`` held-out tasks of every source, each run once with ``agent_config``."""
    heldout = sources.heldout(n, seed=seed)
    groups = await orchestrator.run_tasks(
        [t for tasks in heldout.values() for t in tasks], agent_config=agent_config
    )
    result = score(groups)
    for name in heldout:
        mine = [g for g in groups if str(getattr(g.task, "task_name", name)) == name]
        result.by_task[name] = score(mine).success
    return result


def score(groups: list[Group]) -> EvalResult:
    """Mean reward, tool-use rate, episode count and statuses (every attempt's) over
    ``groups``; an episode lost to infrastructure counts as a failure."""
    statuses: dict[str, int] = {}
    for g in groups:
        for t in g.trajectories + g.dropped:
            statuses[t.status] = statuses.get(t.status, 0) + 1
    trajs = [t for g in groups for t in g.trajectories]
    episodes = len(trajs) + sum(g.lost for g in groups)
    if not episodes:
        return EvalResult(0.0, 0.0, 0, statuses)
    return EvalResult(
        sum(t.reward for t in trajs) / episodes,
        sum(any(s.tool_calls for s in t.steps) for t in trajs) / episodes,
        episodes,
        statuses,
    )


def log_eval(metrics: MetricsRecorder, ev: EvalResult, step: int) -> None:
    """Write ``eval/success`` and ``eval/tool_use`` at ``step`` (and success per source
    when there are several)."""
    metrics.scalar("eval/success", ev.success, step)
    metrics.scalar("eval/tool_use", ev.tool_use, step)
    if len(ev.by_task) > 1:
        for name, success in ev.by_task.items():
            metrics.scalar(f"eval/success/{name}", success, step)
