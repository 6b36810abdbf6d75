"""Countdown: reach a target number from given numbers with + - * / (TinyZero's task).

The agent sees ``Make 125 from 3 7 25 50 with + - * / and parentheses, each number
at most once.`` and answers ``<answer>(50-25)*(7-3)+25</answer>``: invalid, since it
uses 25 twice; ``<answer>50/(7-3)*...`` and so on. The calculator tool is there to
check a candidate. Reward 1.0 for an expression that uses only the given numbers,
each at most once, and equals the target exactly (fractions are exact: ``7/2*2`` is
7); otherwise ``format_reward`` (default 0) if the answer is at least a valid
expression of the given numbers.
"""

from __future__ import annotations

import ast
import zlib
from fractions import Fraction
from typing import Any

import numpy as np

from tunix_agentic.envs.base import (
    Action,
    Environment,
    StepResult,
    Task,
    TaskSource,
    register_env,
    run_tool_calls,
)
from tunix_agentic.envs.calculator import MAX_EXPRESSION_CHARS, CalculatorTool

_OPS = ("+", "-", "*", "/")


def check_expression(expression: str, numbers: list[int]) -> Fraction:
    """The exact value of ``expression`` if it uses only + - * /, parentheses and the
    given ``numbers`` (each at most once); raises ``ValueError`` saying what is wrong."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"invalid expression: {exc.msg}") from None
    available = list(numbers)

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if node.value not in available:
                raise ValueError(f"{node.value} is not one of the numbers left to use")
            available.remove(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and isinstance(
            node.op, ast.Add | ast.Sub | ast.Mult | ast.Div
        ):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Sub):
                return left - right
            if isinstance(node.op, ast.Mult):
                return left * right
            if right == 0:
                raise ValueError("division by zero")
            return left / right
        raise ValueError("only the given numbers, + - * / and parentheses are allowed")

    return value(tree.body)


class CountdownTasks(TaskSource):
    """Countdown tasks generated from (seed, split, index): 3 or 4 numbers from 1-100 and a
    target in 10-999 reached by a random expression over some of them (so every task
    is solvable). Held-out and train tasks never share a number set and target."""

    def task(self, index: int, *, seed: int, split: str) -> Task:
        rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index), 17])
        while True:
            count = int(rng.integers(3, 5))
            numbers = sorted(int(v) for v in rng.integers(1, 101, size=count))
            used = int(rng.integers(2, count + 1))
            picks = [numbers[i] for i in rng.permutation(count)[:used]]
            expression = str(picks[0])
            for n in picks[1:]:  # left to right, parenthesised: each step exact
                op = _OPS[int(rng.integers(0, 4))]
                expression = (
                    f"({expression}){op}{n}"
                    if op in "*/" and not expression.isdigit()
                    else f"{expression}{op}{n}"
                )
            try:
                target = check_expression(expression, numbers)
            except ValueError:
                continue
            if target.denominator != 1 or not 10 <= target <= 999:
                continue
            key = f"{numbers}->{target}"
            if ("heldout" if zlib.crc32(key.encode()) % 10 == 0 else "train") != split:
                continue
            nums = " ".join(map(str, numbers))
            return Task(
                task_id=f"countdown-{split}-{seed}-{index}",
                prompt=(
                    f"Make {int(target)} from {nums} with + - * / and parentheses, "
                    "each number at most once."
                ),
                answer=int(target),
                data={"numbers": numbers, "solution": expression},
            )

    def demonstration(
        self, task: Task, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        solution = task.data["solution"]
        answer = {"role": "assistant", "content": f"<answer>{solution}</answer>"}
        if not use_tools:
            return [answer]
        call = {"name": "calculator", "arguments": {"expression": solution}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": str(task.answer)},
            answer,
        ]


@register_env("countdown", tasks=CountdownTasks(), client_kwargs=("tool_timeout", "format_reward"))
class CountdownEnv(Environment):
    """Countdown with a calculator: tool calls until ``<answer>expression</answer>``.

    A step with an answer ends the episode (status ``"answered"``; reward 1.0 if it is a
    valid expression equal to the target, ``format_reward`` if it is a valid expression
    of the given numbers that misses, else 0). Tool calls get one
    ``<tool_response>`` each; a turn with neither ends the episode with 0.
    """

    def __init__(self, *, tool_timeout: float = 5.0, format_reward: float = 0.0) -> None:
        super().__init__()
        if tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be positive, got {tool_timeout}")
        self.tool_timeout, self.format_reward = tool_timeout, format_reward
        self.tools = {"calculator": CalculatorTool()}
        self._task: Task | None = None
        self._outcome: float | None = None

    async def reset(self, task: Task) -> str:
        if not isinstance(task, Task) or "numbers" not in task.data:
            raise TypeError(f"CountdownEnv needs a countdown Task, got {task!r:.100}")
        self._task, self._outcome = task, None
        self.step_rewards = []
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        if self._task is None or self._outcome is not None:
            raise RuntimeError("step() needs reset() first, and not after the answer")
        if action.answer is not None:
            self._outcome = self.score(action.answer)
            return StepResult("", self._outcome, True, {"status": "answered"})
        if not (action.tool_calls or action.parse_errors):
            self._outcome = 0.0
            return StepResult("", 0.0, True, {"status": "no_action"})
        return await run_tool_calls(self.tools, action, timeout=self.tool_timeout)

    def score(self, answer: str) -> float:
        """1.0 for a valid expression equal to the target, ``format_reward`` for a valid
        one that misses, 0.0 otherwise."""
        assert self._task is not None
        try:
            value = check_expression(answer, list(self._task.data["numbers"]))
        except ValueError:
            return 0.0
        return 1.0 if value == Fraction(str(self._task.answer)) else self.format_reward

    async def evaluate(self) -> float:
        return self._outcome or 0.0
