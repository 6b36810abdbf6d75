"""Tests for tunix_agentic.data.tasks: grain task datasets, iterator state, held-out tasks."""

from __future__ import annotations

import pytest

from tunix_agentic.data import heldout_tasks, task_dataset, task_iterator
from tunix_agentic.envs import ArithmeticTask, make_arithmetic_task
from tunix_agentic.envs.calculator import ArithmeticTasks

SOURCE = ArithmeticTasks()


def test_dataset_unshuffled_matches_generator() -> None:
    ds = task_dataset(SOURCE, seed=5, split="train", num_tasks=10, shuffle=False)
    assert len(ds) == 10
    assert list(ds) == [make_arithmetic_task(i, seed=5, split="train") for i in range(10)]


def test_dataset_shuffled_is_permutation() -> None:
    plain = task_dataset(SOURCE, seed=5, split="train", num_tasks=50, shuffle=False)
    shuffled = task_dataset(SOURCE, seed=5, split="train", num_tasks=50)
    ids = [t.task_id for t in shuffled]
    assert ids != [t.task_id for t in plain]
    assert sorted(ids) == sorted(t.task_id for t in plain)
    assert ids == [t.task_id for t in task_dataset(SOURCE, seed=5, split="train", num_tasks=50)]


def test_dataset_default_size_is_large_and_lazy() -> None:
    ds = task_dataset(SOURCE, seed=0, split="train")
    assert len(ds) == 1_000_000
    assert isinstance(ds[999_999], ArithmeticTask)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"seed": 0, "split": "valid"}, "split"),
        ({"seed": -1, "split": "train"}, "seed"),
        ({"seed": 0, "split": "train", "num_tasks": 0}, "num_tasks"),
    ],
    ids=["bad-split", "negative-seed", "empty"],
)
def test_dataset_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        task_dataset(SOURCE, **kwargs)


@pytest.mark.parametrize("split", ["train", "heldout"], ids=["train", "heldout"])
def test_iterator_state_round_trip(split: str) -> None:
    it = task_iterator(SOURCE, seed=7, split=split)
    first = [next(it) for _ in range(5)]
    state = it.get_state()
    expected = [next(it) for _ in range(3)]

    resumed = task_iterator(SOURCE, seed=7, split=split)
    resumed.set_state(state)
    assert [next(resumed) for _ in range(3)] == expected

    fresh = task_iterator(SOURCE, seed=7, split=split)
    assert [next(fresh) for _ in range(5)] == first
    assert all(t.task_id.startswith(f"{split}-7-") for t in first + expected)


def test_iterator_repeats_forever_with_new_order() -> None:
    it = task_iterator(SOURCE, seed=1, num_tasks=4)
    epochs = [[next(it).task_id for _ in range(4)] for _ in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # each epoch is reshuffled


def test_heldout_tasks_deterministic() -> None:
    tasks = heldout_tasks(SOURCE, 20, seed=0)
    assert tasks == heldout_tasks(SOURCE, 20, seed=0)
    assert tasks[:5] == heldout_tasks(SOURCE, 5, seed=0)
    assert tasks == list(task_dataset(SOURCE, seed=0, split="heldout", num_tasks=20, shuffle=False))
    assert [t.task_id for t in tasks] == [f"heldout-0-{i}" for i in range(20)]
    assert heldout_tasks(SOURCE, 0, seed=0) == []
    train = {t.expression for t in task_dataset(SOURCE, seed=0, split="train", num_tasks=2000)}
    assert not train & {t.expression for t in heldout_tasks(SOURCE, 500, seed=0)}
