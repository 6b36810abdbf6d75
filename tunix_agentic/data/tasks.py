"""Task data through grain: shuffled, endlessly repeated, checkpointable task streams.

Any :class:`~tunix_agentic.envs.base.TaskSource` feeds these: a generated source
makes task ``i`` from its index on the fly (a stream of a million tasks costs no
memory), a :class:`FileTaskSource` reads JSONL or parquet records. Either way the
iterator's ``get_state()`` is a small position that orbax saves with the rest of
a checkpoint.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunix_agentic.envs.base import SPLITS, Task, TaskSource

if TYPE_CHECKING:  # grain loads JAX: imported where a stream is built, not by the task readers
    import grain


def _read_options() -> grain.ReadOptions:
    import grain

    # Tasks are generated in microseconds in memory; prefetch threads would only add GIL
    # contention.
    return grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def _check(source: TaskSource, seed: int, split: str) -> None:
    if not isinstance(source, TaskSource):
        raise TypeError(f"source must be a TaskSource, got {type(source).__name__}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")


def _task_at(index: int, *, source: TaskSource, seed: int, split: str) -> Any:
    return source.task(int(index), seed=seed, split=split)


def task_dataset(
    source: TaskSource,
    *,
    seed: int,
    split: str,
    num_tasks: int | None = None,
    shuffle: bool = True,
) -> grain.MapDataset:
    """A ``MapDataset`` of ``source``'s tasks ``0..num_tasks-1`` of ``split``.

    ``num_tasks`` defaults to ``source.num_tasks(split)``. With ``shuffle`` the order is a
    deterministic permutation seeded by ``seed`` (``0 <= seed < 2**32``); without it,
    element ``i`` is ``source.task(i, seed=seed, split=split)``.
    """
    _check(source, seed, split)
    available = source.num_tasks(split)
    if num_tasks is None:
        num_tasks = available
    if num_tasks <= 0:
        raise ValueError(f"num_tasks must be positive, got {num_tasks} ({split} split)")
    if num_tasks > available:
        raise ValueError(f"the {split} split has {available} tasks, {num_tasks} were asked for")
    import grain

    dataset = grain.MapDataset.range(num_tasks)
    if shuffle:
        dataset = dataset.shuffle(seed=seed)
    # A partial of a module-level function stays picklable for grain's worker processes.
    return dataset.map(functools.partial(_task_at, source=source, seed=seed, split=split))


def task_iterator(
    source: TaskSource, *, seed: int, split: str = "train", num_tasks: int | None = None
) -> grain.DatasetIterator:
    """An endless, checkpointable iterator over :func:`task_dataset`, reshuffled each epoch.

    ``get_state()`` returns a small dict; ``set_state(state)`` on a fresh iterator built with
    the same arguments continues exactly where the saved one stopped.
    """
    dataset = task_dataset(source, seed=seed, split=split, num_tasks=num_tasks, shuffle=True)
    return iter(dataset.repeat().to_iter_dataset(_read_options()))


def heldout_tasks(source: TaskSource, n: int, *, seed: int) -> list[Any]:
    """The first ``n`` held-out tasks of ``source`` for ``seed``, in index order (no shuffle).

    Fewer than ``n`` when the held-out split has fewer tasks.
    """
    _check(source, seed, "heldout")
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    n = min(n, source.num_tasks("heldout"))
    return [source.task(i, seed=seed, split="heldout") for i in range(n)]


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``.jsonl`` file (one JSON object per line), a ``.json`` file (a list
    of objects) or a ``.parquet`` file (needs ``pyarrow``). Raises ``ValueError`` naming the file and line of a bad record."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"task file {str(path)!r} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise ValueError(
                f"reading {str(path)!r} needs pyarrow (pip install pyarrow), or use JSONL"
            ) from None
        return pq.read_table(path).to_pylist()
    if path.suffix == ".json":
        try:
            records = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            raise ValueError(f"{path}: a .json task file holds a list of JSON objects")
        if not records:
            raise ValueError(f"task file {str(path)!r} holds no records")
        return records
    if path.suffix != ".jsonl":
        raise ValueError(f"task file {str(path)!r} must be .jsonl, .json or .parquet")
    records = []
    with path.open() as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not JSON: {exc.msg}") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{lineno}: a task record must be a JSON object")
            records.append(record)
    if not records:
        raise ValueError(f"task file {str(path)!r} holds no records")
    return records


class FileTaskSource(TaskSource):
    """Tasks read from files: ``train`` and ``heldout`` each a JSONL or parquet path.

    Each record becomes a task through ``parse(record, index=, split=)`` (default
    :meth:`Task.from_record`: ``prompt``, ``answer``, ``task_id``, the rest in
    ``data``). The files are read once, when the source is built; a bad record
    fails then, naming its file and index. ``seed`` only shuffles a file's order.
    A split without a file has no tasks (asking for one raises ``ValueError``).
    """

    def __init__(
        self,
        *,
        train: str | Path | None = None,
        heldout: str | Path | None = None,
        parse: Callable[..., Any] = Task.from_record,
    ):
        if train is None and heldout is None:
            raise ValueError("a file task source needs a train or a heldout file")
        self.paths = {"train": train, "heldout": heldout}
        self.tasks: dict[str, list[Any]] = {}
        for split, path in self.paths.items():
            records = read_records(path) if path is not None else []
            tasks = []
            for i, record in enumerate(records):
                try:
                    tasks.append(parse(record, index=i, split=split))
                except (ValueError, TypeError, KeyError) as exc:
                    raise ValueError(f"{path}: record {i}: {exc}") from None
            self.tasks[split] = tasks

    def num_tasks(self, split: str) -> int:
        return len(self.tasks[split])

    def task(self, index: int, *, seed: int, split: str) -> Any:
        tasks = self.tasks[split]
        if not tasks:
            raise ValueError(f"no {split} task file was given")
        return tasks[index]
