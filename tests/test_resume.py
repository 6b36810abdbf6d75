"""A run is never lost: periodic checkpoints, signals, exact resume, failed resumes.

The signal and kill tests run the real CLI in a subprocess, as a user (or a
TPU-VM's pre-emption) would stop it.
"""

import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.envs.base import register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.learners.grpo import GRPOLearner
from tunix_agentic.learners.state import make_optimizer
from tunix_agentic.metrics import read_scalars
from tunix_agentic.models.transformer import Transformer
from tunix_agentic.resume import logged_after
from tunix_agentic.rollout.episode import InfraFailureError
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import train

REPO = Path(__file__).parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
TINY = list(TINY_RUN_OVERRIDES)


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_a_failed_resume_changes_nothing_and_names_the_key(tmp_path):
    run = tmp_path / "run"
    train(CONFIG, [*TINY, "rl.steps=1", f"run_dir={run}"], progress=False)
    before = snapshot(run)
    with pytest.raises(
        ConfigError, match=r"model\.d_model=64 does not match the checkpoint \(32\)"
    ):
        train(None, ["model.d_model=64"], resume_dir=str(run), progress=False)
    assert snapshot(run) == before
    resumed = train(None, ["rl.steps=2"], resume_dir=str(run), progress=False)  # still resumable
    assert len(resumed.history) == 1
    steps = [s for s, _ in read_scalars(run / "tensorboard")["learner/loss"]]
    assert steps == [1, 2]


def test_periodic_checkpoints_keep_the_newest(tmp_path):
    run = tmp_path / "run"
    train(
        CONFIG,
        [*TINY, "rl.steps=4", "rl.checkpoint_every=1", "rl.keep_checkpoints=2", f"run_dir={run}"],
        progress=False,
    )
    assert Checkpointer(run / "checkpoints").all_steps() == [3, 4]


def test_the_shipped_config_checkpoints_every_10_steps_or_more_often():
    cfg = load_config(CONFIG)
    assert 1 <= cfg.rl.checkpoint_every <= 10


# ------------------------------------------------------------ real processes
def _cli(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tunix_agentic", "train", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )


def _wait_for_step(proc: subprocess.Popen, run: Path, step: int, timeout: float = 240) -> None:
    """Until ``metrics.jsonl`` holds RL step ``step`` (the process must still be running)."""
    log = run / "tensorboard" / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        if log.exists():
            for line in log.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if "learner/loss" in row and row["step"] >= step:
                    return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"step {step} never came")


def _params(run: Path, step: int):
    cfg = load_config(run / "config.yaml")
    params = nnx.state(Transformer(cfg.model, rngs=nnx.Rngs(0)), nnx.Param)
    opt = make_optimizer(cfg.learner.optimizer).init(params)
    ckpt = Checkpointer(run / "checkpoints")
    try:
        restored, _, meta, _ = ckpt.restore(params, opt, step)
    finally:
        ckpt.close()
    return [np.asarray(x) for x in jax.tree.leaves(restored)], meta


# SIGINT (Ctrl-C) goes through the same handler as SIGTERM: CI runs SIGTERM's case; SIGINT's
# runs by hand with `python -m pytest -m heavy tests/test_resume.py`.
@pytest.mark.slow
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, pytest.param(signal.SIGINT, marks=pytest.mark.heavy)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_checkpoints_the_last_finished_step_and_exits_cleanly(tmp_path, sig):
    run = tmp_path / "run"
    proc = _cli(
        ["--config", CONFIG, *TINY, "rl.steps=200", "rl.checkpoint_every=0", f"run_dir={run}"]
    )
    _wait_for_step(proc, run, 2)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig  # 143 / 130
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"interrupted at step (\d+); resume with: tunix-agentic train --resume {re.escape(str(run))}",
        last,
    )
    assert match, last
    step = int(match.group(1))
    assert step >= 2 and Checkpointer(run / "checkpoints").latest_step() == step
    logged = [s for s, _ in read_scalars(run / "tensorboard")["learner/loss"]]
    assert logged == list(range(1, step + 1))  # everything up to the checkpoint is on disk

    resumed = _cli(["--resume", str(run), f"rl.steps={step + 1}"])
    out, err = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, err[-3000:]
    assert "resumed from step" in err and "starting fresh" not in err
    assert f"{step + 1}/{step + 1}" in err and " 1/1 " not in err  # the bar shows the whole run
    assert out.startswith("held-out success:")
    logged = [s for s, _ in read_scalars(run / "tensorboard")["learner/loss"]]
    assert logged == list(range(1, step + 2))


