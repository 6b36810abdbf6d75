"""swe_lite: fix a bug in a small generated Python repository, judged by hidden tests.

Each episode's sandbox holds a repository from :mod:`tunix_agentic.envs.swe_repos`
(``lib/utils.py`` with one bug, ``tests/test_visible.py`` that fails because of
it). The agent has the ``bash`` tool (one persistent shell; run the tests, read
files) and ``file_edit`` (view, replace a line range, create), and replies
``<answer>done</answer>`` when it thinks the tests pass (or runs out of turns).

The EVAL stage judges only the agent's ``lib/utils.py``: it is copied into a
fresh sandbox beside the original ``lib/__init__.py`` and test files and the
hidden tests, and a harness runs them in an isolated interpreter (``python -I
-B``: no working directory on the path, so nothing of the agent's can stand in
for ``unittest``). The harness reads a one-time token from its stdin before
importing the code under test and prints it with the counts, and checks after
the run that the assertion methods are still unittest's own: reward 1.0 when
every expected test ran and passed. The code under test still runs in the
harness's process, so a determined agent could forge more than this checks
(e.g. patch ``int.__eq__``-like behaviour through C extensions it cannot
build here, or ``sys.modules`` tricks beyond the assertion check).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import numpy as np

from tunix_agentic.envs.base import Action, StepResult, Task, TaskSource, register_env
from tunix_agentic.envs.file_edit import FileEditTool, numbered, replace_lines
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.swe_repos import MODULE, VISIBLE_TESTS, make_repo_task
from tunix_agentic.envs.terminal import BashTool
from tunix_agentic.envs.tools import Tool

HARNESS = "judge_harness.py"
# Runs in the judging sandbox as `python -I -B judge_harness.py`. The token comes first on
# stdin, before any code under test is imported; the verdict line carries it.
_HARNESS_SOURCE = """\
import sys, unittest
token = sys.stdin.readline().strip()
checked = ("assertEqual", "assertTrue", "assertFalse", "assertRaises")
originals = {name: getattr(unittest.TestCase, name) for name in checked}
sys.path.insert(0, "/workspace" if len(sys.argv) < 2 else sys.argv[1])
suite = unittest.defaultTestLoader.loadTestsFromNames(sys.argv[2:])
result = unittest.TextTestRunner(stream=sys.stderr, verbosity=0).run(suite)
intact = all(getattr(unittest.TestCase, n) is originals[n] for n in checked)
print(token, result.testsRun, len(result.failures) + len(result.errors), int(intact))
"""


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
        """Judges the agent's ``lib/utils.py`` in a fresh sandbox (see the module docstring):
        1.0 if every visible and hidden test ran and passed, else 0.0. A missing or
        unreadable module scores 0 (the agent's doing, not an infrastructure fault)."""
        if self._task is None or self.sandbox is None:
            raise RuntimeError("evaluate() needs an episode (reset first)")
        try:
            module = self.sandbox.read_file(MODULE)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            self.test_output = f"cannot read {MODULE}: {exc}"
            return 0.0
        files = {**self._task.data["files"], **self._task.data["hidden"], MODULE: module}
        names = [p[:-3].replace("/", ".") for p in (VISIBLE_TESTS, *self._task.data["hidden"])]
        expected = sum(
            text.count("    def test_")
            for path, text in files.items()
            if path.startswith("tests/test_")
        )
        token = secrets.token_hex(16)
        async with Sandbox(self.sandbox_config) as judge:
            for path, text in files.items():
                judge.write_file(path, text)
            judge.write_file(HARNESS, _HARNESS_SOURCE)
            result = await judge.run(
                ["python", "-I", "-B", HARNESS, judge.cwd or ".", *names],
                timeout=self.test_timeout,
                input=token + "\n",
            )
        self.test_output = result.output
        verdict = [line.split() for line in result.output.splitlines() if line.startswith(token)]
        if result.timed_out or len(verdict) != 1 or len(verdict[0]) != 4:
            return 0.0
        _, ran, failed, intact = verdict[0]
        return 1.0 if (int(ran), int(failed), intact) == (expected, 0, "1") else 0.0
