"""The run's timeline: the trace writer, the engine clock's observers, --profile-steps."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.config import load_config
from tunix_agentic.envs.base import register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.inference.clock import EngineClock
from tunix_agentic.metrics import device_calls
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.metrics.trace import (
    EPISODE,
    ProfileSteps,
    StepProfiler,
    TraceConfig,
    TraceWriter,
    read_trace,
)
from tunix_agentic.rollout.episode import InfraFailureError
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import train

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
LEARNER, ENGINE, EPISODES = 1, 2, 3
CHILDREN = ("model_call", "env_step")
TINY = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "sft.steps=0", "rl.eval_tasks=2"]


def _complete(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _thread_names(trace: dict, pid: int) -> dict[int, str]:
    return {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == pid
    }


def _by_thread(events: list[dict], pid: int) -> dict[int, list[dict]]:
    """A thread's events in nanoseconds (as Perfetto reads them), parents first."""
    out: dict[int, list[dict]] = {}
    for e in events:
        if e["pid"] == pid:
            ns = {"ts": round(e["ts"] * 1000), "dur": round(e["dur"] * 1000)}
            out.setdefault(e["tid"], []).append({**e, **ns})
    return {tid: sorted(evs, key=lambda e: (e["ts"], -e["dur"])) for tid, evs in out.items()}


def _within(inner: dict, outer: dict) -> bool:
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"]


