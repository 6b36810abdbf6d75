"""``tunix-agentic report``: the verdict on exact figures, and the report of short real runs,
whose verdict turns tool-bound when a tool is made slow."""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from pathlib import Path

import matplotlib.image
import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.report import (
    Figures,
    SpanFigure,
    extract_figures,
    load_run,
    verdict,
    write_report,
)
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import train

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs" / "calculator_tiny.yaml")
PICTURES = ("reward", "step_time", "engine", "latency")
# Short runs: the first RL step compiles and is left out of the figures, so two. The
# learner trains one length bucket (one compile), and rollouts wait for the new weights
# (max_staleness 0), so the learner's wait for a batch is the whole rollout.
RUN = [
    *TINY_RUN_OVERRIDES,
    "sft.steps=4",
    "rl.steps=2",
    "rl.eval_tasks=0",
    "rl.checkpoint_every=0",
    "rollout.max_staleness=0",
    "learner.length_bucket=128",
    "agent.max_turns=2",
]
SLOW_S = 8.0  # each step of the slow environment calls its "lookup" tool, which sleeps this

# A rollout-bound step (the learner waits 6 of 8 s) with the episodes' time split four ways.
BASE = Figures(
    steps=10,
    step_s=8.0,
    wait_s=6.0,
    train_s=1.5,
    sync_s=0.1,
    busy=0.9,
    host_gap=0.05,
    idle=0.05,
    init_s=1.0,
    model_s=20.0,
    reward_s=0.5,
    init_p95=0.2,
    model_p95=1.2,
    reward_p95=0.1,
    tools=(SpanFigure("calculator", 0.3, 0.01),),
)


@pytest.mark.parametrize(
    "figures, kind, quoted",
    [
        (
            BASE,
            "generation-bound",
            ["busy 90 %", "p95 1.2 s", "waited 75 %", "agent.max_new_tokens"],
        ),
        (
            dataclasses.replace(BASE, busy=0.4, host_gap=0.3, idle=0.3),
            "host-bound",
            ["host gap 43 % of the engine's working time", "engine.decode_steps"],
        ),
        (
            dataclasses.replace(BASE, tools=(SpanFigure("bash", 60.0, 4.1),)),
            "tool-bound",
            ["'bash' took 4.1 s per call (p95)", "'bash' took 74 %", "env.tool_timeout_s"],
        ),
        (
            dataclasses.replace(
                BASE, init_s=50.0, init_p95=3.0, startup=(SpanFigure("sandbox_start", 45, 2.5),)
            ),
            "startup-bound",
            ["INIT) p95 3 s", "sandbox_start p95 2.5 s", "rollout.init_workers"],
        ),
        (
            dataclasses.replace(BASE, reward_s=40.0, reward_p95=2.0),
            "reward-bound",
            ["(EVAL) p95 2 s", "rollout.eval_workers"],
        ),
        (
            dataclasses.replace(BASE, wait_s=0.4, train_s=7.0, idle=0.46),
            "learner-bound",
            ["idle 46 % of RL time", "train step took 7 s (88 %", "rollout.max_staleness"],
        ),
        (
            dataclasses.replace(BASE, wait_s=0.4, train_s=7.0, train_p50_s=1.0, train_max_s=30.0),
            "learner-bound",
            ["1 s at the median but up to 30 s", "learner.length_bucket"],
        ),
        (
            dataclasses.replace(BASE, wait_s=0.4, train_s=2.0, sync_s=5.0),
            "weight-sync-bound",
            ["weight sync took 5 s per RL step (62 %", "rollout.max_staleness"],
        ),
        (
            dataclasses.replace(BASE, steps=0, step_s=0.0),
            "no-data",
            ["no timed RL step"],
        ),
    ],
    ids=[
        "generation",
        "host",
        "tool",
        "startup",
        "reward",
        "learner",
        "learner-compiles",
        "weight-sync",
        "no-data",
    ],
)
def test_verdict_names_the_bottleneck_with_its_figures(figures, kind, quoted):
    found = verdict(figures)
    assert found.kind == kind
    for words in quoted:
        assert words in found.text, (words, found.text)
    assert (found.tool == "bash") == (kind == "tool-bound")


def test_mean_per_call_stands_in_for_a_missing_p95():
    fig = dataclasses.replace(BASE, tools=(SpanFigure("bash", 60.0, 2.0, quantile="mean"),))
    assert "'bash' took 2 s per call (mean)" in verdict(fig).text


