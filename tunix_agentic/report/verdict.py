"""The bottleneck verdict: a pure function of a run's :class:`~.figures.Figures`.

An asynchronous RL step is as long as the slower of its two sides: the learner
(train step and weight sync) and the rollout (episodes filling the next batch). When
the learner waits for batches less than :data:`WAIT_SHARE` of its step, the learner
is the bottleneck (``learner-bound``, or ``weight-sync-bound`` when the sync outlasts
the train step). Otherwise the rollout is, and the episodes' largest share of time
names what holds it back: a tool (``tool-bound``), environment start-up (INIT,
``startup-bound``), the reward (EVAL, ``reward-bound``) or model calls; model calls
are ``host-bound`` when the engine's host gaps exceed :data:`HOST_GAP_SHARE` of its
working time (busy + gap), else ``generation-bound``. Each verdict quotes the figures
it rests on and the settings (real config keys) that move it.
"""

from __future__ import annotations

import dataclasses

from tunix_agentic.report.figures import Figures

WAIT_SHARE = 0.3  # the learner waits less than this share of its step: it is the bottleneck
HOST_GAP_SHARE = 0.3  # host gap over (busy + gap) above this: the host holds the engine back
SPIKE = 3.0  # a train step this many times the median one: it compiled
IDLE_SHARE = 0.3  # an engine idle more than this could run more episodes at once


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``kind``: one of ``learner-bound``, ``weight-sync-bound``, ``tool-bound``,
    ``startup-bound``, ``reward-bound``, ``host-bound``, ``generation-bound``,
    ``no-data``. ``finding``: what holds the run back, with its figures; ``advice``: what
    to change; ``tool``: the tool named by a ``tool-bound`` verdict."""

    kind: str
    finding: str
    advice: str
    tool: str | None = None

    @property
    def text(self) -> str:
        """One paragraph: ``"<kind>: <finding>; <advice>"``."""
        return f"{self.kind}: {self.finding}; {self.advice}"


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def _s(x: float) -> str:
    return f"{x:.3g} s"


def verdict(fig: Figures) -> Verdict:
    """The bottleneck of a run with figures ``fig`` (see the module docstring)."""
    if fig.steps == 0 or fig.step_s <= 0:
        return Verdict("no-data", "the run has no timed RL step", "run at least one RL step")
    wait = fig.wait_s / fig.step_s
    engine = (
        f"the engine was busy {_pct(fig.busy)}, in host gaps {_pct(fig.host_gap)} and idle "
        f"{_pct(fig.idle)} of its time per RL step"
    )
    if wait < WAIT_SHARE:
        return _learner_verdict(fig, wait, engine)
    parts = {"init": fig.init_s, "model": fig.model_s, "reward": fig.reward_s}
    parts.update({f"tool/{t.name}": t.seconds_per_step for t in fig.tools})
    total = sum(parts.values())
    if total <= 0:
        return Verdict(
            "generation-bound",
            f"the learner waited {_pct(wait)} of its {_s(fig.step_s)} step for batches, and the "
            f"episodes recorded no stage times; {engine}",
            "give the engine more work at once (rollout.run_workers) or generate less "
            "(agent.max_new_tokens)",
        )
    top = max(parts, key=lambda k: parts[k])
    share = parts[top] / total
    rollout = (
        f"the learner waited {_pct(wait)} of its {_s(fig.step_s)} RL step for batches, and "
        f"{{what}} took {_pct(share)} of the episodes' time ({_s(parts[top])} per RL step)"
    )
    q = fig.quantile
    if top.startswith("tool/"):
        tool = next(t for t in fig.tools if f"tool/{t.name}" == top)
        return Verdict(
            "tool-bound",
            f"the tool {tool.name!r} took {_s(tool.p95)} per call ({tool.quantile}); "
            + rollout.format(what=f"calls to the tool {tool.name!r}"),
            f"look at the tool {tool.name!r} (why a call takes {_s(tool.p95)}), cap it with "
            "env.tool_timeout_s, or hide it behind more episodes in flight "
            "(rollout.run_workers)",
            tool=tool.name,
        )
    if top == "init":
        slowest = f"; {fig.startup[0].name} {fig.startup[0].quantile} {_s(fig.startup[0].p95)}"
        return Verdict(
            "startup-bound",
            f"environment start-up (INIT) {q} {_s(fig.init_p95)}"
            + (slowest if fig.startup else "")
            + "; "
            + rollout.format(what="environment start-up"),
            "start more environments at once (rollout.init_workers), start them ahead of "
            "need (rollout.prefetch_groups), or make the environment's reset cheaper",
        )
    if top == "reward":
        return Verdict(
            "reward-bound",
            f"the reward (EVAL) {q} {_s(fig.reward_p95)}; "
            + rollout.format(what="computing rewards"),
            "score more episodes at once (rollout.eval_workers) or speed up the verifier",
        )
    working = fig.busy + fig.host_gap
    gap = fig.host_gap / working if working > 0 else 0.0
    model = f"model calls {q} {_s(fig.model_p95)}; " + rollout.format(what="model calls")
    if gap > HOST_GAP_SHARE:
        return Verdict(
            "host-bound",
            f"host gap {_pct(gap)} of the engine's working time (busy {_pct(fig.busy)}, "
            f"host gap {_pct(fig.host_gap)} of its time per RL step); {model}",
            "run more tokens per device call (raise engine.decode_steps), keep engine.overlap "
            "on, and keep other work off the host's cores",
        )
    more = (
        f"; the engine was idle {_pct(fig.idle)}: run more episodes at once (rollout.run_workers)"
        if fig.idle > IDLE_SHARE
        else ""
    )
    return Verdict(
        "generation-bound",
        f"the engine was busy {_pct(fig.busy)} of its time per RL step; {model}",
        "generate less (agent.max_new_tokens, agent.max_turns), give the engine more slots "
        "(engine.max_slots) or a faster accelerator" + more,
    )


def _learner_verdict(fig: Figures, wait: float, engine: str) -> Verdict:
    if fig.sync_s > fig.train_s:
        return Verdict(
            "weight-sync-bound",
            f"the weight sync took {_s(fig.sync_s)} per RL step ({_pct(fig.sync_s / fig.step_s)} "
            f"of RL time, the train step {_s(fig.train_s)}) and the learner waited only "
            f"{_pct(wait)} for batches; {engine}",
            "let rollouts run ahead of the sync (raise rollout.max_staleness) and look at the "
            "weight transfer (rollout.service.weights_dir on a fast local disk for remote "
            "engines)",
        )
    spikes = ""
    if fig.train_p50_s > 0 and fig.train_max_s > SPIKE * fig.train_p50_s:
        spikes = (
            f"; train steps took {_s(fig.train_p50_s)} at the median but up to "
            f"{_s(fig.train_max_s)}: each new sequence length compiles the step (a coarser "
            "learner.length_bucket compiles fewer shapes)"
        )
    return Verdict(
        "learner-bound",
        f"the engine was idle {_pct(fig.idle)} of RL time waiting for new weights: the train "
        f"step took {_s(fig.train_s)} ({_pct(fig.train_s / fig.step_s)} of the "
        f"{_s(fig.step_s)} RL step) and the learner waited for batches only {_pct(wait)} "
        f"of it (engine busy {_pct(fig.busy)}, host gaps {_pct(fig.host_gap)})",
        "raise rollout.max_staleness (rollouts run further ahead) or shorten the train step "
        "(fewer rows per batch: rollout.groups_per_batch, rollout.group_size)" + spikes,
    )
