"""Math word problems with a Python interpreter (ToRL): compute, then answer.

The agent gets a generated word problem (:mod:`tunix_agentic.envs.math_problems`)
and a ``python`` tool, a persistent interpreter in the episode's sandbox
(variables kept across calls; an error comes back as the traceback's last line;
at most ``max_python_calls`` calls). It answers ``<answer>7/4</answer>``; the
verifier (:func:`~tunix_agentic.envs.math_verify.answers_equal`) accepts any
mathematically equal form (``1.75``, ``\\boxed{7/4}``, ``175%``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunix_agentic.envs.base import Action, StepResult, Task, TaskSource, register_env
from tunix_agentic.envs.math_problems import FAMILIES, make_problem
from tunix_agentic.envs.math_verify import answers_equal
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.tools import PythonTool, Tool

VERIFY_TIMEOUT_S = 5.0


class MathTasks(TaskSource):
    """Word problems of ``families`` (default: all eight); demonstrations either run the
    problem's Python solution and answer with what it printed, or answer at once."""

    def __init__(self, families: tuple[str, ...] = ()):
        unknown = set(families) - set(FAMILIES)
        if unknown:
            raise ValueError(f"unknown problem families {sorted(unknown)}; known: {list(FAMILIES)}")
        self.families = tuple(families)

    def task(self, index: int, *, seed: int, split: str) -> Task:
        return make_problem(index, seed=seed, split=split, families=self.families)

    def demonstration(
        self, task: Task, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        answer = {"role": "assistant", "content": f"<answer>{task.answer}</answer>"}
        if not use_tools:
            return [answer]
        call = {"name": "python", "arguments": {"code": task.data["code"]}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(task.answer)},  # what the program prints
            answer,
        ]


@register_env("math_python", tasks=MathTasks(), client_kwargs=("max_python_calls",))
class MathPythonEnv(SandboxedEnv):
    """Python tool calls until ``<answer>``; reward 1.0 if the answer equals the expected
    one mathematically, else 0 (status ``answered``). A turn with neither a call nor an
    answer ends the episode with 0 (``no_action``)."""

    tool_types = (PythonTool,)

    def __init__(
        self,
        *,
        sandbox: SandboxConfig | Mapping[str, Any] | None = None,
        tool_timeout: float = 10.0,
        max_python_calls: int = 8,
    ) -> None:
        super().__init__(sandbox=sandbox, tool_timeout=tool_timeout)
        if max_python_calls < 1:
            raise ValueError(f"max_python_calls must be >= 1, got {max_python_calls}")
        self.max_python_calls = max_python_calls
        self._task: Task | None = None
        self._outcome: float | None = None

    def make_tools(self, sandbox: Sandbox) -> dict[str, Tool]:
        return {
            "python": PythonTool(
                sandbox, timeout=self.tool_timeout, max_calls=self.max_python_calls
            )
        }

    async def reset(self, task: Task) -> str:
        if not isinstance(task, Task) or task.answer is None:
            raise TypeError(f"MathPythonEnv needs a Task with an answer, got {task!r:.100}")
        await self.start(task)
        self._task, self._outcome = task, None
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self._task is None or self._outcome is not None:
            raise RuntimeError("step() needs reset() first, and not after the answer")
        if action.answer is not None:
            self._outcome = await self.verify(action.answer)
            return StepResult("", self._outcome, True, {"status": "answered"})
        if not (action.tool_calls or action.parse_errors):
            self._outcome = 0.0
            return StepResult("", 0.0, True, {"status": "no_action"})
        return await self.run_tools(action)

    async def verify(self, answer: str) -> float:
        """1.0 if ``answer`` equals the task's, on a worker thread (sympy is CPU work: the
        event loop keeps serving every other episode); an answer that takes longer than
        ``VERIFY_TIMEOUT_S`` to judge scores 0."""
        assert self._task is not None
        judged = asyncio.get_running_loop().run_in_executor(
            None, answers_equal, answer, str(self._task.answer)
        )
        try:
            return 1.0 if await asyncio.wait_for(judged, VERIFY_TIMEOUT_S) else 0.0
        except TimeoutError:
            return 0.0

    async def evaluate(self) -> float:
        return self._outcome or 0.0
