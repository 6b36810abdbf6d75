"""Task data through grain: shuffled, endlessly repeated, checkpointable task streams.

Tasks are generated on the fly from their index (see :func:`tunix_agentic.envs.calculator.make_arithmetic_task`),
so a dataset of a million tasks costs no memory, and the iterator's ``get_state()`` is just a
position that orbax can save with the rest of a checkpoint.
"""

from __future__ import annotations

import functools

import grain

from tunix_agentic.envs.calculator import SPLITS, ArithmeticTask, make_arithmetic_task

# "train" is effectively unbounded; "heldout" is a fixed evaluation pool.
DEFAULT_NUM_TASKS = {"train": 1_000_000, "heldout": 10_000}
# Tasks are generated in microseconds in memory; prefetch threads would only add GIL contention.
_READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def task_dataset(
    *, seed: int, split: str, num_tasks: int | None = None, shuffle: bool = True
) -> grain.MapDataset:
    """A ``MapDataset`` of :class:`ArithmeticTask` for indices ``0..num_tasks-1`` of ``split``.

    ``num_tasks`` defaults to ``DEFAULT_NUM_TASKS[split]``. With ``shuffle`` the order is a
    deterministic permutation seeded by ``seed`` (``0 <= seed < 2**32``); without it, element
    ``i`` is ``make_arithmetic_task(i, seed=seed, split=split)``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    if num_tasks is None:
        num_tasks = DEFAULT_NUM_TASKS[split]
    if num_tasks <= 0:
        raise ValueError(f"num_tasks must be positive, got {num_tasks}")
    dataset = grain.MapDataset.range(num_tasks)
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    # A partial of a module-level function stays picklable for grain's worker processes.
    return dataset.map(functools.partial(make_arithmetic_task, seed=seed, split=split))


def task_iterator(
    *, seed: int, split: str = "train", num_tasks: int | None = None
) -> grain.DatasetIterator:
    """An endless, checkpointable iterator over :func:`task_dataset`, reshuffled each epoch.

    ``get_state()`` returns a small dict; ``set_state(state)`` on a fresh iterator built with
    the same arguments continues exactly where the saved one stopped.
    """
    dataset = task_dataset(seed=seed, split=split, num_tasks=num_tasks, shuffle=True)
    return iter(dataset.repeat().to_iter_dataset(_READ_OPTIONS))


def heldout_tasks(n: int, *, seed: int) -> list[ArithmeticTask]:
    """The first ``n`` held-out tasks for ``seed``, in index order (no shuffle)."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    return [make_arithmetic_task(i, seed=seed, split="heldout") for i in range(n)]
