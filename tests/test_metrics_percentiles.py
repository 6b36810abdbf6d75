"""Span percentiles and histograms of MetricsRecorder, read back from real event files."""

import json
import math
import os
import random

import pytest
from tensorboard.backend.event_processing import event_accumulator

from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.metrics.recorder import percentiles


def _histograms(log_dir):
    acc = event_accumulator.EventAccumulator(
        os.fspath(log_dir), size_guidance={event_accumulator.HISTOGRAMS: 0}
    )
    acc.Reload()
    return {tag: acc.Histograms(tag) for tag in acc.Tags()[event_accumulator.HISTOGRAMS]}


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        ([0.25, 0.25], {"p50": 0.25, "p95": 0.25, "p99": 0.25}),
        ([1.0, 3.0], {"p50": 2.0, "p95": 2.9, "p99": 2.98}),
        ([float(i) for i in range(1, 101)], {"p50": 50.5, "p95": 95.05, "p99": 99.01}),
        ([4.0, 1.0, 3.0, 2.0, 5.0], {"p50": 3.0, "p95": 4.8, "p99": 4.96}),
    ],
    ids=["one", "two", "one_to_100", "unsorted_five"],
)
def test_write_step_emits_exact_percentiles(samples, expected):
    rec = MetricsRecorder(None)
    shuffled = list(samples)
    random.Random(1).shuffle(shuffled)
    for s in shuffled:
        rec.add_time("tool/bash", s)
    out = rec.write_step(1)
    got = {k.removeprefix("latency/tool/bash/"): v for k, v in out.items() if "latency/" in k}
    in_ms = {f"{q}_ms": v * 1e3 for q, v in expected.items()}  # written in milliseconds
    assert got == pytest.approx(in_ms, rel=1e-12, abs=1e-9)
    assert percentiles(samples) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    # The existing sums are unchanged beside them.
    assert out["time/tool/bash_s"] == pytest.approx(sum(samples))
    assert out["time/tool/bash_count"] == len(samples)


def test_samples_are_per_step_and_only_for_names_seen_in_the_step(tmp_path):
    with MetricsRecorder(tmp_path) as rec:
        for s in (2.0, 2.0, 0.5, 0.5):
            rec.add_time("model_call" if s > 1 else "stage/eval", s)
        rec.add_time("train", 1.0)  # once in the step: no percentiles
        first = rec.write_step(1)
        for _ in range(2):
            rec.add_time("model_call", 4.0)
        second = rec.write_step(2)
    assert first["latency/model_call/p50_ms"] == 2000 and first["latency/stage/eval/p99_ms"] == 500
    assert not any(k.startswith("latency/train/") for k in first)
    assert first["time/train_s"] == 1.0
    assert second["latency/model_call/p50_ms"] == 4000  # step 1's samples are gone
    assert not any(k.startswith("latency/stage/eval/") for k in second)
    assert "time/stage/eval_s" not in second  # nor its sum: it was not timed in the step
    lines = [json.loads(line) for line in open(tmp_path / "metrics.jsonl", encoding="utf-8")]
    assert lines[1]["latency/model_call/p95_ms"] == 4000  # JSONL: percentiles yes ...
    assert not any(k.startswith("hist/") for line in lines for k in line)  # ... histograms no


def test_histograms_read_back_by_tensorboard(tmp_path):
    values = [0.001 * i for i in range(1, 201)]
    with MetricsRecorder(tmp_path) as rec:
        for v in values:
            rec.add_time("model_call", v)
        rec.add_time("episode", 3.0)
        rec.add_time("episode", 3.0)
        rec.write_step(7)
        rec.add_time("episode", 5.0)
        rec.add_time("episode", 5.0)
        rec.add_time("train", 1.0)  # once in the step: no histogram
        rec.write_step(8)
    hists = _histograms(tmp_path)
    assert set(hists) == {"hist/model_call", "hist/episode"}
    (model_call,) = hists["hist/model_call"]
    h = model_call.histogram_value
    assert model_call.step == 7
    assert (h.num, h.min, h.max) == (200, 0.001, 0.2)
    assert h.sum == pytest.approx(sum(values)) and h.sum_squares == pytest.approx(
        sum(v * v for v in values)
    )
    assert sum(h.bucket) == 200 and len(h.bucket) == 30 and h.bucket_limit[-1] == 0.2
    assert [
        (e.step, e.histogram_value.num, e.histogram_value.max) for e in hists["hist/episode"]
    ] == [
        (7, 2, 3.0),
        (8, 2, 5.0),
    ]


def test_memory_is_bounded_by_a_reservoir(tmp_path):
    n, cap = 20_000, 64
    with MetricsRecorder(tmp_path, max_samples=cap) as rec:
        for i in range(n):
            rec.add_time("env_step", float(i))
        out = rec.write_step(1)
    (event,) = _histograms(tmp_path)["hist/env_step"]
    assert event.histogram_value.num == cap  # what was kept, not what was seen
    assert out["time/env_step_count"] == n  # the counts and sums see every span
    assert out["time/env_step_s"] == sum(range(n))
    # A uniform sample of 0..19999 (seeded): its percentiles are estimates in order.
    p50, p95, p99 = (out[f"latency/env_step/p{q}_ms"] / 1e3 for q in (50, 95, 99))
    assert 0.25 * n < p50 < 0.75 * n and p50 < p95 <= p99 < n


def test_non_finite_spans_are_summed_but_not_sampled():
    rec = MetricsRecorder(None)
    rec.add_time("weight_sync", math.nan)
    rec.add_time("weight_sync", math.nan)
    rec.add_time("train", 1.5)
    rec.add_time("train", 1.5)
    out = rec.write_step(1)
    assert math.isnan(out["time/weight_sync_s"])
    assert not any(k.startswith("latency/weight_sync/") for k in out)
    assert out["latency/train/p99_ms"] == 1500


def test_max_samples_zero_turns_percentiles_off(tmp_path):
    with MetricsRecorder(tmp_path, max_samples=0) as rec:
        rec.add_time("train", 1.0)
        rec.add_time("train", 1.0)
        out = rec.write_step(1)
    assert out == {"time/train_s": 2.0, "time/train_count": 2.0}
    assert _histograms(tmp_path) == {}


@pytest.mark.parametrize("bad", [-1, 1.5, True, "64"], ids=["negative", "float", "bool", "str"])
def test_bad_max_samples_is_named(bad):
    with pytest.raises(ValueError, match="max_samples"):
        MetricsRecorder(None, max_samples=bad)
