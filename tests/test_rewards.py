"""Rewards that would poison the learner (tunix_agentic/rollout/rewards.py, the learner's
finite-group check, the run's stop on a non-finite loss).

Before: an environment (or an agent on a node) returning ``1e308`` was accepted; float32
turned it into ``inf``, the group's advantages and the loss into NaN, and ``train`` still
exited 0 with every later evaluation an engine error.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.config import load_config
from tunix_agentic.envs.base import register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.learners.advantages import grpo
from tunix_agentic.learners.batching import finite_groups
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.rollout.group import Group
from tunix_agentic.rollout.rewards import RewardError, check_reward
from tunix_agentic.run_context import GRPOSteps, NonFiniteLoss
from tunix_agentic.testing import TINY_RUN_OVERRIDES, tiny_model
from tunix_agentic.trainer import Trainer
from tunix_agentic.trajectory import Step, Trajectory

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
TINY_RUN = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0.5, None),
        (-3, None),
        (np.float32(1.0), None),
        (1e6, None),
        (1e308, "must lie in"),
        (-1.5e6, "must lie in"),
        (float("nan"), "must be finite"),
        (float("inf"), "must be finite"),
        (True, "must be a number"),
        ("1", "must be a number"),
        (None, "must be a number"),
    ],
    ids=["half", "int", "numpy", "limit", "1e308", "below", "nan", "inf", "bool", "str", "none"],
)
def test_a_reward_is_a_finite_real_within_the_limit(value, error):
    if error is None:
        assert check_reward(value, 1e6) == float(value)
    else:
        with pytest.raises(RewardError, match=error):
            check_reward(value, 1e6)


def make_group(index: int, rewards: list[float]) -> Group:
    trajs = []
    for i, r in enumerate(rewards):
        traj = Trajectory(task_id="t", episode_id=f"g{index}-{i}", reward=r)
        traj.append_prompt([3, 4, 5])
        traj.append_action(
            Step(
                context_len=3,
                action_ids=[6 + i, 7],
                logprobs=[-0.5, -0.5],
                versions=[0, 0],
                finish_reason="stop",
            )
        )
        trajs.append(traj)
    return Group(
        group_id=f"g{index}", index=index, task=None, admitted_version=0, trajectories=trajs
    )


def test_a_group_float32_cannot_hold_is_left_out():
    groups = [make_group(0, [1.0, 0.0]), make_group(1, [1e308, 0.0]), make_group(2, [np.nan, 1])]
    kept, dropped = finite_groups(groups, grpo)
    assert [g.group_id for g in kept] == ["g0"] and dropped == 2


def test_the_learner_never_trains_on_a_poisoned_group_and_stops_on_a_nan_loss():
    cfg = load_config(CONFIG, [*TINY_RUN, "rollout.groups_per_batch=2", "learner.mi_pairs=0"])
    learner = GRPOLearner(tiny_model(), cfg.learner, seed=0)
    steps = GRPOSteps(learner, cfg, pad_id=0)
    out = steps.train_on([make_group(0, [1e308, 0.0]), make_group(1, [np.inf, 0.0])])
    assert out == {
        "learner/nonfinite_groups": 2.0,
        "learner/too_long_groups": 0.0,
        "learner/skipped_steps": 1.0,
    }
    assert steps.started == 0 and learner.state.step == 0  # no update at all
    out = steps.train_on([make_group(0, [1.0, 0.0]), make_group(1, [1e308, 0.0])])
    assert out["learner/nonfinite_groups"] == 1.0 and np.isfinite(out["loss"])
    assert learner.state.step == 1
    # Weights gone bad (any cause): the step's loss is NaN and the run must stop.
    learner.state.params = jax.tree.map(lambda x: jnp.full_like(x, jnp.nan), learner.state.params)
    with pytest.raises(NonFiniteLoss, match="the loss of train step 2 is not finite"):
        steps.train_on([make_group(0, [1.0, 0.0])])


class _HugeReward(ArithmeticEnv):
    async def evaluate(self) -> float:
        return 1e308


register_env("_test_huge_reward", tasks=ArithmeticTasks())(_HugeReward)


def test_an_environment_reward_past_the_limit_is_an_env_error_naming_its_evaluate(tmp_path):
    from tunix_agentic.rollout.episode import InfraFailureError

    overrides = [
        *TINY_RUN,
        "rl.steps=2",
        f"run_dir={tmp_path / 'run'}",
        "env.name=_test_huge_reward",
        "rollout.max_infra_failures_in_a_row=4",
    ]
    trainer = Trainer(load_config(CONFIG, overrides), progress=False)
    with pytest.raises(
        InfraFailureError, match=r"_HugeReward\.evaluate \(.*test_rewards\.py:\d+\)"
    ):
        trainer.run()


def test_a_run_whose_loss_goes_nan_exits_1_in_one_line_keeping_its_last_good_checkpoint(
    tmp_path, capsys
):
    """A learning rate of 1e30 with weight decay is finite (the config takes it): the first
    step's update blows the weights up, whatever the gradients, and a later loss is NaN."""
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--quiet",
            "--config",
            CONFIG,
            *TINY_RUN,
            "rl.steps=4",
            "rl.checkpoint_every=1",
            "rl.eval_every=0",
            "learner.optimizer.learning_rate=1e30",
            "learner.optimizer.warmup_steps=0",
            "learner.optimizer.weight_decay=1.0",
            f"run_dir={run_dir}",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("tunix-agentic: error: the loss of train step")
    assert "Traceback" not in "\n".join(err)
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    # The warm start and every step whose loss was finite; none after.
    assert saved and saved[-1] < 4


def test_a_row_past_the_engines_window_is_refused_naming_its_episode(caplog):
    """An episode recorded through a node by an engine with a longer window than this run's
    (``engine.max_seq_len``) never reaches the learner: its group is left out, counted, and
    the error names the episode; the other groups train."""
    cfg = load_config(CONFIG, [*TINY_RUN, "rollout.groups_per_batch=2", "learner.mi_pairs=0"])
    steps = GRPOSteps(GRPOLearner(tiny_model(), cfg.learner, seed=0), cfg, pad_id=0)
    long = make_group(1, [1.0, 0.0])
    long.trajectories[1].token_ids[:0] = [3] * cfg.engine.max_seq_len  # a longer prompt
    long.trajectories[1].prompt_len += cfg.engine.max_seq_len
    # A tool message past the window after the last action is never read: not refused.
    tail = make_group(2, [1.0, 0.0])
    tail.trajectories[0].append_observation([3] * cfg.engine.max_seq_len)
    with caplog.at_level("ERROR"):
        out = steps.train_on([make_group(0, [1.0, 0.0]), long, tail])
    assert out["learner/too_long_groups"] == 1.0 and np.isfinite(out["loss"])
    assert f"episode g1-1 has a learner row of {cfg.engine.max_seq_len + 5} tokens" in caplog.text
    assert "g2-0" not in caplog.text
