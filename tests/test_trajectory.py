"""Tests for tunix_agentic.trajectory: building a history and the learner's arrays."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

from tunix_agentic.trajectory import (
    INFRA_STATUSES,
    POLICY_STATUSES,
    Step,
    TaskKey,
    TaskLike,
    Trajectory,
    task_key,
    timeout_status,
)


def two_turn_trajectory() -> Trajectory:
    """prompt(3) + action(2) + observation(3) + action(3) = 11 tokens."""
    traj = Trajectory(task_id="t0", episode_id="e0")
    traj.append_prompt([10, 11, 12])
    traj.append_action(
        Step(
            context_len=3,
            action_ids=[20, 21],
            logprobs=[-0.5, -0.25],
            versions=[3, 3],
            finish_reason="stop",
        )
    )
    traj.append_observation([30, 31, 32])
    traj.append_action(
        Step(
            context_len=8,
            action_ids=[22, 23, 24],
            logprobs=[-1.0, -0.125, -2.0],
            versions=[4, 4, 5],
            finish_reason="stop",
        )
    )
    return traj


def test_history_and_steps():
    traj = two_turn_trajectory()
    assert traj.token_ids == [10, 11, 12, 20, 21, 30, 31, 32, 22, 23, 24]
    assert traj.prompt_len == 3
    assert [s.context_len for s in traj.steps] == [3, 8]
    assert traj.steps[0].observation_ids == [30, 31, 32]
    assert traj.steps[1].observation_ids == []


def test_learner_arrays_literal():
    arrays = two_turn_trajectory().learner_arrays()
    assert sorted(arrays) == ["constrained", "input_ids", "loss_mask", "old_logprobs", "versions"]
    assert not arrays["constrained"].any()
    np.testing.assert_array_equal(arrays["input_ids"], [10, 11, 12, 20, 21, 30, 31, 32, 22, 23, 24])
    np.testing.assert_array_equal(arrays["loss_mask"], [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1])
    np.testing.assert_allclose(
        arrays["old_logprobs"], [0, 0, 0, -0.5, -0.25, 0, 0, 0, -1.0, -0.125, -2.0], rtol=0, atol=0
    )
    np.testing.assert_array_equal(arrays["versions"], [-1, -1, -1, 3, 3, -1, -1, -1, 4, 4, 5])
    assert arrays["input_ids"].dtype == np.int32
    assert arrays["loss_mask"].dtype == np.float32
    assert arrays["old_logprobs"].dtype == np.float32
    assert arrays["versions"].dtype == np.int32


def test_a_step_sampled_under_a_grammar_is_trained_on_unless_masked():
    """``learner.constrained_tokens``: "train" keeps a constrained step's loss mask 1 and
    marks its tokens; "mask" leaves them as context (mask 0), in one row or per step."""
    traj = two_turn_trajectory()
    traj.steps[1].constrained = True
    arrays = traj.learner_arrays()
    np.testing.assert_array_equal(arrays["loss_mask"], [0, 0, 0, 1, 1, 0, 0, 0, 1, 1, 1])
    np.testing.assert_array_equal(arrays["constrained"], [0] * 8 + [1, 1, 1])
    masked = traj.learner_arrays(constrained="mask")
    np.testing.assert_array_equal(masked["loss_mask"], [0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(masked["constrained"], arrays["constrained"])
    traj.steps[1].context_ids = [31, 32]  # a window: one row per step
    first, second = traj.learner_rows()
    assert not first["constrained"].any() and first["loss_mask"].tolist() == [0, 0, 0, 1, 1]
    assert second["constrained"].tolist() == second["loss_mask"].tolist() == [0, 0, 1, 1, 1]
    _, second = traj.learner_rows(constrained="mask")
    assert not second["loss_mask"].any()
    with pytest.raises(ValueError, match=r"constrained must be one of \('train', 'mask'\)"):
        traj.learner_rows(constrained="drop")


def test_learner_arrays_prompt_only():
    traj = Trajectory(task_id="t", episode_id="e")
    traj.append_prompt([5, 6])
    arrays = traj.learner_arrays()
    np.testing.assert_array_equal(arrays["input_ids"], [5, 6])
    np.testing.assert_array_equal(arrays["loss_mask"], [0, 0])
    np.testing.assert_array_equal(arrays["versions"], [-1, -1])


def test_observation_is_copied():
    traj = Trajectory(task_id="t", episode_id="e")
    traj.append_prompt([1])
    traj.append_action(
        Step(context_len=1, action_ids=[2], logprobs=[-0.1], versions=[0], finish_reason="stop")
    )
    obs = [7, 8]
    traj.append_observation(obs)
    obs.append(9)
    assert traj.steps[0].observation_ids == [7, 8]
    assert traj.token_ids == [1, 2, 7, 8]


@pytest.mark.parametrize(
    "context_len", [0, 2, 4, 9], ids=["zero", "short_by_one", "long_by_one", "far_past"]
)
def test_append_action_wrong_context_len_raises(context_len):
    traj = Trajectory(task_id="t", episode_id="e")
    traj.append_prompt([10, 11, 12])
    step = Step(
        context_len=context_len,
        action_ids=[20],
        logprobs=[-1.0],
        versions=[0],
        finish_reason="stop",
    )
    with pytest.raises(ValueError, match="step context does not end where the history ends"):
        traj.append_action(step)
    assert traj.token_ids == [10, 11, 12]  # nothing appended
    assert traj.steps == []


def test_append_action_after_observation_needs_full_context():
    traj = Trajectory(task_id="t", episode_id="e")
    traj.append_prompt([10, 11, 12])
    traj.append_action(
        Step(context_len=3, action_ids=[20], logprobs=[-1.0], versions=[0], finish_reason="stop")
    )
    traj.append_observation([30, 31])
    stale = Step(
        context_len=4, action_ids=[21], logprobs=[-1.0], versions=[0], finish_reason="stop"
    )
    with pytest.raises(ValueError):
        traj.append_action(stale)


def test_min_version_and_num_generated():
    traj = two_turn_trajectory()
    assert traj.min_version == 3
    assert traj.num_generated == 5


def test_empty_trajectory_counters():
    traj = Trajectory(task_id="t", episode_id="e")
    assert traj.min_version is None
    assert traj.num_generated == 0


@pytest.mark.parametrize(
    ("status", "infra"),
    [
        ("ok", False),
        ("max_turns", False),
        ("max_tokens", False),
        ("timeout", True),
        ("env_error", True),
        ("engine_error", True),
        ("tool_error", True),
        ("cancelled", True),
    ],
    ids=lambda v: str(v),
)
def test_is_infra_failure(status, infra):
    assert (status in POLICY_STATUSES) is not infra
    assert (status in INFRA_STATUSES) is infra
    assert Trajectory(task_id="t", episode_id="e", status=status).is_infra_failure is infra


def test_status_groups_are_disjoint_and_complete():
    assert set(POLICY_STATUSES) == {"ok", "max_turns", "max_tokens", "agent_timeout"}
    assert set(INFRA_STATUSES) == {
        "timeout",
        "env_error",
        "engine_error",
        "tool_error",
        "cancelled",
    }
    assert not set(POLICY_STATUSES) & set(INFRA_STATUSES)


@pytest.mark.parametrize(
    ("stage", "actions_s", "expected"),
    [
        ("run", 60.0, "agent_timeout"),
        ("run", 50.0, "agent_timeout"),
        ("run", 49.0, "timeout"),
        ("init", 0.0, "timeout"),
        ("eval", 90.0, "timeout"),
    ],
    ids=["tools-took-most", "tools-took-half", "engine-took-most", "reset-hung", "verifier-hung"],
)
def test_timeout_status_blames_the_agent_only_for_its_own_actions(stage, actions_s, expected):
    status = timeout_status(stage, actions_s, timeout_s=100.0)
    assert status == expected
    assert (status in POLICY_STATUSES) == (expected == "agent_timeout")


def _sources() -> dict[str, object]:
    from tunix_agentic.envs.answer_format import CapitalTasks, SumTasks
    from tunix_agentic.envs.calculator import ArithmeticTasks
    from tunix_agentic.envs.capital_chain import ChainTasks
    from tunix_agentic.envs.capital_lookup import LookupTasks
    from tunix_agentic.envs.countdown import CountdownTasks
    from tunix_agentic.envs.frozenlake import FrozenLakeTasks

    return {
        "sum": SumTasks(),
        "capital_format": CapitalTasks(),
        "arithmetic": ArithmeticTasks(),
        "capital_chain": ChainTasks(),
        "capital_lookup": LookupTasks(),
        "countdown": CountdownTasks(),
        "frozenlake": FrozenLakeTasks(),
    }


@pytest.mark.parametrize("source", list(_sources()), ids=str)
def test_every_task_type_is_task_like_and_keyed_by_its_own_fields(source):
    task = _sources()[source].task(3, seed=1, split="train")
    assert isinstance(task, TaskLike), type(task).__name__
    assert task_key(task) == TaskKey(task.task_id, task.task_name)


@pytest.mark.parametrize(
    "task, want",
    [
        ("task", TaskKey("task", "default")),  # a bare prompt: its text, the default name
        (7, TaskKey("7", "default")),
        (SimpleNamespace(task_id=5), TaskKey("5", "default")),  # its own id, as a string
        # Text a group id cannot hold (a '/', or long): a digest of it, the same each time.
        ("a/b", TaskKey("task-" + hashlib.sha1(b"a/b").hexdigest()[:12], "default")),
        ("x" * 65, TaskKey("task-" + hashlib.sha1(b"x" * 65).hexdigest()[:12], "default")),
    ],
    ids=["str", "int", "id_only", "slash", "long"],
)
def test_an_object_that_is_not_a_task_has_one_fallback(task, want):
    assert not isinstance(task, TaskLike)
    assert task_key(task) == want
