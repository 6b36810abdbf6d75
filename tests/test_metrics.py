"""Tests for tunix_agentic.metrics: real event files read back by TensorBoard's loader."""

import json
import math
import os
import threading
import time

import numpy as np
import pytest

from tunix_agentic.metrics import MetricsRecorder, read_scalars


def _jsonl(log_dir):
    with open(os.path.join(log_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_scalars_round_trip(tmp_path):
    # Values are exact in float32, which is how TensorBoard stores scalars.
    with MetricsRecorder(tmp_path) as rec:
        rec.scalar("loss", 1.5, step=0)
        rec.scalars({"loss": 0.75, "reward/mean": -0.25}, step=1)
        rec.scalar("loss", 0.125, step=5)
        rec.scalar("reward/mean", 2.0, step=3)
        rec.scalar("loss", np.float32(0.5), step=np.int64(2))  # numpy scalars accepted
    got = read_scalars(tmp_path)
    assert got == {
        "loss": [(0, 1.5), (1, 0.75), (2, 0.5), (5, 0.125)],
        "reward/mean": [(1, -0.25), (3, 2.0)],
    }


def test_spans_summed_and_reset(tmp_path):
    # Sums and counts only; the percentiles are tested in test_metrics_percentiles.py.
    with MetricsRecorder(tmp_path, max_samples=0) as rec:
        rec.add_time("rollout", 0.5)
        rec.add_time("rollout", 0.25)
        rec.add_time("train/step", 1.0)
        first = rec.write_step(1)
        rec.add_time("rollout", 2.0)
        second = rec.write_step(2)
        third = rec.write_step(3)
        totals = rec.totals()
    assert first == {
        "time/rollout_s": 0.75,
        "time/rollout_count": 2.0,
        "time/train/step_s": 1.0,
        "time/train/step_count": 1.0,
    }
    # A span not timed in a step writes nothing at that step (no zero to chart).
    assert second == {"time/rollout_s": 2.0, "time/rollout_count": 1.0}
    assert third == {}
    assert totals == {"rollout": 2.75, "train/step": 1.0}
    got = read_scalars(tmp_path)
    assert got["time/rollout_s"] == [(1, 0.75), (2, 2.0)]
    assert got["time/train/step_count"] == [(1, 1.0)]


def test_span_times_the_block():
    rec = MetricsRecorder(None)
    with rec.span("sleep"):
        time.sleep(0.01)
    out = rec.write_step(0)
    assert out["time/sleep_s"] >= 0.01
    assert out["time/sleep_count"] == 1.0


def test_span_recorded_when_block_raises():
    rec = MetricsRecorder(None)
    with pytest.raises(ZeroDivisionError):
        with rec.span("bad"):
            _ = 1 / 0
    out = rec.write_step(0)
    assert out["time/bad_count"] == 1.0
    assert out["time/bad_s"] >= 0.0
    assert "bad" in rec.totals()


def test_counters_are_cumulative(tmp_path):
    with MetricsRecorder(tmp_path) as rec:
        rec.count("episodes")
        rec.count("tokens", 100)
        rec.write_step(0)
        rec.count("episodes")
        rec.count("tokens", 28)
        rec.write_step(1)
        rec.write_step(2)
    got = read_scalars(tmp_path)
    assert got["count/episodes_total"] == [(0, 1.0), (1, 2.0), (2, 2.0)]
    assert got["count/tokens_total"] == [(0, 100.0), (1, 128.0), (2, 128.0)]


def test_gauge_last_and_max():
    rec = MetricsRecorder(None)
    for v in (3.0, 7.0, 2.0):
        rec.gauge("queue", v)
    assert rec.write_step(0) == {"gauge/queue": 2.0, "gauge/queue_max": 7.0}
    # The max restarts from the value the gauge still holds.
    assert rec.write_step(1) == {"gauge/queue": 2.0, "gauge/queue_max": 2.0}
    rec.gauge("queue", 1.0)
    assert rec.write_step(2) == {"gauge/queue": 1.0, "gauge/queue_max": 2.0}
    rec.gauge("queue", 5.0)
    rec.gauge("queue", 4.0)
    assert rec.write_step(3) == {"gauge/queue": 4.0, "gauge/queue_max": 5.0}


def test_jsonl_matches_written_values(tmp_path):
    before = time.time()
    with MetricsRecorder(tmp_path) as rec:
        rec.add_time("gen", 0.1)  # not exact in float32; the JSONL keeps float64
        rec.count("turns", 3)
        rec.gauge("kv/pages", 17)
        first = rec.write_step(10, extra={"loss": 0.3})
        rec.scalar("lr", 1e-4, step=11)
        second = rec.write_step(12)
    lines = _jsonl(tmp_path)
    assert [line["step"] for line in lines] == [10, 11, 12]
    for line in lines:
        assert before <= line["wall_time"] <= time.time()
    assert {k: v for k, v in lines[0].items() if k not in ("step", "wall_time")} == first
    assert lines[0]["time/gen_s"] == 0.1 and lines[0]["loss"] == 0.3
    assert lines[1] == {"step": 11, "wall_time": lines[1]["wall_time"], "lr": 1e-4}
    assert {k: v for k, v in lines[2].items() if k not in ("step", "wall_time")} == second


def test_thread_safety():
    rec = MetricsRecorder(None)
    n_threads, n_adds = 8, 1000

    def work():
        for _ in range(n_adds):
            rec.add_time("op", 0.25)
            rec.count("ops")

    threads = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = rec.write_step(0)
    assert out["time/op_s"] == n_threads * n_adds * 0.25
    assert out["time/op_count"] == n_threads * n_adds
    assert out["count/ops_total"] == n_threads * n_adds
    assert rec.totals() == {"op": n_threads * n_adds * 0.25}


@pytest.mark.parametrize(
    "call",
    [
        lambda rec: rec.scalar("loss", "0.5", step=0),
        lambda rec: rec.scalars({"ok": 1.0, "loss": None}, step=0),
        lambda rec: rec.gauge("loss", "high"),
        lambda rec: rec.count("loss", [1]),
        lambda rec: rec.add_time("loss", b"1"),
        lambda rec: rec.write_step(0, extra={"loss": object()}),
    ],
    ids=["scalar_str", "scalars_none", "gauge_str", "count_list", "add_time_bytes", "extra_obj"],
)
def test_non_numeric_value_raises_type_error(call):
    rec = MetricsRecorder(None)
    with pytest.raises(TypeError, match="'loss'"):
        call(rec)


def test_bad_step_and_reserved_name():
    rec = MetricsRecorder(None)
    with pytest.raises(TypeError, match="step"):
        rec.scalar("loss", 1.0, step=1.5)
    with pytest.raises(ValueError, match="reserved"):
        rec.scalar("wall_time", 1.0, step=0)


def test_non_finite_is_null_in_jsonl(tmp_path):
    with MetricsRecorder(tmp_path) as rec:
        rec.scalars({"a": math.nan, "b": math.inf, "c": 1.0}, step=0)
    (line,) = _jsonl(tmp_path)
    assert line["a"] is None and line["b"] is None and line["c"] == 1.0
    got = read_scalars(tmp_path)
    assert math.isnan(got["a"][0][1])
    assert got["b"] == [(0, math.inf)]


def test_in_memory_mode_writes_no_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with MetricsRecorder(None) as rec:
        rec.scalar("loss", 1.0, step=0)
        rec.count("n")
        assert rec.write_step(0, extra={"x": 2.0}) == {
            "count/n_total": 1.0,
            "count/n_per_step": 1.0,
            "x": 2.0,
        }
        rec.flush()
    assert os.listdir(tmp_path) == []


def test_jsonl_disabled(tmp_path):
    with MetricsRecorder(tmp_path / "run", jsonl=False) as rec:
        rec.scalar("loss", 1.0, step=0)
    files = os.listdir(tmp_path / "run")
    assert len(files) == 1 and files[0].startswith("events.out.tfevents.")
    assert read_scalars(tmp_path / "run") == {"loss": [(0, 1.0)]}


def test_close_is_idempotent(tmp_path):
    rec = MetricsRecorder(tmp_path)
    rec.scalar("loss", 1.0, step=0)
    rec.close()
    rec.close()
    rec.flush()  # no-op once closed
    with pytest.raises(RuntimeError, match="closed"):
        rec.write_step(1)
    assert read_scalars(tmp_path) == {"loss": [(0, 1.0)]}
