"""The built training run, and what its checkpoints hold.

:class:`RunContext` is what :class:`~tunix_agentic.trainer.Trainer` builds and the RL
loop drives; :class:`GRPOSteps` is the GRPO learner as that loop sees it;
:class:`RunCheckpoints` decides which RL step a checkpoint holds and writes it: after
the warm start, every ``rl.checkpoint_every`` RL steps, the last step, and the last
finished step on a stop signal or an error.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any

import numpy as np

from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.config import RunConfig
from tunix_agentic.inference.base import InferenceEngine
from tunix_agentic.learners.batching import finite_groups, grpo_batch, used_length
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.trace import Timeline
from tunix_agentic.rollout.group import Group
from tunix_agentic.rollout.orchestrator import RolloutOrchestrator
from tunix_agentic.rollout.transcripts import TranscriptLog

_log = logging.getLogger(__name__)


class NonFiniteLoss(RuntimeError):
    """A train step's loss or gradient norm was NaN or infinite; the run cannot go on."""


class GRPOSteps:
    """The GRPO learner as the RL loop sees it: groups in, one train step, figures out."""

    def __init__(self, learner: GRPOLearner, cfg: RunConfig, pad_id: int):
        self.learner, self.cfg, self.pad_id = learner, cfg, pad_id
        # Train steps begun on the learner's state (a step that raised may have consumed it).
        self.started = 0

    def train_on(self, groups: list[Group]) -> dict[str, float]:
        """One step on ``groups``; a group with a non-finite reward or advantage is left
        out and counted (``learner/nonfinite_groups``), and with none left no step runs.
        A step whose loss or gradient norm is not finite raises :class:`NonFiniteLoss`
        (the learner's state is then spoilt: the run stops, its last checkpoint kept)."""
        groups, too_long = self._fitting(groups)
        groups, dropped = finite_groups(groups, self.learner.advantage_fn)
        if dropped:
            _log.warning("%d group(s) with a non-finite reward or advantage left out", dropped)
        out = self._step(groups) if groups else None
        if out is None:  # nothing finite to train on: no update this step
            _log.warning("no group left to train on: this step makes no update")
            left_out = dropped + len(groups)  # (a batch-level estimator's NaN: all of them)
            return {
                "learner/nonfinite_groups": float(left_out),
                "learner/too_long_groups": float(too_long),
                "learner/skipped_steps": 1.0,
            }
        if not all(math.isfinite(out.get(k, 0.0)) for k in ("loss", "grad_norm")):
            raise NonFiniteLoss(
                f"the loss of train step {self.started} is not finite (loss {out.get('loss')}, "
                f"grad_norm {out.get('grad_norm')}): the run stops; its newest checkpoint is "
                "of the last step whose loss was finite (check the rewards, learning rate and clip settings)"
            )
        return {
            **out,
            "learner/nonfinite_groups": float(dropped),
            "learner/too_long_groups": float(too_long),
        }

    def _fitting(self, groups: list[Group]) -> tuple[list[Group], int]:
        """The groups whose every learner row fits the engine's window
        (``engine.max_seq_len``), and how many were left out. A row past it (an episode
        recorded through a node, by an engine with a longer window) is refused with an
        error naming its episode, never handed to the learner. A row counts up to its last
        trained token (:func:`used_length`): the tool message that ended an episode cut at
        the token limit may pass the window, and the learner never reads it."""
        limit = self.cfg.engine.max_seq_len
        kept = []
        for group in groups:
            longest = [
                (max(used_length(r) for r in t.learner_rows()), t.episode_id)
                for t in group.trajectories
                if t.steps
            ]
            n, episode = max(longest, default=(0, ""))
            if n > limit:
                _log.error(
                    "group %s left out: episode %s has a learner row of %d tokens, past "
                    "engine.max_seq_len=%d (raise it, or keep the agent's prompts within it)",
                    group.group_id,
                    episode,
                    n,
                    limit,
                )
                continue
            kept.append(group)
        return kept, len(groups) - len(kept)

    def _step(self, groups: list[Group]) -> dict[str, float] | None:
        rollout, lcfg = self.cfg.rollout, self.cfg.learner
        rows = rollout.groups_per_batch * rollout.group_size
        multiple = self.learner.row_multiple()
        batch = grpo_batch(
            groups,
            self.learner.advantage_fn,
            pad_id=self.pad_id,
            num_rows=-(-rows // multiple) * multiple,
            length_multiple=lcfg.length_bucket,
            geometric=True,
            task_normalize=lcfg.task_normalize,
            turn_level=lcfg.turn_advantage,
            overlong=lcfg.overlong,
            overlong_max_len=lcfg.overlong_max_len,
            overlong_cache_len=lcfg.overlong_cache_len,
            constrained=lcfg.constrained_tokens,
        )
        if not np.all(np.isfinite(batch.advantages)):  # a batch-level estimator's
            return None
        self.started += 1
        return self.learner.train_step(batch, pad_id=self.pad_id)

    def params_for_engine(self) -> Any:
        return self.learner.params_for_engine()


def cpu_seconds() -> float:
    """CPU seconds of this process (every thread) and of its children that have ended
    (environment and sandbox processes, the SFT's data workers)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@dataclasses.dataclass
class RunContext:
    """The built run: what the loop drives and what a checkpoint is made of."""

    learner: GRPOLearner
    orch: RolloutOrchestrator
    engine: InferenceEngine
    ckpt: Checkpointer
    metrics: MetricsRecorder
    t_start: float
    start_step: int
    timeline: Timeline  # the trace and the --profile-steps profiler
    before: float | None = None
    by_task_before: dict[str, float] = dataclasses.field(default_factory=dict)
    reward_before: float = 0.0
    transcripts: TranscriptLog | None = None  # set once built
    steps: GRPOSteps | None = None  # the RL loop's learner, once RL began
    # cpu_seconds() at the run's start, less the CPU seconds of the runs it resumed
    cpu_start: float = dataclasses.field(default_factory=cpu_seconds)


class RunCheckpoints:
    """Which RL step the run's checkpoints hold, and writing them (in the background).

    ``done_step``: the last finished RL step (0: the warm start is done); ``saved_step``:
    the last one written. ``model``: the run's model config as a dict, kept in each
    checkpoint's metadata.
    """

    def __init__(self, model: dict[str, Any]):
        self.model = model
        self.done_step: int | None = None
        self.saved_step: int | None = None
        self._trained_at_done = 0  # train steps begun when the last RL step finished
        self._rollout_at_done: dict[str, Any] | None = None  # the task stream's state then

    def resumed_at(self, step: int) -> None:
        """The run continues from the checkpoint of ``step``."""
        self.saved_step = self.done_step = step

    def step_done(self, ctx: RunContext, step: int) -> None:
        """RL step ``step`` finished: keep what a checkpoint of it holds as it is now (the
        next batch may be taken, and its groups leave the task stream's pending list,
        before a later save)."""
        self.done_step = step
        self._trained_at_done = ctx.steps.started if ctx.steps is not None else 0
        self._rollout_at_done = json.loads(json.dumps(ctx.orch.checkpoint_state()))

    def save(self, ctx: RunContext, step: int) -> None:
        """Checkpoint ``step`` in the background (once per step; skipped if already saved)."""
        if self.saved_step == step:
            return
        ctx.metrics.flush()  # every scalar up to this step is on disk before the checkpoint
        at_done = step == self.done_step and self._rollout_at_done is not None
        meta = {
            "success_before": ctx.before,
            "success_before_by_task": ctx.by_task_before,
            "reward_before": ctx.reward_before,
            "rollout": self._rollout_at_done if at_done else ctx.orch.checkpoint_state(),
            "version": step,
            "elapsed_s": time.perf_counter() - ctx.t_start,
            "cpu_s": cpu_seconds() - ctx.cpu_start,
            "wall_time": time.time(),  # for people: a resume decides what to redo by step
            "model": self.model,
        }
        ctx.ckpt.save(step, ctx.learner.checkpoint_params(), ctx.learner.state.opt_state, meta)
        self.saved_step = step

    def save_on_exit(self, ctx: RunContext, exc_type, exc, tb) -> bool:
        """On a stop signal or an error, checkpoint the last finished step (an exit-stack
        callback; never suppresses the exit's exception).

        Only a whole step is saved: after a train step began whose step did not finish
        (it raised, or its report did), the learner holds no finished step's state, and
        the newest checkpoint stays the last one written. A forced way out (a second
        Ctrl-C) saves nothing; a save that fails is logged, not raised over the error.
        """
        if exc_type is None or not issubclass(exc_type, Exception):
            return False  # a run that ended saved its last step; a forced exit waits for nothing
        if self.done_step is None or ctx.before is None or self.saved_step == self.done_step:
            return False
        if ctx.steps is not None and ctx.steps.started != self._trained_at_done:
            _log.warning(
                "step %d did not finish: the newest checkpoint stays step %s",
                self.done_step + 1,
                self.saved_step,
            )
            return False
        try:
            self.save(ctx, self.done_step)
        except Exception as save_exc:
            _log.warning(
                "could not checkpoint step %d on the way out: %s",
                self.done_step,
                f"{type(save_exc).__name__}: {save_exc}",
            )
        return False
