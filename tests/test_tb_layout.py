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

import pytest

from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.metrics.layout import (
    RUN_LAYOUT,
    layout_summary_value,
    run_layout,
    visible_range,
    write_layout,
)

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


def _matched_tags(base: str, regex: str) -> set[str]:
    """The tags of run "." a custom-scalars chart line draws, as the server resolves them."""
    got = _get(base, "/data/plugin/custom_scalars/scalars", run=".", tag=regex)
    assert got["regex_valid"], regex
    return set(got["tag_to_events"])


def _charts(base: str) -> dict[str, list[str]]:
    """``{chart title: its regexes}`` of the layout the server serves (titles unique)."""
    layout = _get(base, "/data/plugin/custom_scalars/layout")
    assert [c["title"] for c in layout["category"]] == [title for title, _ in RUN_LAYOUT]
    titles = [chart["title"] for category in layout["category"] for chart in category["chart"]]
    assert len(titles) == len(set(titles)) == sum(len(charts) for _, charts in RUN_LAYOUT)
    return {
        chart["title"]: chart["multiline"]["tag"]
        for category in layout["category"]
        for chart in category["chart"]
    }


def test_layout_served_by_tensorboard_and_its_regexes_pick_the_right_tags(tmp_path):
    # The names a run writes (see the naming contract), on a recorder of our own.
    with MetricsRecorder(tmp_path) as rec:
        write_layout(rec)
        for name in ("tool/bash", "tool/python", "env/sandbox_start", "episode", "stage/eval"):
            rec.add_time(name, 0.5)
        rec.add_time("stage/run", 1.0)
        rec.add_time("train", 0.2)
        rec.gauge("queue/ready_groups", 2)
        rec.gauge("queue/run_waiting", 3)
        rec.gauge("queue/init_running", 1)
        rec.scalars({"eval/success": 0.5, "eval/reward": 0.5, "eval/turns": 2.0}, 0)
        rec.write_step(
            1,
            extra={
                "rollout/reward_mean": 0.5,
                "rollout/reward_mean/calc": 0.25,
                "rollout/success/calc": 1.0,
                "engine/busy_fraction": 0.75,
                "engine/idle_fraction": 0.25,
                "throughput/generated_tokens_per_accelerator_s": 9.0,
                "throughput/step_s": 1.5,
            },
        )
    with _tensorboard(tmp_path) as base:
        charts = _charts(base)
        expected = {
            "reward per task": {"rollout/reward_mean", "rollout/reward_mean/calc"},
            "success per task": {"rollout/success/calc"},
            "share of wall time since RL started": {
                "engine/busy_fraction",
                "engine/idle_fraction",
            },
            "generated tokens per second": {"throughput/generated_tokens_per_accelerator_s"},
            "episode stages (summed over episodes)": {"time/stage/eval_s", "time/stage/run_s"},
            "held-out success and reward": {"eval/success", "eval/reward"},
            "RL step wall seconds and the learner's parts": {"throughput/step_s", "time/train_s"},
            "groups ready and in flight": {
                "gauge/queue/ready_groups",
                "gauge/queue/ready_groups_max",
            },
            "episodes waiting for a stage's workers (last value)": {"gauge/queue/run_waiting"},
            "episodes waiting for a stage's workers (max in the step)": {
                "gauge/queue/run_waiting_max"
            },
            "episodes in a stage's workers (INIT / RUN / EVAL)": {
                "gauge/queue/init_running",
                "gauge/queue/init_running_max",
            },
            "tool calls by tool": {
                f"latency/tool/{t}/p{q}" for t in ("bash", "python") for q in (50, 95, 99)
            },
            "environment start-up (env/<key>)": {
                f"latency/env/sandbox_start/p{q}" for q in (50, 95, 99)
            },
            "episode: admission to reward": {f"latency/episode/p{q}" for q in (50, 95, 99)},
            "reward computation (EVAL)": {f"latency/stage/eval/p{q}" for q in (50, 95, 99)},
        }
        for chart, tags in expected.items():
            (regex,) = charts[chart]
            assert _matched_tags(base, regex) == tags, chart


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


# Charts a run fills only if its episodes call tools or its environments report start-up
# times (the tiny calculator run may do neither): empty exactly when no such span was recorded.
_SPAN_CHARTS = {"tool calls by tool": "time/tool/", "environment start-up (env/<key>)": "time/env/"}


def _values(base: str, regex: str) -> list[float]:
    got = _get(base, "/data/plugin/custom_scalars/scalars", run=".", tag=regex)
    return [value for events in got["tag_to_events"].values() for _, _, value in events]


@pytest.mark.slow
def test_a_tiny_run_writes_percentiles_and_serves_its_layout(observed_run):
    run_dir = observed_run  # tests/conftest.py
    rows = [json.loads(line) for line in (run_dir / "tensorboard" / "metrics.jsonl").open()]
    (step_1,) = [row for row in rows if row["step"] == 1 and "learner/loss" in row]
    for key in (
        "latency/model_call/p95",
        "latency/episode/p50",
        "latency/stage/eval/p99",
        "throughput/generated_tokens_per_accelerator_s",
    ):
        assert isinstance(step_1[key], float) and step_1[key] > 0, key
    assert step_1["latency/episode/p50"] <= step_1["latency/episode/p99"]
    for stage in ("init", "run", "eval"):  # every episode went through each pool
        assert step_1[f"gauge/queue/{stage}_running_max"] >= 1, stage
        assert step_1[f"gauge/queue/{stage}_waiting_max"] >= 0, stage
    written = {key for row in rows for key in row}
    with _tensorboard(run_dir / "tensorboard") as base:
        for chart, regexes in _charts(base).items():
            (regex,) = regexes
            values = _values(base, regex)
            if chart in _SPAN_CHARTS:
                recorded = any(k.startswith(_SPAN_CHARTS[chart]) for k in written)
                assert bool(values) == recorded, chart
                continue
            assert values, f"chart {chart!r}: {regex} matches no tag of the run"
            # Drawn on an axis that holds some of its points under TensorBoard's default
            # outlier trimming (a lone line of two points would show an empty 0-1 axis).
            assert visible_range(values) is not None, f"chart {chart!r} draws nothing visible"


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
