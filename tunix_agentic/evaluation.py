"""Held-out evaluation: success, reward, turns, tokens and tool use, overall and per source.

The trainer evaluates before and after RL with the same orchestrator (on seeds of
its own, so evaluating never shifts a training episode's seed). Two figures, named for
what they are: the **success rate** (``success``, ``eval/success_fraction``) is the share of
episodes whose reward is above 0, and the **mean reward** (``reward``, ``eval/reward_mean``)
is the mean of their rewards; with a 0/1 reward the two agree, with a shaped one they
differ. An episode lost to infrastructure counts as a failure in the success rate. With
``rl.eval_every`` it also evaluates while training goes on (see
:func:`tunix_agentic.rl_loop.run_rl_steps` and :class:`~tunix_agentic.rl_loop.PeriodicEval`
for which policy version such an evaluation measures), and ``tunix-agentic eval``
evaluates a saved checkpoint (:mod:`tunix_agentic.cli.eval_cmd`).
"""

from __future__ import annotations

import dataclasses
import time

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.config import EvalPriority
from tunix_agentic.data.sources import RunSources
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.rollout.episode import Group
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator
from tunix_agentic.rollout.transcripts import HELDOUT_PER_EVAL, TranscriptLog, group_records
from tunix_agentic.trajectory import task_key


@dataclasses.dataclass
class EvalResult:
    """Held-out evaluation of one policy.

    ``success``: the success rate, the share of every episode asked for whose reward is
    above 0 (one lost to infrastructure counts as a failure); ``reward`` (the mean
    reward), ``turns``, ``tool_calls`` and ``generated_tokens``: means over the episodes
    that could be
    scored; ``versions``: the policy versions that sampled its tokens (one, ``[v]``, when
    a single policy was measured); ``by_task``: the success rate per task source,
    ``reward_by_task`` the mean reward; ``per_task``: the whole result per task source;
    ``transcripts``: a few of its episodes as :mod:`~tunix_agentic.rollout.transcripts`
    records (the best, the worst, one cut off, ...); ``wall_s``: how long it took (set by
    :func:`evaluate`).
    """

    success: float
    tool_use: float
    episodes: int
    statuses: dict[str, int]
    by_task: dict[str, float] = dataclasses.field(default_factory=dict)
    reward: float = 0.0
    turns: float = 0.0
    tool_calls: float = 0.0
    generated_tokens: float = 0.0
    versions: list[int] = dataclasses.field(default_factory=list)
    per_task: dict[str, EvalResult] = dataclasses.field(default_factory=dict)
    reward_by_task: dict[str, float] = dataclasses.field(default_factory=dict)
    transcripts: list[dict] = dataclasses.field(default_factory=list, repr=False)
    wall_s: float | None = None


async def evaluate(
    orchestrator: RolloutOrchestrator,
    sources: RunSources,
    n: int,
    *,
    seed: int,
    agent_config: AgentConfig,
    template: ChatFormat,
    one_at_a_time: bool = False,
    transcripts: int = HELDOUT_PER_EVAL,
) -> EvalResult:
    """``n`` held-out tasks of every source, each run once with ``agent_config``.

    All tasks run at once by default; ``one_at_a_time`` runs them in turn (an evaluation
    that takes the least of the engine beside training: ``rl.eval_priority: low``). The
    seeds are the same either way. ``transcripts`` episodes are kept as records in the
    result: those of the first tasks (:func:`~tunix_agentic.rollout.transcripts.first_tasks`),
    the same at every evaluation, rendered with ``template``. Cancelling the call cancels
    every episode under way (their environments are closed and their engine requests
    aborted).
    """
    t0 = time.perf_counter()
    heldout = sources.heldout(n, seed=seed)
    tasks = [t for ts in heldout.values() for t in ts]
    if one_at_a_time:
        groups: list[Group] = []
        for task in tasks:
            groups += await orchestrator.run_tasks([task], agent_config=agent_config)
    else:
        groups = await orchestrator.run_tasks(tasks, agent_config=agent_config)
    result = score(groups)
    start = 0  # groups come back in task order: each source's are the next len(its tasks)
    for name, of_source in heldout.items():
        mine = score(groups[start : start + len(of_source)])
        start += len(of_source)
        result.by_task[name] = mine.success
        result.reward_by_task[name] = mine.reward
        result.per_task[name] = mine
    # Kept in task order: the same held-out tasks at every evaluation, before and after RL.
    order = {task_key(t).id: i for i, t in enumerate(tasks)}
    in_order = sorted(groups, key=lambda g: order.get(task_key(g.task).id, len(order)))
    result.transcripts = group_records(
        in_order, template, agent_config.parser, transcripts, same_tasks=True
    )
    result.wall_s = time.perf_counter() - t0
    return result


