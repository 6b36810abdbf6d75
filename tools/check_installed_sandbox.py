"""Start a bwrap sandbox and one math_python episode from a regular (non-editable) install.

CI runs it with the interpreter of a fresh virtualenv that holds the project's wheel, so the
sandbox's read-only mounts are the ones a rollout node installed with ``pip install .`` gets
(the package's folders nested under site-packages, hidden inside the sandbox). Exits non-zero,
naming what failed, when either cannot run there.

    python tools/check_installed_sandbox.py
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

import tunix_agentic
from tunix_agentic.envs.base import Action, ToolCall
from tunix_agentic.envs.math_problems import make_problem
from tunix_agentic.envs.math_python import MathPythonEnv, MathTasks
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig


async def main() -> int:
    package = Path(tunix_agentic.__file__).resolve().parent
    if "site-packages" not in package.parts:
        print(f"not a regular install: tunix_agentic is at {package}", file=sys.stderr)
        return 2
    config = SandboxConfig(backend="bwrap")
    async with Sandbox(config) as box:
        done = await box.run(f"ls {package} | wc -l; echo ok", timeout=30)
    out = done.output.strip().splitlines()
    # The package's folder is hidden inside the sandbox: an empty directory there.
    if done.exit_code != 0 or out != ["0", "ok"]:
        print(f"sandbox command failed ({done.exit_code}): {done.output!r}", file=sys.stderr)
        return 1
    task = make_problem(0, seed=0, split="train", families=("power_mod",))
    env = MathPythonEnv(sandbox=config)
    try:
        await env.reset(task)
        demo = MathTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
        result = await env.step(Action(text="", tool_calls=(ToolCall(**demo[0]["tool_calls"][0]),)))
        shown = result.messages[0]["content"]
        answered = await env.step(Action(text="", answer=shown))
    finally:
        await env.close()
    if shown != demo[1]["content"] or answered.reward != 1.0:
        print(
            f"math_python episode failed: tool said {shown!r}, reward {answered.reward}",
            file=sys.stderr,
        )
        return 1
    print(f"sandbox and math_python episode ran from {package} (bwrap; reward {answered.reward})")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
