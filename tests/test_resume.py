"""A run is never lost: periodic checkpoints, signals, exact resume, failed resumes.

The signal and kill tests run the real CLI in a subprocess, as a user (or a
TPU-VM's pre-emption) would stop it.
"""

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.learners.state import make_optimizer
from tunix_agentic.metrics import read_scalars
from tunix_agentic.models.transformer import Transformer
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


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
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
