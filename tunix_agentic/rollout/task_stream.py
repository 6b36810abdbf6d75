"""The orchestrator's task stream: which task each group runs, and what a restart redoes.

Groups are numbered as their tasks are drawn (the group index, which with the run's
seed fixes every member's sampling seed). A task drawn is *untrained* until its group
is trained on, filtered or dropped; :meth:`TaskStream.checkpoint_state` keeps, for each
untrained index, the iterator's state just before that draw, so a restored stream
draws those tasks again, with the same indices, before going on where it was.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from tunix_agentic.trajectory import TaskLike


class TaskStream:
    """Draws ``(group index, task)`` from ``tasks``, replaying after a restart.

    ``tasks``: an iterator of tasks; one with ``get_state()`` / ``set_state(state)`` (a
    :class:`~tunix_agentic.data.sources.RunSources` stream) can be checkpointed.
    """

    def __init__(self, tasks: Iterator[TaskLike] | None):
        self.tasks = tasks
        self._next_index = 0  # group index of the next task drawn from ``tasks``
        # Drawn, not yet trained on or filtered: group index -> the task stream's state just
        # before that draw (restored and drawn again after a restart).
        self._untrained: dict[int, Any] = {}
        self._replay: collections.deque[tuple[int, TaskLike, Any]] = collections.deque()

    def next(self) -> tuple[int, TaskLike]:
        """``(group index, task)``: a task to replay after a restart, else the stream's next."""
        if self._replay:
            index, task, before = self._replay.popleft()
        else:
            before = self.tasks.get_state() if hasattr(self.tasks, "get_state") else None
            try:
                task = next(self.tasks)
            except StopIteration:
                raise RuntimeError("the task iterator is exhausted") from None
            index, self._next_index = self._next_index, self._next_index + 1
        self._untrained[index] = before
        return index, task

    def done_with(self, index: int) -> None:
        """Group ``index``'s task needs no rerun after a restart (trained on, filtered or
        dropped)."""
        self._untrained.pop(index, None)

    def checkpoint_state(self) -> dict[str, Any]:
        """The stream's position, JSON-serialisable, for :meth:`restore_state`; ``pending``
        lists ``[index, state before its draw]`` of every untrained group."""
        if not hasattr(self.tasks, "get_state"):
            raise ValueError("the task iterator has no get_state(): it cannot be checkpointed")
        pending = sorted(self._untrained.items()) + [(i, st) for i, _, st in self._replay]
        return {
            "task_iterator": self.tasks.get_state(),
            "next_index": self._next_index,
            "pending": [[index, before] for index, before in pending],
        }

    def restore_state(self, state: dict[str, Any]) -> None:
        """Continue the stream saved by :meth:`checkpoint_state` (before the first draw)."""
        self._replay.clear()
        for index, before in state.get("pending", []):
            self.tasks.set_state(before)
            self._replay.append((int(index), next(self.tasks), before))
        self.tasks.set_state(state["task_iterator"])
        self._next_index = int(state.get("next_index", 0))
