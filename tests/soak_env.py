"""The fault soak's environment, registered for rollout nodes (``env.import=``).

``soak_probe``: one real sandbox per episode (``SandboxedEnv``: started in ``reset``,
closed on every path), and one tool, ``probe``, that runs a command in it. Every turn
runs one ``probe`` call through :func:`~tunix_agentic.envs.base.run_tool_calls` (the
model's reply is what the probe is given, as a terminal runs what it is typed), and a
share of those calls fail as a flaky tool would:

* ``crash_rate``: the command kills itself (SIGSEGV) and the tool raises: the agent sees
  an ``error:`` observation, the call is recorded with kind ``raised``;
* ``hang_rate``: the command sleeps an hour; the tool timeout (``env.tool_timeout_s``)
  cuts it, the sandbox kills its process tree, the call is recorded with kind ``timeout``.

and, so that infrastructure faults are met too, ``reset_fail_rate`` of the sandbox
starts fail (``reset`` raises: an infrastructure failure, retried with a fresh
environment, never scored).

The episode ends after ``turns`` probe calls; its reward is the share of calls that
answered. Every command carries ``# <marker>`` in its argv, so a soak can look for its
leftover processes in ``/proc``. A test device only (``tests/soak_rollout.py``).
"""

from __future__ import annotations

import random
from typing import Any

from tunix_agentic.envs.base import (
    Action,
    StepResult,
    Task,
    TaskSource,
    register_env,
    run_tool_calls,
)
from tunix_agentic.envs.sandbox import Sandbox
from tunix_agentic.envs.sandboxed import SandboxedEnv
from tunix_agentic.envs.tools import Tool
from tunix_agentic.envs.tools.base import ToolCall

PROMPT = "Probe the sandbox."


class SoakTasks(TaskSource):
    """Tasks of one fixed prompt (the soak sends its own; this source names the env)."""

    def num_tasks(self, split: str) -> int:
        return 1_000_000

    def task(self, index: int, *, seed: int, split: str) -> Task:
        return Task(task_id=f"{split}-{index}", prompt=PROMPT)


class ProbeTool(Tool):
    name = "probe"
    description = "Run a probe command in the sandbox."
    parameters = {"type": "object", "properties": {}, "required": []}

    def __init__(self, sandbox: Sandbox, rng: random.Random, env: SoakProbeEnv):
        self.sandbox, self.rng, self.env = sandbox, rng, env

    async def run(self) -> str:
        draw = self.rng.random()
        tag = self.env.marker
        if draw < self.env.crash_rate:
            cmd = f"kill -SEGV $$ # {tag}"
        elif draw < self.env.crash_rate + self.env.hang_rate:
            cmd = f"exec sleep 3600 # {tag}"
        else:
            cmd = f"echo ok # {tag}"
        # Far past the tool timeout: only call_tool's timeout may cut a hang.
        res = await self.sandbox.run(cmd, timeout=3600)
        if res.exit_code != 0:
            raise RuntimeError(f"probe crashed (exit {res.exit_code})")
        return res.output.strip()


@register_env("soak_probe", tasks=SoakTasks())
class SoakProbeEnv(SandboxedEnv):
    def __init__(
        self,
        *,
        crash_rate: float = 0.10,
        hang_rate: float = 0.05,
        reset_fail_rate: float = 0.02,
        turns: int = 2,
        marker: str = "tunix-soak",
        sandbox: Any = None,
        tool_timeout: float = 1.0,
    ):
        super().__init__(sandbox=sandbox, tool_timeout=tool_timeout)
        if not (0 <= crash_rate and 0 <= hang_rate and crash_rate + hang_rate <= 1):
            raise ValueError(f"crash_rate + hang_rate must be in [0, 1]: {crash_rate}, {hang_rate}")
        if turns < 1:
            raise ValueError(f"turns must be >= 1, got {turns}")
        if not 0 <= reset_fail_rate <= 1:
            raise ValueError(f"reset_fail_rate must be in [0, 1], got {reset_fail_rate}")
        self.crash_rate, self.hang_rate, self.turns = crash_rate, hang_rate, turns
        self.reset_fail_rate = reset_fail_rate
        self.marker = marker
        self.rng = random.Random()
        self.calls = self.answered = 0

    def make_tools(self, sandbox: Sandbox) -> dict[str, Tool]:
        return {"probe": ProbeTool(sandbox, self.rng, self)}

    async def reset(self, task: Any) -> str:
        await self.start(task)
        if self.rng.random() < self.reset_fail_rate:
            await self.close()  # what a sandbox that died at start leaves: nothing
            raise RuntimeError("the sandbox failed to start (injected)")
        self.calls = self.answered = 0
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        probe = Action(text=action.text, tool_calls=(ToolCall("probe", {}),))
        # The tool's own limit is the timeout (SandboxedEnv adds a backstop on top).
        result = await run_tool_calls(self.tools, probe, timeout=self.tool_timeout)
        self.calls += 1
        self.answered += not result.info["tool_calls"][0]["error"]
        result.done = self.calls >= self.turns
        return result

    async def evaluate(self) -> float:
        return self.answered / max(1, self.calls)
