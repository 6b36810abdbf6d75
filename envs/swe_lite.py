"""swe_lite: fix a bug in a small generated Python repository, judged by hidden tests.

Each episode's sandbox holds a repository from :mod:`tunix_agentic.envs.swe_repos`
(``lib/utils.py`` with one bug, ``tests/test_visible.py`` that fails because of
it). The agent has the ``bash`` tool (one persistent shell; run the tests, read
files) and ``file_edit`` (view, replace a line range, create), and replies
``<answer>done</answer>`` when it thinks the tests pass (or runs out of turns).
The EVAL stage then restores the original test files, adds the hidden tests and
runs both suites in the sandbox: reward 1.0 if every test ran and passed.

The check counts the tests that ran, so deleting or emptying tests earns
nothing; an agent that patched ``unittest`` itself from ``lib/`` could still
fool it (the repository is the agent's to edit), which a stricter verifier
would run in a fresh sandbox with only ``lib/`` copied over.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunix_agentic.envs.base import Action, StepResult, Task, TaskSource, register_env
from tunix_agentic.envs.file_edit import FileEditTool, numbered, replace_lines
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.swe_repos import HIDDEN_TESTS, MODULE, VISIBLE_TESTS, make_repo_task
from tunix_agentic.envs.terminal import BashTool
from tunix_agentic.envs.tools import Tool

# Stale bytecode must not decide: an edit within the same second keeps the source's mtime
# and size, and Python would reuse the old .pyc, so caches go and none are written.
TEST_COMMAND = (
    "find . -name __pycache__ -prune -exec rm -rf {} + ; "
    f"python -B -m unittest -v tests.{VISIBLE_TESTS[6:-3]} tests.{HIDDEN_TESTS[6:-3]}"
)
_RAN = re.compile(r"^Ran (\d+) tests? in ", re.MULTILINE)


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
    """Bash and file-edit calls until ``<answer>``; the hidden tests decide the reward in
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
        if not isinstance(task, Task) or "files" not in task.data:
            raise TypeError(f"SweLiteEnv needs a repository Task, got {task!r:.100}")
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
        """Restores the test files, adds the hidden ones, runs both: 1.0 if all ran and passed."""
        if self._task is None or self.sandbox is None:
            raise RuntimeError("evaluate() needs an episode (reset first)")
        files = self._task.data["files"]
        for path in ("tests/__init__.py", VISIBLE_TESTS):
            self.sandbox.write_file(path, files[path])
        for path, text in self._task.data["hidden"].items():
            self.sandbox.write_file(path, text)
        result = await self.sandbox.run(TEST_COMMAND, timeout=self.test_timeout)
        self.test_output = result.output
        ran = _RAN.search(result.output)
        expected = sum(
            text.count("    def test_")
            for path, text in {**files, **self._task.data["hidden"]}.items()
            if path.startswith("tests/test_")
        )
        ok = result.exit_code == 0 and not result.timed_out and ran is not None
        return 1.0 if ok and int(ran.group(1)) == expected else 0.0
