"""swe_lite: fix a bug in a small generated Python repository, judged on unseen arguments.

Each episode's sandbox holds a repository from :mod:`tunix_agentic.envs.swe_repos`
(``lib/utils.py`` with one bug, ``tests/test_visible.py`` that fails because of
it). The agent has the ``bash`` tool (one persistent shell; run the tests, read
files) and ``file_edit`` (view, replace a line range, create), and replies
``<answer>done</answer>`` when it thinks the tests pass (or runs out of turns).

The EVAL stage judges only the agent's ``lib/utils.py`` (read without following links, at
most 1 MiB): :func:`~tunix_agentic.envs.swe_judge.judge_module` calls its functions in a
fresh sandbox on the visible tests' arguments, fixed edge cases and arguments drawn at random
for this judgement, gets the values back as data, and compares them, in this process, with
the reference implementation's values, which never enter any sandbox. Reward 1.0 when every
value matches. Nothing the agent's code does in its process (printing a verdict, patching
builtins or ``sys.modules``, returning an object equal to everything, exiting early) nor
anything it leaves beside the module (start-up hooks, ``.pth`` files, edited tests, running
processes) can stand in for right answers on arguments it has not seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from tunix_agentic.envs.base import Action, StepResult, Task, TaskSource, register_env
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.swe_judge import check_functions, judge_module, read_module
from tunix_agentic.envs.swe_repos import MODULE, make_repo_task
from tunix_agentic.envs.tools import BashTool, FileEditTool, Tool, numbered, replace_lines


class RepoTasks(TaskSource):
    """Generated buggy repositories; demonstrations view ``lib/utils.py``, replace the bug's
    line with the right one, and reply done (every tool reply exactly as the tool gives it)."""

    def task(self, index: int, *, seed: int, split: str) -> Task:
        return make_repo_task(index, seed=seed, split=split)

    def demonstration(
        self, task: Task, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        lines = task.data["files"][MODULE].splitlines(keepends=True)
        line = task.data["bug_line"]
        view = {"command": "view", "path": MODULE}
        fix = {
            "command": "replace",
            "path": MODULE,
            "start_line": line,
            "end_line": line,
            "text": task.data["fixed"],
        }
        _, replaced = replace_lines(lines, MODULE, line, line, task.data["fixed"])
        return [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "file_edit", "arguments": view}],
            },
            {"role": "tool", "content": numbered(lines, 1)},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"name": "file_edit", "arguments": fix}],
            },
            {"role": "tool", "content": replaced},
            {"role": "assistant", "content": "<answer>done</answer>"},
        ]


@register_env("swe_lite", tasks=RepoTasks())
class SweLiteEnv(SandboxedEnv):
    """Bash and file-edit calls until ``<answer>``; the judge decides the reward in
    EVAL (status ``answered`` when the agent said it was done, ``no_action`` for a turn
    with neither a call nor an answer; both then go to EVAL)."""

    tool_types = (BashTool, FileEditTool)

    def __init__(
        self,
        *,
        sandbox: SandboxConfig | Mapping[str, Any] | None = None,
        tool_timeout: float = 20.0,
        test_timeout: float = 60.0,
    ) -> None:
        super().__init__(sandbox=sandbox, tool_timeout=tool_timeout)
        if not test_timeout > 0:
            raise ValueError(f"test_timeout must be positive, got {test_timeout}")
        self.test_timeout = float(test_timeout)
        self.reward_timeout_s = self.test_timeout + 60.0  # the judge's sandbox start and run
        self._task: Task | None = None
        self._done = False
        self.test_output = ""

    def make_tools(self, sandbox: Sandbox) -> dict[str, Tool]:
        return {
            "bash": BashTool(sandbox, timeout=self.tool_timeout),
            "file_edit": FileEditTool(sandbox),
        }

    async def setup(self, task: Task, sandbox: Sandbox) -> None:
        for path, text in task.data["files"].items():
            sandbox.write_file(path, text)

    async def reset(self, task: Task) -> str:
        if not isinstance(task, Task) or not isinstance(task.data.get("files"), Mapping):
            raise TypeError(f"SweLiteEnv needs a repository Task, got {task!r:.100}")
        check_functions(task.data.get("functions"))
        self._task, self._done, self.test_output = task, False, ""
        await self.start(task)
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self._task is None or self._done:
            raise RuntimeError("step() needs reset() first, and not after the episode ended")
        if action.answer is not None or not (action.tool_calls or action.parse_errors):
            self._done = True
            status = "answered" if action.answer is not None else "no_action"
            return StepResult("", 0.0, True, {"status": status})
        return await self.run_tools(action)

    async def evaluate(self) -> float:
        """Judges the agent's ``lib/utils.py`` (see the module docstring): 1.0 if every
        function returned the reference's value on every argument, else 0.0. A missing,
        non-regular or oversized module scores 0 (the agent's doing, not an infrastructure
        fault). ``test_output`` then says what went wrong, expected values included: it is
        for logs, never for the agent."""
        if self._task is None or self.sandbox is None:
            raise RuntimeError("evaluate() needs an episode (reset first)")
        try:
            module = read_module(self.sandbox)
        except (OSError, ValueError) as exc:
            self.test_output = f"cannot read {MODULE}: {exc}"
            return 0.0
        verdict = await judge_module(
            module,
            self._task.data["functions"],
            self.sandbox_config,
            timeout=self.test_timeout,
        )
        self.test_output = verdict.report
        return verdict.reward