@pytest.mark.slow
def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path):
    """kill -9 mid-RL, resume: the same tasks, parameters and losses as a run never killed."""
    common = [*TINY, "rl.steps=6", "rl.checkpoint_every=2", "rl.keep_checkpoints=5"]
    common += ["rollout.max_staleness=0"]  # each batch sampled by one policy: exactly repeatable
    whole = tmp_path / "whole"
    train(CONFIG, [*common, f"run_dir={whole}"], progress=False)

    killed = tmp_path / "killed"
    proc = _cli(["--config", CONFIG, *common, f"run_dir={killed}"])
    _wait_for_step(proc, killed, 3)  # past checkpoint 2: something to redo and to drop
    proc.kill()
    proc.wait()
    saved = Checkpointer(killed / "checkpoints").latest_step()
    assert saved is not None and 2 <= saved < 6
    at_kill = _params(killed, saved)
    want = _params(whole, saved)
    for a, b in zip(at_kill[0], want[0], strict=True):
        np.testing.assert_array_equal(a, b)
    # The task stream's position at the checkpoint is the uninterrupted run's.
    assert at_kill[1]["rollout"] == want[1]["rollout"]

    resumed = train(None, [], resume_dir=str(killed), progress=False)
    assert len(resumed.history) == 6 - saved
    for a, b in zip(_params(killed, 6)[0], _params(whole, 6)[0], strict=True):
        np.testing.assert_array_equal(a, b)
    for tag in ("learner/loss", "rollout/reward_mean", "rollout/generated_tokens"):
        got, exp = (
            read_scalars(killed / "tensorboard")[tag],
            read_scalars(whole / "tensorboard")[tag],
        )
        assert got == exp, tag  # same steps once each, same values
    lines = [
        json.loads(x) for x in (killed / "tensorboard" / "metrics.jsonl").read_text().splitlines()
    ]
    rl_steps = [row["step"] for row in lines if "learner/loss" in row]
    assert rl_steps == [1, 2, 3, 4, 5, 6]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["seconds"] >= at_kill[1]["elapsed_s"]  # the clock covers the whole run


# ------------------------------------------------------- a run that stops on an error
class _FailsAfterStep2(ArithmeticEnv):
    """Resets raise once RL step 2 is logged in ``log`` (the sandbox host went away)."""

    log: Path | None = None

    async def reset(self, task):
        log = type(self).log
        if log is not None and _rl_steps(log.read_text() if log.exists() else "")[-1:] >= [2]:
            raise ConnectionError("sandbox host lost")
        return await super().reset(task)


register_env("_test_fails_after_step_2", tasks=ArithmeticTasks())(_FailsAfterStep2)


def _rl_steps(jsonl: str) -> list[int]:
    """The RL steps logged in a ``metrics.jsonl`` text, in order (cut lines skipped)."""
    steps = []
    for line in jsonl.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "learner/loss" in row:
            steps.append(row["step"])
    return steps


FAST = [*TINY, "engine.max_seq_len=128", "sft.steps=0", "rl.eval_tasks=0"]


def test_a_run_stopped_by_an_error_checkpoints_its_last_finished_step(tmp_path):
    """Before: only a signal saved the last finished step; a run stopped by an error kept
    checkpoint 0 (rl.checkpoint_every=0) and lost every step. Now the step is saved, and
    resume picks it up."""
    run = tmp_path / "run"
    _FailsAfterStep2.log = run / "tensorboard" / "metrics.jsonl"
    overrides = [*FAST, "rl.steps=50", "rl.checkpoint_every=0", f"run_dir={run}"]
    overrides += ["env.name=_test_fails_after_step_2", "rollout.max_infra_failures_in_a_row=4"]
    overrides += ["rollout.infra_backoff_s=0.05"]
    try:
        with pytest.raises(InfraFailureError, match="sandbox host lost"):
            train(CONFIG, overrides, progress=False)
    finally:
        _FailsAfterStep2.log = None
    done = _rl_steps(_jsonl(run))
    assert done[-1] >= 2 and done == list(range(1, done[-1] + 1))
    assert Checkpointer(run / "checkpoints").latest_step() == done[-1]

    resumed = train(None, [f"rl.steps={done[-1] + 1}"], resume_dir=str(run), progress=False)
    assert len(resumed.history) == 1
    assert _rl_steps(_jsonl(run)) == list(range(1, done[-1] + 2))


def test_a_run_whose_train_step_failed_keeps_its_last_written_checkpoint(
    tmp_path, monkeypatch, caplog
):
    """Not a half-applied step: a train step that raised may have consumed the learner's
    state, so the step before it is not saved from that state; the run says so."""
    calls = itertools.count(1)
    real = GRPOLearner.train_step

    def train_step(self, batch, **kw):
        if next(calls) == 2:
            raise FloatingPointError("the loss is nan")
        return real(self, batch, **kw)

    monkeypatch.setattr(GRPOLearner, "train_step", train_step)
    run = tmp_path / "run"
    with (
        caplog.at_level(logging.WARNING, logger="tunix_agentic.trainer"),
        pytest.raises(FloatingPointError),
    ):
        train(
            CONFIG, [*FAST, "rl.steps=5", "rl.checkpoint_every=0", f"run_dir={run}"], progress=False
        )
    assert _rl_steps(_jsonl(run)) == [1]
    assert Checkpointer(run / "checkpoints").all_steps() == [0]
    assert any("step 2 did not finish" in r.getMessage() for r in caplog.records)


