"""Tests for tunix_agentic.learners.batching: bucketed padding and per-group advantages."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.learners.advantages import dr_grpo, grpo
from tunix_agentic.learners.batching import bucket_length, grpo_batch, pad_rows
from tunix_agentic.rollout.episode import Group
from tunix_agentic.trajectory import Step, Trajectory

PAD = 0


def make_traj(
    prompt: list[int], action: list[int], reward: float = 0.0, version: int = 0
) -> Trajectory:
    traj = Trajectory(task_id="t", episode_id=f"e{len(prompt)}-{len(action)}", reward=reward)
    traj.append_prompt(prompt)
    traj.append_action(
        Step(
            context_len=len(prompt),
            action_ids=action,
            logprobs=[-0.5] * len(action),
            versions=[version] * len(action),
            finish_reason="stop",
        )
    )
    return traj


def make_group(index: int, rewards: list[float]) -> Group:
    trajs = [make_traj([7, 8], [20 + index, 30 + i], reward=r) for i, r in enumerate(rewards)]
    return Group(
        group_id=f"g{index}", index=index, task=None, admitted_version=0, trajectories=trajs
    )


@pytest.mark.parametrize(
    ("n", "multiple", "expected"),
    [(0, 64, 64), (1, 64, 64), (64, 64, 64), (65, 64, 128), (5, 8, 8), (9, 8, 16), (16, 8, 16)],
    ids=["zero", "one", "exact", "one_over", "small_multiple", "small_over", "small_exact"],
)
def test_bucket_length(n, multiple, expected):
    assert bucket_length(n, multiple) == expected


def test_geometric_buckets_pad_at_most_a_third_with_two_widths_per_doubling():
    widths = [bucket_length(n, 32, geometric=True) for n in (1, 32, 33, 48, 49, 65, 97, 129)]
    assert widths == [32, 32, 48, 48, 64, 96, 128, 192]
    assert [bucket_length(n, 24, geometric=True) for n in (25, 37, 73, 100)] == [36, 48, 96, 144]
    for n in range(33, 3000):
        assert n <= bucket_length(n, 32, geometric=True) < n * 1.5
    assert len({bucket_length(n, 32, geometric=True) for n in range(1025, 2049)}) == 2
    with pytest.raises(ValueError, match="even"):
        bucket_length(10, 33, geometric=True)


def test_pad_rows_literal():
    rows = [make_traj([1, 2], [3]).learner_arrays(), make_traj([4], [5, 6, 7, 8]).learner_arrays()]
    batch = pad_rows(rows, pad_id=PAD, num_rows=3, length_multiple=4)
    np.testing.assert_array_equal(batch.advantages, [0, 0, 0])
    np.testing.assert_array_equal(batch.truncated, [0, 0, 0])
    np.testing.assert_array_equal(
        batch.input_ids, [[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 7, 8, 0, 0, 0], [0] * 8]
    )
    np.testing.assert_array_equal(
        batch.loss_mask, [[0, 0, 1, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 0, 0, 0], [0] * 8]
    )
    np.testing.assert_allclose(
        batch.old_logprobs,
        [[0, 0, -0.5, 0, 0, 0, 0, 0], [0, -0.5, -0.5, -0.5, -0.5, 0, 0, 0], [0] * 8],
        rtol=0,
        atol=0,
    )
    assert batch.input_ids.dtype == np.int32
    assert batch.loss_mask.dtype == np.float32


@pytest.mark.parametrize(
    ("lengths", "num_rows", "multiple", "shape"),
    [
        ([3, 5], None, 64, (2, 64)),
        ([3, 70], None, 64, (2, 128)),
        ([64], 4, 64, (4, 64)),
        ([65, 1, 1], 8, 32, (8, 96)),
        ([10, 10, 10], 2, 16, (3, 16)),  # num_rows below the row count never drops rows
    ],
    ids=["one_bucket", "two_buckets", "exact_fit", "many_padding_rows", "num_rows_too_small"],
)
def test_pad_rows_shapes(lengths, num_rows, multiple, shape):
    rows = [make_traj([9] * (n - 1), [5]).learner_arrays() for n in lengths]
    batch = pad_rows(rows, pad_id=PAD, num_rows=num_rows, length_multiple=multiple)
    for array in (batch.input_ids, batch.loss_mask, batch.old_logprobs):
        assert array.shape == shape
    assert batch.loss_mask[len(lengths) :].sum() == 0  # padding rows contribute nothing
    np.testing.assert_array_equal(batch.loss_mask.sum(axis=1)[: len(lengths)], [1] * len(lengths))


def test_a_rows_untrained_tail_never_widens_the_batch():
    """An episode cut at the token limit right after a tool message: the message's tokens
    follow the last trained token, so the row keeps its tokens up to that one only."""
    traj = make_traj([1, 2, 3], [4, 5])
    traj.append_observation([6] * 12)  # the tool's reply, never trained on
    row = traj.learner_arrays()
    assert len(row["input_ids"]) == 17
    batch = pad_rows([row], pad_id=PAD, length_multiple=8)
    assert batch.input_ids.shape == (1, 8)
    np.testing.assert_array_equal(batch.input_ids[0], [1, 2, 3, 4, 5, 0, 0, 0])
    np.testing.assert_array_equal(batch.loss_mask[0], [0, 0, 0, 1, 1, 0, 0, 0])
    untrained = {"input_ids": np.arange(5), "loss_mask": np.zeros(5, np.float32)}
    assert pad_rows([untrained, row], pad_id=PAD, length_multiple=4).input_ids.shape == (2, 8)


def test_pad_rows_uses_pad_id():
    batch = pad_rows(
        [make_traj([1], [2]).learner_arrays()], pad_id=99, num_rows=2, length_multiple=4
    )
    np.testing.assert_array_equal(batch.input_ids, [[1, 2, 99, 99], [99, 99, 99, 99]])


def test_pad_rows_empty_raises():
    with pytest.raises(ValueError, match="cannot build a batch from no trajectories"):
        pad_rows([], pad_id=PAD)


def test_group_rewards_property():
    group = make_group(0, [1.0, 0.0, 0.5])
    np.testing.assert_array_equal(group.rewards, np.array([1.0, 0.0, 0.5], np.float32))


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        # group 0 rewards [1, 0], group 1 rewards [2, 2, 5]; two padding rows
        (dr_grpo, [0.5, -0.5, -1.0, -1.0, 2.0, 0.0, 0.0]),
        (grpo, [1.0, -1.0, -0.70710677, -0.70710677, 1.4142135, 0.0, 0.0]),
    ],
    ids=["dr_grpo", "grpo"],
)
def test_grpo_batch_advantages_within_group(fn, expected):
    groups = [make_group(0, [1.0, 0.0]), make_group(1, [2.0, 2.0, 5.0])]
    batch = grpo_batch(groups, fn, pad_id=PAD, num_rows=7, length_multiple=8)
    assert batch.input_ids.shape == (7, 8)
    assert batch.advantages.shape == (7,)
    assert batch.advantages.dtype == np.float32
    np.testing.assert_allclose(batch.advantages, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(
        batch.input_ids[:, :4],
        [
            [7, 8, 20, 30],
            [7, 8, 20, 31],
            [7, 8, 21, 30],
            [7, 8, 21, 31],
            [7, 8, 21, 32],
            [0, 0, 0, 0],
            [0, 0, 0, 0],
        ],
    )
    np.testing.assert_array_equal(batch.loss_mask.sum(axis=1), [2, 2, 2, 2, 2, 0, 0])


def test_grpo_batch_uniform_group_gets_zero_advantage():
    groups = [make_group(0, [1.0, 1.0]), make_group(1, [0.0, 1.0])]
    batch = grpo_batch(groups, grpo, pad_id=PAD, length_multiple=8)
    np.testing.assert_allclose(batch.advantages, [0.0, 0.0, -1.0, 1.0], rtol=1e-5, atol=1e-6)


def test_grpo_batch_rejects_advantage_length_mismatch():
    groups = [make_group(0, [1.0, 0.0])]
    with pytest.raises(ValueError):
        grpo_batch(groups, lambda r: np.zeros(3, np.float32), pad_id=PAD)


def test_task_normalization_standardizes_each_task_separately():
    from tunix_agentic.learners.batching import normalize_by_task

    adv = np.array([2.0, 0.0, 10.0, -10.0, 4.0], np.float32)
    out = normalize_by_task(adv, ["a", "a", "b", "b", "a"])
    a = np.array([2.0, 0.0, 4.0])
    np.testing.assert_allclose(out[[0, 1, 4]], (a - 2.0) / (a.std() + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(out[[2, 3]], [1.0, -1.0], rtol=1e-5)
