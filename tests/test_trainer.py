import json
import re
from pathlib import Path

import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.config import load_config
from tunix_agentic.envs.base import register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.metrics import read_scalars
from tunix_agentic.rollout.episode import InfraFailureError
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import Trainer, train

TINY_RUN = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "rl.steps=2"]
CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")


def read_texts(log_dir: Path) -> dict[str, list[tuple[int, str]]]:
    """TensorBoard text summaries by tag, read with TensorBoard's own loader."""
    from tensorboard.backend.event_processing import event_accumulator

    from tunix_agentic.metrics.recorder import event_runs

    ((run, _), *_) = event_runs(log_dir)  # the run's own directory comes first
    acc = event_accumulator.EventAccumulator(run, size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
        if tag.startswith("transcripts/")
    }


def test_tiny_run_writes_events_checkpoints_and_resumes(tmp_path):
    run_dir = tmp_path / "run"
    result = train(CONFIG, [*TINY_RUN, f"run_dir={run_dir}"], progress=False)
    assert result.steps == 2 and len(result.history) == 2
    assert re.fullmatch(
        r"held-out success: \d\.\d\d -> \d\.\d\d \(2 steps, \d+m\d\ds wall, \d+m\d\ds CPU; "
        r"success: the share of episodes with reward > 0\)\n"
        r"held-out mean reward: \d\.\d\d -> \d\.\d\d",
        result.summary(),
    )
    assert result.cpu_seconds > 0

    scalars = read_scalars(run_dir / "tensorboard")
    assert [s for s, _ in scalars["learner/loss"]] == [1, 2]
    for tag in (
        "rollout/reward_mean",
        "time/train_s",
        "time/weight_sync_s",
        "time/model_call_s",
        "throughput/generated_tokens_per_s",
        "engine/busy_fraction",
        "engine/host_gap_fraction",
        "engine/idle_fraction",
        "learner/clip_fraction",
        "eval/success_fraction",
        "sft/loss",
    ):
        assert tag in scalars, tag
    for step in range(2):  # the engine's time in the step, split three ways
        parts = [scalars[f"engine/{k}_fraction"][step][1] for k in ("busy", "host_gap", "idle")]
        assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(1, abs=1e-5)
    assert (run_dir / "checkpoints" / "2").is_dir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success_after"] == result.success_after
    # What the agent did: a few episodes per RL step and per evaluation, readable by `show`.
    kept = sorted(p.name for p in (run_dir / "transcripts").iterdir())
    assert kept == [
        *(f"heldout_00000{s}.jsonl" for s in (0, 2)),
        "step_000001.jsonl",
        "step_000002.jsonl",
    ]
    assert main(["show", str(run_dir), "--step", "2"]) == 0
    # The held-out evaluations before and after RL keep the same tasks' episodes.
    from tunix_agentic.rollout.transcripts import read_records

    before, after = ([r["task_id"] for r in read_records(run_dir, "heldout", s)] for s in (0, 2))
    assert before and before == after
    texts = read_texts(run_dir / "tensorboard")
    assert {"transcripts/train", "transcripts/heldout"} <= set(texts)
    assert "=== train step 1 | episode" in texts["transcripts/train"][0][1]

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
        # NaN passes every range check: each float is checked finite by name.
        ("learner.optimizer.learning_rate=inf", "optimizer.learning_rate"),
        ("learner.clip_high=nan", "learner.clip_high"),
        ("learner.kl_coef=nan", "learner.kl_coef"),
        ("model.rope_theta=nan", "model.rope_theta"),
        ("model.rope_theta=-5", "model.rope_theta"),
        ("model.norm_eps=-1", "model.norm_eps"),
        ("model.norm_eps=nan", "model.norm_eps"),
        ("rollout.reward_limit=nan", "rollout.reward_limit"),
    ],
    ids=[
        "unknown_key",
        "bad_value",
        "bad_type",
        "lr_inf",
        "clip_high_nan",
        "kl_coef_nan",
        "rope_theta_nan",
        "rope_theta_negative",
        "norm_eps_negative",
        "norm_eps_nan",
        "reward_limit_nan",
    ],
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
    """The README's main job, shortened (1,500 SFT steps, as the recipe had until seed 7
    needed 2,000; 30 RL steps): held-out success must rise clearly."""
    result = train(
        CONFIG,
        [
            f"run_dir={tmp_path / 'run'}",
            "sft.steps=1500",
            "sft.optimizer.decay_steps=1450",
            "rl.steps=30",
            "rl.eval_tasks=100",
        ],
        progress=False,
    )
    assert result.success_after >= result.success_before + 0.3
    assert result.success_after >= 0.8