@pytest.mark.parametrize(
    "make, problem",
    [
        (lambda p: p / "absent", "is not a directory"),
        (lambda p: p, "metrics.jsonl does not exist"),
        (lambda p: _metrics(p, ""), "holds no RL step"),
        (lambda p: _metrics(p, '{"step": 0, "sft/loss": 1.0}\n'), "holds no RL step"),
        (lambda p: _metrics(p, "not json\n"), "metrics.jsonl:1 is not a metrics line"),
    ],
    ids=["missing", "no-metrics", "empty", "sft-only", "garbage"],
)
def test_bad_run_dir_is_refused_naming_the_path(tmp_path, capsys, make, problem):
    run_dir = make(tmp_path)
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert problem in err and str(run_dir) in err
    assert not (Path(run_dir) / "report").exists()


def _metrics(run_dir: Path, text: str) -> Path:
    (run_dir / "tensorboard").mkdir()
    (run_dir / "tensorboard" / "metrics.jsonl").write_text(text)
    return run_dir


@pytest.fixture(scope="module")
def tiny_run(observed_run, tmp_path_factory) -> Path:
    """The shared short run (tests/conftest.py), copied: reports are written into it."""
    run_dir = tmp_path_factory.mktemp("report") / "run"
    shutil.copytree(observed_run, run_dir)
    return run_dir


def _real_png(path: Path) -> None:
    assert path.is_file() and path.stat().st_size > 0, path
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100, path


def test_report_of_a_real_run_writes_every_picture_and_the_verdict(tiny_run, capsys):
    assert main(["report", str(tiny_run)]) == 0
    printed = capsys.readouterr().out
    out = tiny_run / "report"
    for name in PICTURES:
        _real_png(out / f"{name}.png")
    text = (out / "report.md").read_text()
    found = verdict(extract_figures(load_run(tiny_run)))
    assert f"## Verdict: {found.kind}" in text and found.kind in printed
    # The learning verdict first, as the docs give them; one label each.
    assert printed.index("does it learn? ") < printed.index("what holds it back? ")
    assert "learning: learning" not in printed
    assert found.kind != "no-data"
    for name in PICTURES:
        assert f"]({name}.png)" in text
    assert list((tiny_run / "trace").glob("*.json.gz"))  # the run's trace: the Gantt chart
    _real_png(out / "episodes.png")
    assert "](episodes.png)" in text


def test_report_out_folder_and_a_run_without_percentiles(tiny_run, tmp_path):
    """``--out`` elsewhere, and a run written before percentiles existed (its latency/*
    lines dropped) is reported from the per-call means."""
    old = tmp_path / "old_run"
    (old / "tensorboard").mkdir(parents=True)
    with (tiny_run / "tensorboard" / "metrics.jsonl").open() as f:
        rows = [json.loads(line) for line in f]
    stripped = [{k: v for k, v in r.items() if not k.startswith("latency/")} for r in rows]
    (old / "tensorboard" / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in stripped)
    )
    assert main(["report", str(old), "--out", str(tmp_path / "elsewhere")]) == 0
    assert not (old / "report").exists()
    for name in PICTURES:
        _real_png(tmp_path / "elsewhere" / f"{name}.png")
    text = (tmp_path / "elsewhere" / "report.md").read_text()
    assert f"`episodes.png` not drawn: no trace in {old / 'trace'}" in text
    assert extract_figures(load_run(old)).quantile == "mean"
    assert "| mean per call or episode (s) |" in text


@pytest.mark.slow
def test_a_slow_tool_turns_the_verdict_tool_bound(tiny_run, tmp_path):
    (tmp_path / "slow_lookup_env.py").write_text(
        textwrap.dedent(
            f"""
            import asyncio, dataclasses, time

            from tunix_agentic.envs import register_env
            from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks

            @register_env("slow_lookup_arithmetic", tasks=ArithmeticTasks())
            class SlowLookup(ArithmeticEnv):
                # Every step also consults a slow "lookup" tool.
                async def step(self, action):
                    t = time.perf_counter()
                    await asyncio.sleep({SLOW_S})
                    call = {{"name": "lookup", "seconds": time.perf_counter() - t, "error": False}}
                    result = await super().step(action)
                    calls = [*result.info.get("tool_calls", []), call]
                    return dataclasses.replace(result, info={{**result.info, "tool_calls": calls}})
            """
        )
    )
    before = verdict(extract_figures(load_run(tiny_run)))
    slow_dir = tmp_path / "slow"
    train(
        CONFIG,
        [
            *RUN,
            f"env.import={tmp_path / 'slow_lookup_env.py'}",
            "env.name=slow_lookup_arithmetic",
            f"run_dir={slow_dir}",
        ],
        progress=False,
    )
    after = write_report(slow_dir).verdict
    assert before.kind != "tool-bound"
    assert after.kind == "tool-bound" and after.tool == "lookup", after.text
    assert "'lookup' took" in after.text
    assert "tool-bound" in (slow_dir / "report" / "report.md").read_text()