def score(groups: list[Group]) -> EvalResult:
    """Success rate (reward > 0), tool-use rate, mean reward, turns, generated tokens,
    episode count, statuses (every attempt's) and sampling versions over ``groups``; an
    episode lost to infrastructure counts as a failure in ``success`` and ``tool_use``."""
    statuses: dict[str, int] = {}
    for g in groups:
        for t in g.trajectories + g.dropped:
            statuses[t.status] = statuses.get(t.status, 0) + 1
    trajs = [t for g in groups for t in g.trajectories]
    episodes = len(trajs) + sum(g.lost for g in groups)
    if not episodes:
        return EvalResult(0.0, 0.0, 0, statuses)
    scored = max(len(trajs), 1)
    return EvalResult(
        success=sum(t.reward > 0 for t in trajs) / episodes,
        tool_use=sum(any(s.tool_calls for s in t.steps) for t in trajs) / episodes,
        episodes=episodes,
        statuses=statuses,
        reward=sum(t.reward for t in trajs) / scored,
        turns=sum(len(t.steps) for t in trajs) / scored,
        tool_calls=sum(len(s.tool_calls) for t in trajs for s in t.steps) / scored,
        generated_tokens=sum(t.num_generated for t in trajs) / scored,
        versions=sorted({v for t in trajs for s in t.steps for v in s.versions}),
    )


def log_eval(
    metrics: MetricsRecorder,
    ev: EvalResult,
    step: int,
    transcripts: TranscriptLog | None = None,
) -> None:
    """Write ``eval/success_fraction`` (the success rate: share of episodes with reward > 0),
    ``eval/reward_mean`` (the mean reward), ``eval/tool_use_fraction``, ``eval/turns_mean``,
    ``eval/tool_calls_mean`` (per episode), ``eval/generated_tokens_mean``, the share cut at
    the token limit (``eval/truncated_fraction``), the policy versions measured
    (``eval/version_min``, ``eval/version_max``) and its wall time (``eval/wall_s``) at
    ``step``, and success and reward per source when there are several; with ``transcripts``, the
    evaluation's episode records too (``RUN/transcripts/heldout_<step>.jsonl``)."""
    metrics.scalar("eval/success_fraction", ev.success, step)
    metrics.scalar("eval/tool_use_fraction", ev.tool_use, step)
    metrics.scalar("eval/reward_mean", ev.reward, step)
    metrics.scalar("eval/turns_mean", ev.turns, step)
    metrics.scalar("eval/tool_calls_mean", ev.tool_calls, step)
    metrics.scalar("eval/generated_tokens_mean", ev.generated_tokens, step)
    if ev.episodes:
        truncated = ev.statuses.get("max_tokens", 0) / ev.episodes
        metrics.scalar("eval/truncated_fraction", truncated, step)
    if ev.wall_s is not None:
        metrics.scalar("eval/wall_s", ev.wall_s, step)
    if ev.versions:
        metrics.scalar("eval/version_min", float(ev.versions[0]), step)
        metrics.scalar("eval/version_max", float(ev.versions[-1]), step)
    if len(ev.by_task) > 1:
        for name, success in ev.by_task.items():
            metrics.scalar(f"eval/success_fraction/{name}", success, step)
            metrics.scalar(f"eval/reward_mean/{name}", ev.reward_by_task.get(name, 0.0), step)
    if transcripts is not None:
        transcripts.write_eval(step, ev.transcripts)


async def evaluate_beside_training(
    orchestrator: RolloutOrchestrator,
    sources: RunSources,
    n: int,
    *,
    seed: int,
    agent_config: AgentConfig,
    template: ChatFormat,
    priority: EvalPriority,
) -> EvalResult:
    """:func:`evaluate` while ``orchestrator`` produces training groups (``rl.eval_every``).

    ``priority="high"`` (the default of ``rl.eval_priority``): no new training group is
    admitted until the evaluation ends (groups under way finish), so its episodes get
    the run's RUN slots and the engine as the training episodes leave them. High is the
    default because the engine serves one version: while an evaluation runs, the
    weights the learner publishes are held back (see
    :class:`~tunix_agentic.rl_loop.PeriodicEval`), so the sooner it ends, the sooner
    they reach the engine; the pacer has admitted the next batch's groups already
    (``rollout.max_staleness`` ahead), so the learner seldom waits for the pause.
    ``"low"``: the tasks run one at a time beside training at full admission (the least
    share of the engine, the longest evaluation, the longest hold on the weights).
    """
    if priority == "high":
        with orchestrator.admission_paused():
            return await evaluate(
                orchestrator, sources, n, seed=seed, agent_config=agent_config, template=template
            )
    return await evaluate(
        orchestrator,
        sources,
        n,
        seed=seed,
        agent_config=agent_config,
        template=template,
        one_at_a_time=True,
    )
