"""The learning verdict: does the run learn? A pure function of its metrics, beside the
speed verdict of :mod:`tunix_agentic.report.verdict`.

The figures (:func:`learning_figures`): the training reward's trend (``rollout/reward_mean``,
the mean of the last third of the RL steps minus that of the first third), the held-out
trend (``eval/success_fraction``, the success rate: the share of held-out episodes with reward
> 0, last evaluation minus the first; ``eval/reward_mean`` beside it), the share of groups the
uniform-reward filter dropped (``count/rollout/groups_filtered_total`` against the groups
trained on, ``rl.steps x rollout.groups_per_batch``), and the share of episodes cut at
the token limit (``count/rollout/status/max_tokens_total`` over ``count/rollout/episodes_total``).

The verdict (:func:`learning_verdict`): held-out success decides when there are two
evaluations: it rose by at least :data:`RISE` (``learning``), or it did not
(``not learning``; a held-out success that fell is always ``not learning``). Without
two evaluations the training reward's trend decides the same way. Each verdict quotes
its figures and adds what the filtered share and the cut-off share point to.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import numpy as np

from tunix_agentic.report.figures import RunMetrics

RISE = 0.05  # a trend at least this large (in reward or success rate) counts as a rise
FILTERED_SHARE = 0.5  # more groups than this dropped as uniform: little to learn from
CUT_SHARE = 0.05  # more episodes than this cut at the token limit: say so

LearningKind = Literal["learning", "not learning", "no-data"]


@dataclasses.dataclass(frozen=True)
class LearningFigures:
    """``reward_first`` / ``reward_last``: mean training reward over the first and the last
    third of the RL steps (``steps`` of them); ``heldout``: ``(step, success rate)`` of
    every held-out evaluation, ``heldout_reward`` the same for the mean reward;
    ``filtered_share``: groups dropped as uniform over groups judged (None when unknown);
    ``cut_share``: episodes ended ``max_tokens`` over all episodes (None when unknown)."""

    steps: int
    reward_first: float
    reward_last: float
    heldout: tuple[tuple[int, float], ...] = ()
    heldout_reward: tuple[tuple[int, float], ...] = ()
    filtered_share: float | None = None
    filtered: int = 0
    cut_share: float | None = None
    cut: int = 0

    @property
    def reward_trend(self) -> float:
        return self.reward_last - self.reward_first

    @property
    def heldout_trend(self) -> float | None:
        if len(self.heldout) < 2:
            return None
        return self.heldout[-1][1] - self.heldout[0][1]


@dataclasses.dataclass(frozen=True)
class LearningVerdict:
    """``kind``: ``learning``, ``not learning`` or ``no-data``; ``finding``: the trends it
    rests on; ``advice``: what to look at or change."""

    kind: LearningKind
    finding: str
    advice: str

    @property
    def text(self) -> str:
        return f"{self.kind}: {self.finding}; {self.advice}"


def _groups_per_batch(run_dir: Path) -> int | None:
    """``rollout.groups_per_batch`` from the run's ``config.yaml`` (None when unreadable)."""
    import yaml

    try:
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
        return int(cfg["rollout"]["groups_per_batch"])
    except (OSError, KeyError, TypeError, ValueError, yaml.YAMLError):
        return None


def learning_figures(metrics: RunMetrics, groups_per_batch: int | None = None) -> LearningFigures:
    """The :class:`LearningFigures` of a run (``groups_per_batch`` defaults to the run's
    ``config.yaml``)."""
    rows = metrics.rl_rows
    rewards = np.asarray([r.get("rollout/reward_mean", 0.0) for r in rows], np.float64)
    third = max(1, len(rows) // 3)
    last = rows[-1]
    if groups_per_batch is None:
        groups_per_batch = _groups_per_batch(metrics.run_dir)
    filtered = int(last.get("count/rollout/groups_filtered_total", 0.0))
    filtered_share = None
    if groups_per_batch:
        judged = filtered + len(rows) * groups_per_batch
        filtered_share = filtered / judged if judged else None
    episodes = last.get("count/rollout/episodes_total", 0.0)
    cut = int(last.get("count/rollout/status/max_tokens_total", 0.0))
    return LearningFigures(
        steps=len(rows),
        reward_first=float(rewards[:third].mean()) if rows else 0.0,
        reward_last=float(rewards[-third:].mean()) if rows else 0.0,
        heldout=tuple(sorted(metrics.series.get("eval/success_fraction", []))),
        heldout_reward=tuple(sorted(metrics.series.get("eval/reward_mean", []))),
        filtered_share=filtered_share,
        filtered=filtered,
        cut_share=cut / episodes if episodes else None,
        cut=cut,
    )


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def learning_verdict(fig: LearningFigures, run_dir: str | Path | None = None) -> LearningVerdict:
    """Whether the run learns (see the module docstring); the advice's command names
    ``run_dir`` and the last held-out evaluation's step, ready to paste."""
    if fig.steps == 0 and len(fig.heldout) < 2:
        return LearningVerdict(
            "no-data", "the run has no RL step and fewer than two evaluations", "run RL steps"
        )
    reward = (
        f"the training reward went {fig.reward_first:.3f} -> {fig.reward_last:.3f} "
        f"(first third of the {fig.steps} RL steps -> last third)"
    )
    parts = [reward]
    trend = fig.heldout_trend
    if trend is not None:
        (s0, v0), (s1, v1) = fig.heldout[0], fig.heldout[-1]
        held = f"held-out success rate (reward > 0) {v0:.3f} at step {s0} -> {v1:.3f} at step {s1}"
        if len(fig.heldout_reward) >= 2:
            held += (
                f", held-out mean reward {fig.heldout_reward[0][1]:.3f} -> "
                f"{fig.heldout_reward[-1][1]:.3f}"
            )
        parts.insert(0, held)
        learning = trend >= RISE
    else:
        parts.append("fewer than two held-out evaluations: the training reward decides")
        learning = fig.reward_trend >= RISE
    advice = []
    if fig.filtered_share is not None:
        parts.append(
            f"{_pct(fig.filtered_share)} of the groups ({fig.filtered}) were dropped as "
            "uniform (every member the same reward)"
        )
        if fig.filtered_share > FILTERED_SHARE:
            advice.append(
                "most groups carry no signal (all fail or all succeed): warm up longer "
                "(sft.steps), use easier tasks or a shaped reward"
            )
    if fig.cut_share is not None:
        parts.append(
            f"{_pct(fig.cut_share)} of the episodes ({fig.cut}) were cut at the token limit "
            "(status max_tokens)"
        )
        if fig.cut_share > CUT_SHARE:
            advice.append(
                "episodes run out of room: raise engine.max_seq_len or agent.max_new_tokens, "
                "or lower agent.max_turns"
            )
    if trend is not None and trend < 0:
        advice.append("held-out success fell: lower learner.optimizer.learning_rate")
    where = run_dir if run_dir is not None else "RUN_DIR"
    if fig.heldout:
        advice.append(
            f"read the episodes: tunix-agentic show {where} --heldout --step {fig.heldout[-1][0]}"
        )
    else:
        advice.append(f"read the episodes: tunix-agentic show {where} --step {fig.steps}")
    return LearningVerdict(
        "learning" if learning else "not learning", "; ".join(parts), "; ".join(advice)
    )
