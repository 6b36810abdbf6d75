"""Multi-task runs: interleave several named task sources by quota.

Sources are drawn by smooth weighted round-robin, so after n draws each source
has had ``n * weight / sum(weights)`` tasks to within one: exact quotas, not
noisy sampling, and the state is just counts (checkpointable with the
sources' own iterator states). Each task is tagged with its source's name (its
``task_name`` field), so the name rides with every trajectory and its metrics,
and picks the environment it runs in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any


def next_by_quota(shares: Mapping[str, float], counts: Mapping[str, int]) -> str:
    """The name furthest below its quota after one more draw (ties: mapping order)."""
    n = sum(counts.values()) + 1
    return max(shares, key=lambda s: shares[s] * n - counts[s])


class TaskMixture:
    """An iterator over tasks from ``sources`` in proportion to ``weights``."""

    def __init__(self, sources: Mapping[str, Iterator[Any]], weights: Mapping[str, float]):
        if not sources:
            raise ValueError("a task mixture needs at least one source")
        if set(sources) != set(weights):
            raise ValueError(
                f"weights must name exactly the sources {sorted(sources)}, got {sorted(weights)}"
            )
        bad = {name: w for name, w in weights.items() if not w > 0}
        if bad:
            raise ValueError(f"task weights must be > 0, got {bad}")
        self.sources = dict(sources)
        total = float(sum(weights.values()))
        self.shares = {name: float(w) / total for name, w in weights.items()}
        self.counts = {name: 0 for name in self.sources}

    def __iter__(self) -> TaskMixture:
        return self

    def __next__(self) -> Any:
        name = next_by_quota(self.shares, self.counts)
        self.counts[name] += 1
        task = next(self.sources[name])
        if dataclasses.is_dataclass(task) and hasattr(task, "task_name"):
            task = dataclasses.replace(task, task_name=name)
        elif len(self.sources) > 1:
            raise TypeError(
                f"a task of source {name!r} cannot carry its source's name: tasks of a mixture "
                f"are dataclasses with a task_name field (such as envs.Task), got {type(task).__name__}"
            )
        return task

    def get_state(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "sources": {
                name: src.get_state()
                for name, src in self.sources.items()
                if hasattr(src, "get_state")
            },
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        if set(state["counts"]) != set(self.sources):
            raise ValueError(
                f"saved mixture has sources {sorted(state['counts'])}, this run {sorted(self.sources)}"
            )
        self.counts = {name: int(c) for name, c in state["counts"].items()}
        for name, src_state in state.get("sources", {}).items():
            self.sources[name].set_state(src_state)
