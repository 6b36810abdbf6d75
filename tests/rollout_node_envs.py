"""Environments for tests/test_rollout_node.py, imported by the node under test
(``env.import=tests/rollout_node_envs.py``).

``marker``: every episode writes a file under ``marker_dir`` when reset and removes it
when closed (a stand-in for a sandbox: a file left behind is an environment not closed).
Its verifier hangs for the members whose index (in creation order, per task) is in
``hang``: those episodes stay in EVAL until cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections import defaultdict
from typing import Any

from tunix_agentic.envs.base import Action, Environment, StepResult, register_env

_MADE: dict[str, itertools.count] = defaultdict(itertools.count)


@register_env("marker", client_kwargs=("marker_dir", "hang"))
class MarkerEnv(Environment):
    def __init__(self, marker_dir: str = "", hang: list[int] | tuple[int, ...] = ()):
        super().__init__()
        self.marker_dir, self.hang = marker_dir, tuple(hang)
        self.path: str | None = None
        self.member = -1

    async def reset(self, task: Any) -> str:
        self.member = next(_MADE[f"{self.marker_dir}/{task.task_id}"])
        self.path = os.path.join(self.marker_dir, f"{task.task_id}-{self.member}-{os.getpid()}")
        with open(self.path, "w") as f:
            f.write("open")
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        return StepResult("", 1.0, True)

    async def evaluate(self) -> float:
        if self.member in self.hang:
            await asyncio.sleep(3600)
        return 1.0

    async def close(self) -> None:
        if self.path is not None and os.path.exists(self.path):
            os.remove(self.path)
        self.path = None
