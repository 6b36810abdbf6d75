import json
import re
from pathlib import Path

import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.metrics import read_scalars
from tunix_agentic.trainer import train

TINY_RUN = [
    "model.d_model=32",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.head_dim=8",
    "model.ffn_dim=48",
    "engine.max_slots=8",
    "engine.max_seq_len=128",
    "agent.max_new_tokens=40",
    "rollout.group_size=2",
    "rollout.groups_per_batch=2",
    "rollout.filter_uniform_groups=false",
    "sft.steps=30",
    "sft.batch_size=8",
    "rl.steps=2",
    "rl.eval_tasks=4",
]
CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")


def test_tiny_run_writes_events_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    result = train(CONFIG, [*TINY_RUN, f"run_dir={run_dir}"], progress=False)
    assert result.steps == 2 and len(result.history) == 2
    assert re.fullmatch(
        r"held-out success: \d\.\d\d -> \d\.\d\d \(2 steps, \d+m\d\ds\)", result.summary()
    )

    scalars = read_scalars(run_dir / "tensorboard")
    assert [s for s, _ in scalars["learner/loss"]] == [1, 2]
    for tag in (
        "rollout/reward_mean",
        "time/train_s",
        "time/weight_sync_s",
        "time/model_call_s",
        "throughput/generated_tokens_per_s",
        "engine/busy_fraction",
        "engine/sched_gap_fraction",
        "engine/idle_fraction",
        "learner/clip_fraction",
        "eval/success",
        "sft/loss",
    ):
        assert tag in scalars, tag
    for step in range(2):  # the engine's time since RL started, split three ways
        parts = [scalars[f"engine/{k}_fraction"][step][1] for k in ("busy", "sched_gap", "idle")]
        assert all(p >= 0 for p in parts) and sum(parts) <= 1.05
    assert (run_dir / "checkpoints" / "2").is_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success_after"] == result.success_after

    again = train(CONFIG, [*TINY_RUN, "rl.steps=1", f"run_dir={run_dir}"], progress=False)
    assert again.run_dir == f"{run_dir}-2"  # a second fresh run never overwrites the first
    assert (run_dir / "checkpoints" / "2").is_dir() and (
        tmp_path / "run-2" / "checkpoints" / "1"
    ).is_dir()

    resumed = train(None, ["rl.steps=3"], resume_dir=str(run_dir), progress=False)
    assert len(resumed.history) == 1  # only step 3 was left to do
    assert resumed.success_before == result.success_before  # carried in the checkpoint
    assert (run_dir / "checkpoints" / "3").is_dir()
    assert [s for s, _ in read_scalars(run_dir / "tensorboard")["learner/loss"]] == [1, 2, 3]


def test_multi_task_cross_policy_run(tmp_path):
    overrides = [
        *TINY_RUN,
        f"run_dir={tmp_path / 'mt'}",
        "tasks=[{name: short, weight: 1.0}, {name: long, weight: 1.0, seed_offset: 1}]",
        "cross_policy.stale_engines=1",
        "engine.warmup=true",  # both engines compile beside SFT, then get its weights
        "learner.task_normalize=true",
        "rollout.max_turns_schedule=[[0, 2], [1, 3]]",
        "sft.steps=5",
    ]
    result = train(CONFIG, overrides, progress=False)
    assert len(result.history) == 2
    scalars = read_scalars(tmp_path / "mt" / "tensorboard")
    assert "rollout/reward_mean/short" in scalars and "rollout/reward_mean/long" in scalars
    assert [v for _, v in scalars["gauge/rollout/max_turns_max"]][-1] == 3.0


@pytest.mark.parametrize(
    "override,key",
    [
        ("rl.stepz=3", "rl.stepz"),
        ("rollout.group_size=0", "group_size"),
        ("agent.temperature=abc", "agent.temperature"),
    ],
    ids=["unknown_key", "bad_value", "bad_type"],
)
def test_cli_reports_config_errors_by_name(override, key, capsys):
    assert main(["train", "--config", CONFIG, override]) == 2
    err = capsys.readouterr().err
    assert "error" in err and key in err


def test_cli_resume_needs_a_run_dir(tmp_path, capsys):
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


@pytest.mark.slow
def test_default_run_learns_to_use_the_calculator(tmp_path):
    """The README's main job, shortened: held-out success must rise clearly."""
    result = train(
        CONFIG, [f"run_dir={tmp_path / 'run'}", "rl.steps=30", "rl.eval_tasks=100"], progress=False
    )
    assert result.success_after >= result.success_before + 0.3
    assert result.success_after >= 0.8
