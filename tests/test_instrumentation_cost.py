"""The pieces of profiling/bench_instrumentation.py that decide its figures (never a timing)."""

import collections
import dataclasses
import importlib
import time

import pytest

from tunix_agentic.config import load_config
from tunix_agentic.inference.clock import EngineClock
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.trace import TraceConfig, open_trace


@pytest.fixture
def bench():
    return importlib.import_module("profiling.bench_instrumentation")


def test_a_step_lasts_from_the_previous_rl_row_to_its_own(bench):
    rows = [
        {"step": 0, "wall_time": 5.0, "eval/success_fraction": 0.1},  # not an RL step
        {"step": 1, "wall_time": 10.0, "step_time/wall_s": 3.0},
        {"step": 2, "wall_time": 12.5, "step_time/wall_s": 1.0},
        {"step": 3, "wall_time": 14.0, "step_time/wall_s": 1.0},
        {"step": 5, "wall_time": 20.0, "step_time/wall_s": 1.0},  # step 4 missing
    ]
    assert bench.step_periods(rows) == [(2, 10.0, 12.5), (3, 12.5, 14.0)]


def test_a_pair_compares_the_steps_steady_on_both_sides(bench):
    on = {3: 1.1, 4: 1.2, 5: 9.0, 6: 1.0}
    off = {3: 1.0, 4: 1.0, 6: 1.0, 7: 5.0}
    ratio, common = bench.pair_ratio(on, off)
    assert common == [3, 4, 6]
    assert ratio == pytest.approx(1.1)
    with pytest.raises(ValueError, match="BENCH_RL_STEPS"):
        bench.pair_ratio({3: 1.0}, {4: 1.0})


def test_spread_gives_the_quartiles(bench):
    got = bench.spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert got == {"median": 3.0, "q1": 2.0, "q3": 4.0, "min": 1.0, "max": 5.0}
    assert bench.spread([1.5]) == {"median": 1.5, "q1": 1.5, "q3": 1.5, "min": 1.5, "max": 1.5}


def test_the_hook_clock_times_the_instrumentation_and_puts_it_back(bench, tmp_path):
    originals = {(o, n): o.__dict__[n] for o, n in bench.HOOKS}
    clock = bench.HookClock()
    with clock.installed():
        metrics = MetricsRecorder(tmp_path / "tb", max_samples=8)
        trace = open_trace(tmp_path / "trace", TraceConfig(), metrics)
        start = time.time()
        for _ in range(5):
            with metrics.span("train"):  # a learner span: traced, sampled
                pass
        now = time.perf_counter()
        EngineClock().account(now, now + 1e-3, "decode")  # the trace observes the engine
        metrics.write_step(1)  # percentiles and a histogram
        trace.begin_step(2)
        end = time.time()
        trace.close()
        metrics.close()
    # 5 spans x (reservoir + trace listener), a device call, a percentile, a histogram,
    # a step flush.
    assert len(clock.calls) == 14
    assert all(start <= e <= end + 1e-3 and w >= 0 and c >= 0 for e, w, c, _ in clock.calls)
    wall, cpu = clock.seconds_between(start, end + 1e-3)
    assert wall == pytest.approx(sum(call[1] for call in clock.calls)) and wall > 0
    assert cpu == pytest.approx(sum(call[2] for call in clock.calls))
    assert clock.seconds_between(end + 1, end + 2) == (0, 0)
    by_hook = clock.by_hook(start, end + 1e-3)
    assert list(by_hook) == [f"{getattr(o, '__name__', o)}.{n}" for o, n in bench.HOOKS]
    assert sum(w for w, _ in by_hook.values()) == pytest.approx(wall)
    assert sum(c for _, c in by_hook.values()) == pytest.approx(cpu)
    calls = collections.Counter(clock.names[i] for *_, i in clock.calls)
    assert calls == {
        "TraceWriter.on_span": 5,
        "TraceWriter.begin_step": 1,
        "EngineClock._notify": 1,
        "_Reservoir.add": 5,
        "tunix_agentic.metrics.recorder.percentiles": 1,
        "tunix_agentic.metrics.recorder.histogram_value": 1,
    }
    # What the run wrote is what it writes untimed.
    rows = (tmp_path / "tb" / "metrics.jsonl").read_text()
    assert "latency/train/p95_ms" in rows
    assert {(o, n): o.__dict__[n] for o, n in bench.HOOKS} == originals


def test_the_off_side_turns_off_exactly_what_the_issue_prices(bench):
    on = load_config(bench.CONFIG)
    off = load_config(bench.CONFIG, bench.OFF)
    assert on.metrics.latency_samples > 0 and on.metrics.layout and on.trace.enabled
    assert off.metrics.latency_samples == 0 and not off.metrics.layout
    assert not off.trace.enabled
    # Nothing else differs.
    back = dataclasses.replace(
        off,
        metrics=dataclasses.replace(
            off.metrics, latency_samples=on.metrics.latency_samples, layout=True
        ),
        trace=dataclasses.replace(off.trace, enabled=True),
    )
    assert back == on


def test_step_cpu_reads_the_process_clock_at_each_write_step_and_puts_it_back(bench):
    original = MetricsRecorder.__dict__["write_step"]
    step_cpu = bench.StepCPU()
    with step_cpu.installed():
        rec = MetricsRecorder(None)
        for step in (1, 2, 3):
            rec.add_time("train", 0.5)
            assert rec.write_step(step)["time/train_s"] == 0.5  # what it writes, unchanged
    assert list(step_cpu.at) == [1, 2, 3]
    assert step_cpu.at[1] <= step_cpu.at[2] <= step_cpu.at[3]
    assert MetricsRecorder.__dict__["write_step"] is original