def _jsonl(run: Path) -> str:
    return (run / "tensorboard" / "metrics.jsonl").read_text()


# ------------------------------------------ unreadable checkpoints, records by step
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A tiny run of 2 RL steps with checkpoints 0, 1 and 2, and evaluations at 0 and 2."""
    run = tmp_path_factory.mktemp("finished") / "run"
    overrides = [*TINY, "engine.max_seq_len=128", "sft.steps=5", "rl.eval_tasks=1"]
    overrides += ["rl.steps=2", "rl.checkpoint_every=1", "rl.keep_checkpoints=3"]
    train(CONFIG, [*overrides, f"run_dir={run}"], progress=False)
    assert Checkpointer(run / "checkpoints").all_steps() == [0, 1, 2]
    return run


def _tag_steps(run: Path) -> dict[str, list[int]]:
    scalars = read_scalars(run / "tensorboard")
    return {
        tag: [s for s, _ in scalars[tag]]
        for tag in ("sft/loss", "eval/success_fraction", "learner/loss")
    }


def test_a_resume_falls_back_past_an_unreadable_newest_checkpoint(finished_run, tmp_path, caplog):
    """Before: a corrupted newest checkpoint failed the resume. Now it resumes from the
    one before, says so, and sets the unreadable one aside."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    for f in (run / "checkpoints" / "2" / "params").rglob("*"):
        if f.is_file():
            f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])  # truncated by a crash
    with caplog.at_level(logging.WARNING, logger="tunix_agentic.resume"):
        resumed = train(None, ["rl.steps=3"], resume_dir=str(run), progress=False)
    (warning,) = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert re.search(
        r"checkpoint 2 of .* is unreadable \(\w+.*\): resuming from checkpoint 1", warning
    )
    assert len(resumed.history) == 2  # steps 2 and 3 redone / done
    assert _tag_steps(run) == {
        "sft/loss": [0, 4],
        "eval/success_fraction": [0, 3],
        "learner/loss": [1, 2, 3],
    }
    assert (run / "checkpoints_unreadable" / "2" / "params").is_dir()
    assert Checkpointer(run / "checkpoints").all_steps() == [1, 2, 3]


def _set_wall_times(log_dir: Path, wall_time) -> None:
    """Rewrite every record's wall time to ``wall_time(step, tags)`` (another clock)."""
    jsonl = log_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for row in rows:
        row["wall_time"] = wall_time(row["step"], set(row) - {"step", "wall_time"})
    jsonl.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for events in log_dir.glob("*tfevents*"):
        records = []
        for raw in event_file_loader.RawEventFileLoader(str(events)).Load():
            event = event_pb2.Event.FromString(raw)
            if event.HasField("summary"):
                event.wall_time = wall_time(event.step, {v.tag for v in event.summary.value})
            records.append(event.SerializeToString())
        with open(events, "wb") as f:
            writer = RecordWriter(f)
            for record in records:
                writer.write(record)


def test_a_resume_drops_records_by_step_whatever_their_wall_time(finished_run, tmp_path):
    """Killed before checkpoint 2 was written, on a host whose clock then jumped: what was
    logged up to checkpoint 1 carries a wall time past the checkpoint's, and step 2 one
    before it. Before: the former were dropped (SFT, step 1 and the first evaluation lost)
    and the latter kept (step 2 twice). Now the step decides."""
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    shutil.rmtree(run / "checkpoints" / "2")
    ahead, behind = time.time() + 10**6, 10**9

    def wall_time(step, tags):
        redone = step == 2 and not any(t.startswith("sft/") for t in tags)
        return behind if redone else ahead

    _set_wall_times(run / "tensorboard", wall_time)
    resumed = train(None, [], resume_dir=str(run), progress=False)
    assert len(resumed.history) == 1
    assert _tag_steps(run) == {
        "sft/loss": [0, 4],
        "eval/success_fraction": [0, 2],
        "learner/loss": [1, 2],
    }
    assert _rl_steps((run / "tensorboard" / "metrics.jsonl").read_text()) == [1, 2]


def test_logged_after_decides_by_step_and_phase():
    late = logged_after(3)
    assert not late(29, frozenset({"sft/loss"}))  # SFT steps precede every checkpoint
    assert not late(0, frozenset({"eval/success_fraction"}))  # the evaluation before RL
    assert not late(3, frozenset({"learner/loss"}))
    assert late(4, frozenset({"learner/loss"}))
    assert late(
        3, frozenset({"eval/success_fraction"})
    )  # the final evaluation follows checkpoint 3
    assert not logged_after(0)(0, frozenset({"eval/success_fraction"}))
    assert logged_after(None)(0, frozenset({"sft/loss"}))  # no checkpoint: all is redone