class _ResetFails(ArithmeticEnv):
    async def reset(self, task):
        raise ConnectionError("sandbox image missing")


register_env("_test_reset_fails", tasks=ArithmeticTasks())(_ResetFails)


def test_a_failing_run_closes_everything_and_shows_its_traceback(tmp_path):
    """Engine closed, every event on disk, and not turned into a one-line config error."""
    overrides = [
        *TINY_RUN,
        f"run_dir={tmp_path / 'run'}",
        "env.name=_test_reset_fails",
        "rollout.max_infra_failures_in_a_row=4",
    ]
    trainer = Trainer(load_config(CONFIG, overrides), progress=False)
    with pytest.raises(InfraFailureError, match="sandbox image missing"):
        trainer.run()
    assert trainer.engine.health()["ok"] is False  # closed
    # The writer flushes every 10 s; the last SFT scalar is there only because it was closed.
    sft = read_scalars(tmp_path / "run" / "tensorboard")["sft/loss"]
    assert sft[-1][0] == 29
    with pytest.raises(InfraFailureError):  # the CLI lets it through: traceback, exit 1
        main(
            [
                "train",
                "--quiet",
                "--config",
                CONFIG,
                *overrides[:-2],
                f"run_dir={tmp_path / 'b'}",
                *overrides[-2:],
            ]
        )


@pytest.mark.parametrize(
    "override,names",
    [
        ("env.name=nosuch", "arithmetic"),
        ("learner.advantage=nosuch", "dr_grpo"),
        ("learner.aggregation=nosuch", "token_mean"),
        ("agent.parser=nosuch", "qwen3"),
        ("agent.context_rule=nosuch", "append_only"),
        ("agent.top_k=1099511627776", "vocab_size"),
        ("agent.temperature=1e309", "finite"),
    ],
    ids=["env", "advantage", "aggregation", "parser", "context_rule", "top_k", "temperature"],
)
def test_names_and_sampling_values_are_checked_at_config_load(override, names, capsys):
    """Before: env.name=nosuch ran SFT for minutes, then waited forever."""
    assert main(["train", "--config", CONFIG, override]) == 2
    err = capsys.readouterr().err
    assert "error" in err and override.split("=")[0].split(".")[-1] in err and names in err


async def test_a_run_inside_a_running_event_loop_stops_cleanly_on_interrupt(tmp_path):
    """As in a notebook: run() is called while an event loop runs on this thread. The
    run gets its own thread; interrupting the kernel (SIGINT to the main thread) stops it
    like Ctrl-C: the last finished step is checkpointed and RunInterrupted is raised."""
    import signal
    import threading
    import time

    from tunix_agentic.trainer import RunInterrupted

    run_dir = tmp_path / "nb"
    cfg = load_config(
        CONFIG,
        [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "rl.steps=500", f"run_dir={run_dir}"],
    )
    main_thread = threading.main_thread().ident

    def interrupt_once_rl_runs():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if (run_dir / "checkpoints" / "0").exists():  # the warm start is saved: RL runs
                time.sleep(1.0)
                signal.pthread_kill(main_thread, signal.SIGINT)
                return
            time.sleep(0.05)

    threading.Thread(target=interrupt_once_rl_runs, daemon=True).start()
    # As ipykernel does while a cell runs: SIGINT raises KeyboardInterrupt where the main
    # thread is (asyncio's runner would instead cancel its task at the next await).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(RunInterrupted) as info:
            Trainer(cfg, progress=False).run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert info.value.exit_code == 130 and info.value.step is not None
    assert (run_dir / "checkpoints" / str(info.value.step)).exists()
