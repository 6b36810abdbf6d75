"""Where an RL step's time went: the wait for the batch split by precedence, and the
TensorBoard placement of each series (a run per line)."""

import pytest

from tunix_agentic.metrics.series import flat_name, place
from tunix_agentic.metrics.step_time import StepTime, split_window


@pytest.mark.parametrize(
    "intervals, expected",
    [
        ({}, {"evaluation": 0, "generation": 0, "environment": 0, "reward": 0, "wait": 10}),
        (
            {"generation": [(1, 4), (3, 6)], "environment": [(5, 8)], "reward": [(9, 12)]},
            {"evaluation": 0, "generation": 5, "environment": 2, "reward": 1, "wait": 2},
        ),
        (
            {"evaluation": [(-5, 2)], "generation": [(0, 10)]},
            {"evaluation": 2, "generation": 8, "environment": 0, "reward": 0, "wait": 0},
        ),
    ],
    ids=["nothing-ran", "overlaps-and-gaps", "evaluation-first"],
)
def test_the_wait_is_charged_to_the_first_cause_under_way(intervals, expected):
    got = split_window(0.0, 10.0, intervals)
    assert got == pytest.approx(expected)
    assert sum(got.values()) == pytest.approx(10.0)


def test_step_parts_add_up_and_spans_past_the_wait_are_kept():
    step_time = StepTime()
    step_time("model_call", end=3.0, seconds=2.0)  # 1..3
    step_time("tool/bash", end=4.0, seconds=2.0)  # 2..4: 3..4 left for the environment
    step_time("stage/eval", end=12.0, seconds=1.0)  # after this step's wait: kept
    step_time("train", end=20.0, seconds=1.0)  # the learner's own: not a cause
    parts = step_time.parts(0.0, 5.0, train_s=2.0, sync_s=0.5, other_s=0.25)
    assert parts == pytest.approx(
        {
            "step_time/evaluation_s": 0.0,
            "step_time/generation_s": 2.0,
            "step_time/environment_s": 1.0,
            "step_time/reward_s": 0.0,
            "step_time/wait_s": 2.0,
            "step_time/train_s": 2.0,
            "step_time/weight_sync_s": 0.5,
            "step_time/other_s": 0.25,
            "step_time/wall_s": 7.75,
        }
    )
    later = step_time.parts(10.0, 13.0, train_s=0.0, sync_s=0.0, other_s=0.0)
    assert later["step_time/reward_s"] == pytest.approx(1.0)
    assert later["step_time/generation_s"] == 0.0  # step 1's spans are forgotten


@pytest.mark.parametrize(
    "name, run, tag",
    [
        ("step_time/train_s", "step_time/train", "step_time/part_s"),
        ("step_time/wall_s", "", "step_time/wall_s"),
        ("engine/host_gap_fraction", "engine/host_gap", "engine/time_fraction"),
        ("engine/kv_occupancy_fraction", "", "engine/kv_occupancy_fraction"),
        ("rollout/reward_mean/calc", "task/calc", "rollout/reward_mean"),
        ("latency/tool/bash/p95_ms", "tool/bash/p95", "latency/tool_ms"),
        ("latency/env/sandbox_start/p50_ms", "env/sandbox_start/p50", "latency/env_start_ms"),
        ("latency/episode/p99_ms", "p99", "latency/episode_ms"),
        ("gauge/queue/eval_waiting_episodes_max", "stage/eval", "gauge/queue/waiting_episodes_max"),
        ("gauge/queue/in_flight_groups_max", "groups/in_flight", "gauge/queue/groups_max"),
        ("sft/loss", "sft", "sft/loss"),
        ("learner/loss", "", "learner/loss"),
    ],
    ids=[
        "part",
        "wall",
        "engine",
        "engine-own",
        "task",
        "tool-pct",
        "env-start-pct",
        "pct",
        "stage",
        "groups",
        "sft",
        "own",
    ],
)
def test_each_series_has_a_run_and_maps_back(name, run, tag):
    assert place(name) == (run, tag)
    assert flat_name(run, tag) == name
