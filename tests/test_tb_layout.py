"""The custom-scalars layout, read back through a real `tensorboard` server's HTTP API."""

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tensorboard.plugins.custom_scalar import layout_pb2

from tunix_agentic.metrics import MetricsRecorder, read_scalars
from tunix_agentic.metrics.layout import (
    RUN_LAYOUT,
    LayoutWriter,
    layout_summary_value,
    run_layout,
    visible_range,
)
from tunix_agentic.metrics.recorder import event_runs
from tunix_agentic.metrics.series import ENGINE_PARTS, STEP_PARTS
from tunix_agentic.metrics.units import says_its_unit

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str, **query: str) -> dict:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def _tensorboard(logdir: Path, timeout_s: float = 90.0):
    """A real TensorBoard server on ``logdir``; yields its base URL once the layout is
    served (bounded wait), and is killed afterwards."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir)]
        + ["--port", str(port), "--host", "127.0.0.1", "--load_fast", "false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"tensorboard exited: {proc.stderr.read().decode()[-2000:]}")
            with contextlib.suppress(OSError):
                if _get(base, "/data/plugin/custom_scalars/layout"):  # {} until loaded
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensorboard served no layout within {timeout_s}s")
            time.sleep(0.5)
        yield base
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()


def _runs(base: str) -> list[str]:
    return _get(base, "/data/runs")


def _matched(base: str, regex: str) -> dict[str, list[tuple[int, float]]]:
    """``{"run tag": [(step, value), ...]}`` of every line a custom-scalars chart line draws,
    as the server resolves its regex in each run."""
    out = {}
    for run in _runs(base):
        got = _get(base, "/data/plugin/custom_scalars/scalars", run=run, tag=regex)
        assert got["regex_valid"], regex
        for tag, events in got["tag_to_events"].items():
            out[f"{run} {tag}"] = [(step, value) for _, step, value in events]
    return out


def _charts(base: str) -> dict[str, list[str]]:
    """``{chart title: its regexes}`` of the layout the server serves (titles unique)."""
    layout = _get(base, "/data/plugin/custom_scalars/layout")
    order = [title for title, _ in RUN_LAYOUT]
    served = [c["title"] for c in layout["category"]]
    assert served == [t for t in order if t in served]  # in the layout's order
    titles = [chart["title"] for category in layout["category"] for chart in category["chart"]]
    assert len(titles) == len(set(titles))
    return {
        chart["title"]: chart["multiline"]["tag"]
        for category in layout["category"]
        for chart in category["chart"]
    }


def test_layout_served_by_tensorboard_and_its_regexes_pick_one_line_per_series(tmp_path):
    # The names a run writes (see the naming contract), on a recorder of our own.
    with MetricsRecorder(tmp_path) as rec:
        for name in ("tool/bash", "tool/grep", "episode", "stage/eval"):
            rec.add_time(name, 0.5)
            rec.add_time(name, 1.5)
        rec.add_time("train", 0.2)
        rec.gauge("queue/ready_groups", 2)
        rec.gauge("queue/run_waiting_episodes", 3)
        rec.scalars(
            {
                "eval/success_fraction": 0.5,
                "eval/reward_mean": 0.5,
                "eval/success_fraction/calc": 1.0,
            },
            0,
        )
        rec.write_step(
            1,
            extra={
                "rollout/reward_mean": 0.5,
                "rollout/reward_mean/calc": 0.25,
                "engine/busy_fraction": 0.75,
                "engine/idle_fraction": 0.25,
                "step_time/train_s": 1.0,
                "step_time/generation_s": 0.5,
                "step_time/wall_s": 1.5,
            },
        )
        layouts = LayoutWriter()
        layouts.after_step(rec, 1)
        # A chart whose data first appears at step 2 joins the dashboard then.
        rec.add_time("env/sandbox_start", 0.5)
        rec.add_time("env/sandbox_start", 1.5)
        rec.write_step(2)
        layouts.after_step(rec, 2)
        layouts.after_step(rec, 3)  # nothing new: no layout written
    assert {run for _, run in event_runs(tmp_path)} >= {"layout/2"}
    assert "layout/3" not in {run for _, run in event_runs(tmp_path)}
    with _tensorboard(tmp_path) as base:
        charts = _charts(base)
        step_time, engine = (
            "where did step N's time go? (seconds by part, and the step)",
            ("is the engine waiting? (share of its time in the step)"),
        )
        pcts = ("p50", "p95", "p99")
        expected = {
            step_time: {
                "step_time/train step_time/part_s",
                "step_time/generation step_time/part_s",
                ". step_time/wall_s",
            },
            engine: {"engine/busy engine/time_fraction", "engine/idle engine/time_fraction"},
            "reward (training batches; each task a line)": {
                ". rollout/reward_mean",
                "task/calc rollout/reward_mean",
            },
            "held-out success (each task a line)": {
                ". eval/success_fraction",
                "task/calc eval/success_fraction",
            },
            "held-out reward (each task a line)": {". eval/reward_mean"},
            "groups ready and in flight": {"groups/ready gauge/queue/groups_max"},
            "episodes waiting for a stage's workers": {
                "stage/run gauge/queue/waiting_episodes_max"
            },
            "tool calls (each tool a line per percentile)": {
                f"tool/{t}/{q} latency/tool_ms" for t in ("bash", "grep") for q in pcts
            },
            "environment start-up (env/<key>)": {
                f"env/sandbox_start/{q} latency/env_start_ms" for q in pcts
            },
            "episode: admission to reward": {f"{q} latency/episode_ms" for q in pcts},
            "reward computation (EVAL stage)": {f"{q} latency/stage/eval_ms" for q in pcts},
        }
        # Only the charts with data, each a line per run (a colour per line).
        assert set(charts) == set(expected)
        for chart, lines in expected.items():
            (regex,) = charts[chart]
            assert set(_matched(base, regex)) == lines, chart
        assert _matched(base, charts[step_time][0])["step_time/generation step_time/part_s"] == [
            (1, 0.5)
        ]


def test_layout_value_is_the_plugins_config_tensor():
    value = layout_summary_value(run_layout())
    assert value.tag == "custom_scalars__config__"
    assert value.metadata.plugin_data.plugin_name == "custom_scalars"
    for _, charts in RUN_LAYOUT:
        for _, regexes in charts:
            for regex in regexes:
                re.compile(regex)
    with pytest.raises(TypeError, match="layout_pb2.Layout"):
        layout_summary_value({"category": []})


@pytest.mark.slow
def test_a_tiny_run_writes_percentiles_and_serves_its_layout(observed_run):
    run_dir = observed_run  # tests/conftest.py
    rows = [json.loads(line) for line in (run_dir / "tensorboard" / "metrics.jsonl").open()]
    (step_1,) = [row for row in rows if row["step"] == 1 and "learner/loss" in row]
    for key in (
        "latency/model_call/p95_ms",
        "latency/episode/p50_ms",
        "latency/stage/eval/p99_ms",
        "throughput/generated_tokens_per_accelerator_s",
    ):
        assert isinstance(step_1[key], float) and step_1[key] > 0, key
    assert step_1["latency/episode/p50_ms"] <= step_1["latency/episode/p99_ms"]
    for stage in ("init", "run", "eval"):  # every episode went through each pool
        assert step_1[f"gauge/queue/{stage}_running_episodes_max"] >= 1, stage
        assert step_1[f"gauge/queue/{stage}_waiting_episodes_max"] >= 0, stage
    with _tensorboard(run_dir / "tensorboard") as base:
        assert run_dir.name in _runs(base)  # the run is named after its directory, not "."
        for chart, regexes in _charts(base).items():
            (regex,) = regexes
            values = [v for points in _matched(base, regex).values() for _, v in points]
            assert values, f"chart {chart!r}: {regex} matches no tag of the run"
            # Drawn on an axis that holds some of its points under TensorBoard's default
            # outlier trimming; a line of two distinct points (a figure of each of this
            # run's two RL steps, alone in its chart) keeps neither, as in any 2-step run.
            if len(values) > 2:
                assert visible_range(values) is not None, f"chart {chart!r} draws nothing"


@pytest.mark.parametrize(
    "values, expected",
    [
        ([7.45, 0.1], None),  # two distinct points: both trimmed
        ([0.5, 0.5], (0.5, 0.5)),
        ([0.0, 1.0, 0.0, 1.0], (0.0, 1.0)),
        ([0.0] + [1.0] * 18 + [9.0], (1.0, 1.0)),  # the extremes trimmed
        ([float("nan")], None),
    ],
    ids=["two-points", "flat", "two-lines", "outliers", "nan"],
)
def test_visible_range_follows_tensorboards_outlier_trimming(values, expected):
    assert visible_range(values) == expected


def _read_runs(log_dir: Path) -> tuple[dict[str, dict[str, list]], layout_pb2.Layout, set[str]]:
    """Every run's scalars ``{run: {tag: [(step, value)]}}`` (runs by their directory
    under ``log_dir``, as TensorBoard names them), the layout and the text tags, all read
    with TensorBoard's own loader."""
    from tensorboard.backend.event_processing import event_accumulator

    runs, layout, texts = {}, None, set()
    for directory, _ in event_runs(log_dir):
        acc = event_accumulator.EventAccumulator(
            directory, size_guidance={"scalars": 0, "tensors": 0}
        )
        acc.Reload()
        name = str(Path(directory).relative_to(log_dir))
        runs[name] = {
            tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]
        }
        for tag in acc.Tags()["tensors"]:
            if tag == "custom_scalars__config__":  # each run's first, merged as TensorBoard does
                value = acc.Tensors(tag)[0].tensor_proto.string_val[0]
                layout = _merged(layout, layout_pb2.Layout.FromString(value))
            else:
                texts.add(tag)
    return runs, layout, texts