def check_timeline(trace: dict) -> int:
    """Asserts the trace's shape; returns how many episode threads ran a whole episode.

    On every thread events nest (no two partly overlap); the learner's step events never
    overlap; an episode's stages run in order INIT < RUN < EVAL inside its ``episode``
    span, its model calls and env steps lie within RUN and its tool calls within an env
    step, none overlapping the next.
    """
    events = _complete(trace)
    for pid in (LEARNER, ENGINE, EPISODES):
        for tid, evs in _by_thread(events, pid).items():
            stack: list[dict] = []
            for e in evs:
                while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                    stack.pop()
                assert not stack or _within(e, stack[-1]), (pid, tid, stack[-1], e)
                stack.append(e)
    steps = _by_thread(events, LEARNER)
    names = _thread_names(trace, LEARNER)
    for tid, evs in steps.items():
        if names[tid] == "steps":
            for a, b in zip(evs, evs[1:], strict=False):
                assert a["ts"] + a["dur"] <= b["ts"], (a, b)
    whole = 0
    for evs in _by_thread(events, EPISODES).values():
        stages = {e["name"]: e for e in evs if e["name"].startswith("stage/")}
        order = [stages[s] for s in ("stage/init", "stage/run", "stage/eval") if s in stages]
        for a, b in zip(order, order[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"], (a, b)
        run = stages.get("stage/run")
        for e in evs:
            if e["name"] in CHILDREN:
                assert run is not None and _within(e, run), (e, run)
        env_steps = [e for e in evs if e["name"] == "env_step"]
        tools = [e for e in evs if e["name"].startswith("tool/")]
        for t in tools:
            assert any(_within(t, s) for s in env_steps), t
        for a, b in zip(tools, tools[1:], strict=False):
            assert a["ts"] + a["dur"] <= b["ts"], (a, b)
        episode = [e for e in evs if e["name"] == "episode"]
        if episode:
            assert all(_within(s, episode[0]) for s in order)
        whole += len(order) == 3
    return whole


# ---- the engine clock's observers --------------------------------------------------


def test_clock_observers_see_each_call_and_the_host_gaps_outside_idle():
    seen: list[tuple[str, float, float]] = []

    def observer(engine_id, name, start, end):
        seen.append((name, start, end))

    c = EngineClock(now=0.0)
    device_calls.add_observer(observer)
    try:
        c.account(dispatched=1.0, done=3.0, kind="prefill")
        c.idle_from(3.0)
        c.work_arrived(5.0)
        c.account(dispatched=5.5, done=6.0, kind="decode")
        c.account(dispatched=5.8, done=7.0, kind="decode")  # queued behind: no gap
    finally:
        device_calls.remove_observer(observer)
    c.account(dispatched=8.0, done=9.0, kind="decode")  # removed: not seen
    assert seen == [
        ("host_gap", 0.0, 1.0),
        ("prefill", 1.0, 3.0),
        ("host_gap", 5.0, 5.5),  # 3 -> 5 was idle
        ("decode", 5.5, 6.0),
        ("decode", 6.0, 7.0),
    ]


def test_an_observer_that_raises_is_removed_and_the_clock_goes_on():
    calls = []

    def broken(*args):
        calls.append(args)
        raise RuntimeError("observer bug")

    device_calls.add_observer(broken)
    c = EngineClock(now=0.0)
    assert c.account(dispatched=0.0, done=1.0, kind="decode") == 1.0
    assert c.account(dispatched=1.0, done=2.0, kind="decode") == 1.0
    assert len(calls) == 1 and broken not in device_calls._observers


# ---- the writer --------------------------------------------------------------------


async def _episode(metrics: MetricsRecorder, episode_id: str, tools: tuple[str, ...]) -> None:
    """The episode runner's recording order: children before parents, tool calls as
    durations after their env step."""
    EPISODE.set(episode_id)
    with metrics.span("episode"):
        with metrics.span("stage/init"):
            await asyncio.sleep(0.002)
            metrics.add_time("env/sandbox_start", 0.001)
        with metrics.span("stage/run"):
            for _ in range(2):
                with metrics.span("model_call"):
                    await asyncio.sleep(0.002)
                with metrics.span("env_step"):
                    await asyncio.sleep(0.003 * len(tools) + 0.001)
                for name in tools:
                    metrics.add_time(f"tool/{name}", 0.003)
        with metrics.span("stage/eval"):
            await asyncio.sleep(0.001)


async def _rl_steps(metrics: MetricsRecorder, writer: TraceWriter, steps: int) -> None:
    for step in range(1, steps + 1):
        writer.begin_step(step)
        with metrics.span("wait_for_batch"):
            await asyncio.gather(
                *(_episode(metrics, f"g{step}-{m}", ("bash", "python")) for m in range(3))
            )
        with metrics.span("train"):
            await asyncio.sleep(0.002)
        with metrics.span("weight_sync"):
            await asyncio.sleep(0.001)


def test_episode_spans_nest_in_their_stages_and_learner_steps_never_overlap(tmp_path):
    metrics = MetricsRecorder(None)
    writer = TraceWriter(tmp_path, TraceConfig(episodes_per_step=2))
    writer.attach(metrics)
    with metrics.span("sft"):
        pass
    asyncio.run(_rl_steps(metrics, writer, steps=2))
    metrics.add_time("sft_step", 0.1)  # neither an episode's nor the learner's: left out
    writer.close()

    (path,) = tmp_path.glob("trace-*.json.gz")
    trace = json.loads(gzip.decompress(path.read_bytes()))  # plain JSON, as Perfetto reads it
    assert check_timeline(trace) == 4  # 2 sampled episodes in each of the 2 steps
    names = _thread_names(trace, EPISODES)
    assert sorted(names.values()) == ["g1-0", "g1-1", "g2-0", "g2-1"]
    events = _complete(trace)
    tools = [e["name"] for e in events if e["name"].startswith("tool/")]
    assert tools == ["tool/bash", "tool/python"] * 8
    steps = [e["args"]["step"] for e in events if e["name"] == "train"]
    assert steps == [1, 2]
    other = trace["otherData"]
    assert other["complete"] and other["steps"] == [0, 2]
    assert other["episodes_sampled"] == 4 and other["episodes_not_sampled"] == 2
    assert other["spans_not_traced"] == 1


def test_episodes_and_the_engine_are_traced_in_one_step_of_every_n(tmp_path):
    with TraceWriter(tmp_path, TraceConfig(every_steps=2)) as writer:
        for step in (1, 2, 3):
            writer.begin_step(step)
            token = EPISODE.set(f"ep{step}")
            writer.on_span("model_call", 1.0 + step, 0.5)
            EPISODE.reset(token)
            writer.on_device(0, "decode", 1.0 + step, 1.5 + step)
    trace = read_trace(writer.files[0])
    assert sorted(_thread_names(trace, EPISODES).values()) == ["ep1", "ep3"]
    assert len([e for e in _complete(trace) if e["name"] == "decode"]) == 2


def test_a_tiny_cap_rotates_the_file_then_stops_with_a_note(tmp_path):
    writer = TraceWriter(tmp_path, TraceConfig(max_events=100, max_files=2))
    for i in range(500):
        writer.on_device(7, "decode", i * 1e-3, (i + 0.5) * 1e-3)
    writer.close()
    first, second = (read_trace(p) for p in writer.files)
    assert [p.name for p in writer.files] == ["trace-001.json.gz", "trace-002.json.gz"]
    for trace in (first, second):
        assert len(trace["traceEvents"]) <= 100
    assert "continued in trace-002.json.gz" in first["otherData"]["note"]
    assert "tracing stopped" in second["otherData"]["note"]
    assert second["otherData"]["events_dropped"] > 300 and second["otherData"]["complete"]
    notes = [e for e in second["traceEvents"] if e["ph"] == "i"]
    assert notes and "trace.max_files=2" in notes[0]["args"]["note"]
    # The second file names its engine thread again: each file opens on its own.
    for trace in (first, second):
        assert list(_thread_names(trace, ENGINE).values()) == ["engine 0"]


def test_the_file_is_whole_json_after_each_step_and_readable_after_a_kill(tmp_path):
    writer = TraceWriter(tmp_path, TraceConfig())
    writer.on_device(0, "prefill", 0.0, 1.0)
    writer.begin_step(1)
    writer.on_device(0, "decode", 1.0, 2.0)
    writer.begin_step(2)  # what a crashed run leaves: no close
    (path,) = writer.files
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert [e["name"] for e in _complete(trace)] == ["prefill", "decode"]
    assert trace["otherData"]["complete"] is False
    # Killed while writing: the closing member cut short, then missing altogether.
    data = path.read_bytes()
    for cut in (data[:-10], data[: data.rfind(b"\x1f\x8b\x08")]):
        path.write_bytes(cut)
        assert [e["name"] for e in _complete(read_trace(path))] == ["prefill", "decode"]
    writer.close()


def test_a_new_writer_never_overwrites_an_earlier_file(tmp_path):
    TraceWriter(tmp_path, TraceConfig()).close()
    again = TraceWriter(tmp_path, TraceConfig())
    again.close()
    assert [p.name for p in again.files] == ["trace-002.json.gz"]
    off = TraceWriter(tmp_path / "off", TraceConfig(enabled=False))
    off.on_device(0, "decode", 0.0, 1.0)
    off.close()
    assert not (tmp_path / "off").exists()


@pytest.mark.parametrize(
    "override,message",
    [
        ("trace.episodes_per_step=-1", "trace.episodes_per_step must be an integer >= 0"),
        ("trace.every_steps=0", "trace.every_steps must be an integer >= 1"),
        ("trace.max_events=10", "trace.max_events must be an integer >= 100"),
        ("trace.max_files=0", "trace.max_files must be an integer >= 1"),
        ("trace.max_event=5", "unknown config key 'trace.max_event'"),
    ],
    ids=["episodes_per_step", "every_steps", "max_events", "max_files", "unknown"],
)
def test_trace_settings_are_checked_by_name(override, message):
    with pytest.raises(ValueError, match=message):
        load_config(CONFIG, [override])


# ---- --profile-steps ---------------------------------------------------------------


def test_the_profiler_covers_only_the_chosen_steps(tmp_path):
    profiler = StepProfiler(ProfileSteps(2, 3), tmp_path)
    active = []
    for step in (1, 2, 3, 4, 5):
        profiler.begin_step(step)
        active.append(profiler.active)
    profiler.close()
    assert active == [False, True, True, False, False]
    (run,) = (tmp_path / "plugins" / "profile").iterdir()  # one capture, TensorBoard's layout
    assert any(p.name.endswith(".xplane.pb") for p in run.iterdir())


@pytest.mark.parametrize(
    "value,message",
    [
        ("3", "must look like A:B"),
        ("a:b", "must look like A:B"),
        ("2:1", "1 <= A <= B"),
        ("0:1", "1 <= A <= B"),
        ("-1:2", "1 <= A <= B"),
    ],
    ids=["one_number", "not_numbers", "backwards", "step_zero", "negative"],
)
def test_bad_profile_steps_are_an_error_naming_the_flag(value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", CONFIG, f"--profile-steps={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --profile-steps" in err and message in err


def test_profile_steps_past_the_run_are_an_error_naming_the_flag(capsys):
    assert main(["train", "--config", CONFIG, "--profile-steps", "3:4", "rl.steps=2"]) == 2
    assert "--profile-steps 3:4: the run has 2 RL steps" in capsys.readouterr().err


# ---- a real run --------------------------------------------------------------------


@pytest.mark.slow
def test_a_tiny_run_writes_its_timeline_and_the_chosen_steps_profile(observed_run):
    run_dir = observed_run  # tests/conftest.py: two RL steps, --profile-steps 1:1

    (path,) = (run_dir / "trace").glob("trace-*.json.gz")
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert check_timeline(trace) >= 1
    names = {(e["pid"], e["name"]) for e in _complete(trace)}
    assert {(LEARNER, n) for n in ("wait_for_batch", "train", "weight_sync", "eval")} <= names
    assert {(ENGINE, "prefill"), (ENGINE, "decode")} <= names
    assert {(EPISODES, n) for n in ("stage/init", "stage/run", "stage/eval")} <= names
    assert {(EPISODES, "model_call")} <= names
    assert trace["otherData"]["complete"] and trace["otherData"]["steps"][0] == 0
    trains = [e for e in _complete(trace) if e["name"] == "train"]
    assert [e["args"]["step"] for e in trains] == [1, 2]
    # Before RL, version 1 beside training (rl.eval_every=1), after RL: on the learner's eval
    # track, the periodic one after step 1's train step and before the final evaluation.
    evals = [e for e in _complete(trace) if e["name"] == "eval" and e["pid"] == LEARNER]
    assert len(evals) == 3 and len({e["tid"] for e in evals}) == 1
    assert _thread_names(trace, LEARNER)[evals[0]["tid"]] == "eval"
    before, periodic, after = sorted(evals, key=lambda e: e["ts"])
    assert before["ts"] + before["dur"] <= trains[0]["ts"]
    assert trains[0]["ts"] + trains[0]["dur"] <= periodic["ts"]
    assert periodic["ts"] + periodic["dur"] <= after["ts"] and periodic["args"]["step"] >= 2
    (capture,) = (run_dir / "tensorboard" / "plugins" / "profile").iterdir()
    assert any(p.name.endswith(".xplane.pb") for p in capture.iterdir())


class _ResetFails(ArithmeticEnv):
    async def reset(self, task):
        raise ConnectionError("sandbox image missing")


register_env("_trace_reset_fails", tasks=ArithmeticTasks())(_ResetFails)


def test_a_failed_run_keeps_what_it_traced(tmp_path):
    overrides = [*TINY, "env.name=_trace_reset_fails", "rollout.max_infra_failures_in_a_row=2"]
    with pytest.raises(InfraFailureError):
        train(CONFIG, [*overrides, f"run_dir={tmp_path}"], progress=False)
    (path,) = (tmp_path / "trace").glob("trace-*.json.gz")
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert trace["otherData"]["complete"]  # closed on the way out
    learner = [e["name"] for e in _complete(trace) if e["pid"] == LEARNER]
    assert learner == ["sft", "engine_warmup_wait", "eval"]  # the eval the failure ended too