def _merged(layout: layout_pb2.Layout | None, more: layout_pb2.Layout) -> layout_pb2.Layout:
    """``more``'s charts added to ``layout``'s categories of the same title (new ones at the
    end): the custom-scalars plugin's merge of the runs' layouts."""
    if layout is None:
        return more
    by_title = {c.title: c for c in layout.category}
    for category in more.category:
        if category.title in by_title:
            by_title[category.title].chart.extend(category.chart)
        else:
            layout.category.add().CopyFrom(category)
    return layout


@pytest.mark.slow
def test_a_tiny_run_reads_at_a_glance(observed_run):
    """The dashboards' contract, on a real run read back as TensorBoard reads it."""
    run_dir = observed_run  # tests/conftest.py: 2 RL steps, version 1 evaluated beside
    runs, layout, texts = _read_runs(run_dir / "tensorboard")
    own = runs[run_dir.name]  # the run is named after its directory
    assert "config/resolved" in texts  # the resolved config as a text card
    assert "_hparams_/session_start_info" in texts  # and as HParams (tests/test_hparams.py)
    # A colour per line: no chart draws two tags of one run, and none is empty.
    assert [c.title for c in layout.category][:3] == [
        "Step time and throughput",
        "Reward and success",
        "Learner health: is the policy collapsing?",
    ]
    for category in layout.category:
        for chart in category.chart:
            lines = 0
            for name, tags in runs.items():
                drawn = [t for t in tags if any(re.search(r, t) for r in chart.multiline.tag)]
                assert len(drawn) <= 1, (chart.title, name, drawn)
                lines += sum(len(tags[t]) > 0 for t in drawn)
            assert lines, f"empty chart {chart.title!r}"
    # The step's parts add up to its wall time.
    scalars = read_scalars(run_dir / "tensorboard")
    for step, wall in scalars["step_time/wall_s"]:
        parts = [dict(scalars[f"step_time/{p}_s"])[step] for p in STEP_PARTS]
        assert all(p >= 0 for p in parts) and sum(parts) == pytest.approx(wall, rel=0.05), step
    assert [s for s, _ in scalars["step_time/wall_s"]] == [1, 2]
    # The engine's busy / host gap / idle per step add up to 1.
    for step in (1, 2):
        shares = [dict(scalars[f"engine/{p}_fraction"])[step] for p in ENGINE_PARTS]
        assert sum(shares) == pytest.approx(1.0, abs=0.01), step
    # Every evaluation at the step it measured, with its wall time; the last one included.
    assert [s for s, _ in scalars["eval/wall_s"]] == [0, 1, 2]
    assert [(s, v) for s, v in scalars["eval/version_max"]] == [(0, 0), (1, 1), (2, 2)]
    assert not any(n.startswith(("time/eval_", "latency/eval/")) for n in scalars)
    # The warm start on its own run and axis (SFT steps), and its span at step 0, not 1.
    assert set(runs["/".join((run_dir.name, "sft"))]) == {"sft/loss", "sft/token_accuracy"}
    assert not any(t.startswith("sft/") for t in own)
    assert [s for s, v in scalars["time/sft_s"] if v > 0] == [0]
    # Running totals say so, beside their per-step rates.
    total, per_step = (
        scalars["count/rollout/episodes_total"],
        scalars["count/rollout/episodes_per_step"],
    )
    assert [v for _, v in total] == list(np.cumsum([v for _, v in per_step]))
    # Every tag of every run says its unit, or that it is a share, ratio or count.
    no_unit = {t for tags in runs.values() for t in tags if not says_its_unit(t)}
    assert not no_unit, sorted(no_unit)
    # MFU of each step's training and decoding, against a peak logged once.
    assert len(scalars["perf/peak_flops_per_s"]) == 1 and scalars["perf/peak_flops_per_s"][0][1] > 0
    for name in ("perf/mfu_train", "perf/mfu_decode"):
        assert [s for s, _ in scalars[name]] == [1, 2], name
        assert all(v > 0 for _, v in scalars[name]), name
    # Percentiles only for spans that ran several times a step (not the learner's).
    assert not any(n.startswith(("latency/train/", "latency/weight_sync/")) for n in scalars)
    # Learner health and the RL basics.
    for name in (
        "learner/loss",
        "learner/approx_kl_nats",
        "learner/entropy_nats",
        "learner/grad_norm",
        "learner/clip_fraction",
        "rollout/response_tokens_mean",
        "rollout/response_tokens_max",
        "rollout/truncated_fraction",
        "rollout/staleness_versions_max",
        "perf/peak_host_memory_gib",
        "engine/prefix_cache_hit_fraction",
        "engine/kv_occupancy_fraction",
    ):
        assert [s for s, _ in scalars[name]] == [1, 2], name
