"""Arithmetic tasks and a calculator tool: the smallest tool-using environment.

The agent is asked to compute an expression such as ``48*73+19``; it may call the
``calculator`` tool and must reply with ``<answer>3523</answer>``. Tasks are generated
deterministically from ``(seed, split, index)``, and the ``train`` and ``heldout`` splits never
share an expression, so held-out accuracy measures generalisation rather than recall.
"""

from __future__ import annotations

import ast
import math
import numbers
import operator
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_agentic.envs.base import (
    SPLITS,
    Action,
    Environment,
    StepResult,
    Task,
    TaskSource,
    register_env,
    run_tool_calls,
)
from tunix_agentic.envs.tools import Tool

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 10
MAX_MAGNITUDE = 1e18

_BINARY_OPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _checked(value: Any) -> int | float:
    """Rejects results that are not finite real numbers within ``MAX_MAGNITUDE``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"result is not a real number: {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("result is not a finite number")
    if abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"result magnitude exceeds {MAX_MAGNITUDE:g}")
    return value


def _eval_node(node: ast.AST) -> int | float:
    """Evaluates one node of an arithmetic AST, rejecting anything but numbers and operators."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ValueError(f"unsupported literal {node.value!r}: only numbers are allowed")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _checked(_UNARY_OPS[type(node.op)](_eval_node(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left = _eval_node(node.left)
        right = _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is out of range (|exponent| <= {MAX_EXPONENT})")
        try:
            return _checked(_BINARY_OPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError(f"result magnitude exceeds {MAX_MAGNITUDE:g}") from None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise ValueError("unsupported operator '^': use ** for powers")
    if isinstance(node, ast.Name):
        raise ValueError(f"names are not allowed: {node.id!r}")
    if isinstance(node, ast.Call):
        raise ValueError("function calls are not allowed")
    raise ValueError(f"unsupported syntax: {type(node).__name__}")


def safe_eval(expression: str) -> int | float:
    """Evaluates an arithmetic expression without ``eval``: numbers, + - * / // % **, parens.

    Raises ``ValueError`` with a message fit to show the agent for anything else: names, calls,
    attributes, strings, an expression over ``MAX_EXPRESSION_CHARS`` characters, division by
    zero, an exponent above ``MAX_EXPONENT`` in magnitude, or any intermediate value above
    ``MAX_MAGNITUDE`` (which keeps every evaluation fast).
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip()
    if not text:
        raise ValueError("expression is empty")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"invalid expression: {exc.msg}") from None
    return _eval_node(tree.body)


def format_number(x: int | float) -> str:
    """Formats a number for the agent: integral values as ints, others to 6 decimals.

    ``3523.0 -> "3523"``, ``-4 -> "-4"``, ``1/3 -> "0.333333"``, ``2.5 -> "2.5"``; trailing
    zeros are dropped and ``-0`` prints as ``"0"``.
    """
    if isinstance(x, numbers.Integral):
        return str(int(x))
    value = float(x)
    if not math.isfinite(value):
        return str(value)
    value = round(value, 6)
    if value.is_integer():
        return str(int(value))
    return f"{value:.6f}".rstrip("0").rstrip(".")


class CalculatorTool(Tool):
    """Evaluates an arithmetic expression; errors surface as tool error observations."""

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression with + - * / // % ** and parentheses, "
        "e.g. '48*73+19'. Returns the numeric result."
    )
    parameters = {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": "The arithmetic expression to evaluate.",
            }
        },
        "required": ["expression"],
    }
    expected_errors = (ValueError,)  # a bad expression is the agent's, not the tool failing

    async def run(self, expression: str) -> str:  # type: ignore[override]
        """Returns ``format_number(safe_eval(expression))``; raises ``ValueError`` on bad input."""
        return format_number(safe_eval(expression))


@dataclass(frozen=True)
class ArithmeticTask:
    """One arithmetic problem: the prompt shown to the agent and the expected answer text."""

    task_id: str
    prompt: str
    expression: str
    answer: str
    task_name: str = "arithmetic"


_HELDOUT_BUCKETS = 10  # one expression in ten (by a stable hash) belongs to "heldout".
_OPERATORS = ("+", "-", "*")


def expression_split(expression: str) -> str:
    """The split an expression belongs to, by a stable hash of its text."""
    return "heldout" if zlib.crc32(expression.encode()) % _HELDOUT_BUCKETS == 0 else "train"


def make_arithmetic_task(index: int, *, seed: int, split: str) -> ArithmeticTask:
    """The ``index``-th task of ``split`` for ``seed``; the same inputs always give the same task.

    Expressions have 2 or 3 two-digit operands joined by ``+``, ``-`` or ``*`` (integer results,
    possibly negative). Draws repeat until the expression's hash assigns it to ``split``, so the
    two splits are disjoint. ``seed`` and ``index`` must be non-negative.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if seed < 0 or index < 0:
        raise ValueError(f"seed and index must be non-negative, got seed={seed}, index={index}")
    # SeedSequence mixes the integers stably across processes (unlike the salted hash()).
    rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index)])
    while True:
        num_operands = int(rng.integers(2, 4))
        operands = [str(int(v)) for v in rng.integers(10, 100, size=num_operands)]
        operators = [_OPERATORS[int(i)] for i in rng.integers(0, len(_OPERATORS), num_operands - 1)]
        expression = operands[0] + "".join(
            o + v for o, v in zip(operators, operands[1:], strict=True)
        )
        if expression_split(expression) == split:
            break
    return ArithmeticTask(
        task_id=f"{split}-{seed}-{index}",
        prompt=f"Compute {expression}.",
        expression=expression,
        answer=format_number(safe_eval(expression)),
    )


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def answers_match(given: str, expected: str) -> bool:
    """Whether an answer equals the expected one: numerically if both are numbers, else as text.

    Surrounding whitespace is ignored, so ``" 3523 "``, ``"3523.0"`` and ``"3523"`` all match.
    """
    given, expected = given.strip(), expected.strip()
    if _NUMBER.fullmatch(given) and _NUMBER.fullmatch(expected):
        return float(given) == float(expected)
    return given == expected


class ArithmeticTasks(TaskSource):
    """The arithmetic task family: :func:`make_arithmetic_task`, and demonstrations for
    the warm start that either use the calculator (call it, read its response, answer) or
    answer at once with a guess that is usually wrong. That mix gives RL something to
    discover: the warm-started policy calls the tool only part of the time, and reward
    teaches it to always do so."""

    def task(self, index: int, *, seed: int, split: str) -> ArithmeticTask:
        return make_arithmetic_task(index, seed=seed, split=split)

    def demonstration(
        self, task: ArithmeticTask, *, rng: np.random.Generator, use_tools: bool
    ) -> list[dict[str, Any]]:
        if use_tools:
            call = {"name": "calculator", "arguments": {"expression": task.expression}}
            return [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "content": task.answer},
                {"role": "assistant", "content": f"<answer>{task.answer}</answer>"},
            ]
        value = int(float(task.answer))
        guess = value + int(rng.choice([-1, 1])) * int(
            rng.integers(1, max(10, abs(value) // 4 + 2))
        )
        return [{"role": "assistant", "content": f"<answer>{guess}</answer>"}]


@register_env("arithmetic", tasks=ArithmeticTasks(), client_kwargs=("tool_timeout",))
class ArithmeticEnv(Environment):
    """Arithmetic with a calculator: tool calls until ``<answer>``; reward 1.0 if it is right.

    A step with an answer ends the episode (reward 1.0 or 0.0, status ``"answered"``). A step
    with tool calls or malformed tool calls runs them in order and returns one
    ``<tool_response>...</tool_response>`` per call and per parse error (status ``"tool"``,
    reward 0). A step with neither ends the episode with reward 0 (status ``"no_action"``).
    Each tool call is limited to ``tool_timeout`` seconds.
    """

    def __init__(self, *, tool_timeout: float = 5.0) -> None:
        super().__init__()
        if tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be positive, got {tool_timeout}")
        self.tool_timeout = tool_timeout
        self.tools = {"calculator": CalculatorTool()}
        self._task: ArithmeticTask | None = None
        self._done = False
        self._answer_reward: float | None = None

    async def reset(self, task: ArithmeticTask | Task) -> str:
        """Starts an episode on ``task`` (an :class:`ArithmeticTask`, or a :class:`Task` with
        a prompt and an answer, e.g. from a task file) and returns its prompt."""
        if isinstance(task, Task):  # a task from a file: its prompt and expected answer
            if task.answer is None:
                raise TypeError(f"task {task.task_id!r} has no answer to check against")
            task = ArithmeticTask(
                task.task_id,
                task.prompt,
                str(task.data.get("expression", "")),
                format_number(task.answer)
                if isinstance(task.answer, int | float)
                else str(task.answer),
                task.task_name,
            )
        if not isinstance(task, ArithmeticTask):
            raise TypeError(
                f"ArithmeticEnv needs an ArithmeticTask or a Task, got {type(task).__name__}"
            )
        self._task = task
        self._done = False
        self._answer_reward = None
        self.step_rewards = []
        return task.prompt

    async def step(self, action: Action) -> StepResult:
        """Applies one action; raises ``RuntimeError`` before ``reset`` or after the episode ends."""
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        if self._done:
            raise RuntimeError("step() called after the episode ended; call reset() first")
        if action.answer is not None:
            reward = 1.0 if answers_match(action.answer, self._task.answer) else 0.0
            self._answer_reward = reward
            result = StepResult(
                observation="", reward=reward, done=True, info={"status": "answered"}
            )
        elif action.tool_calls or action.parse_errors:
            result = await run_tool_calls(self.tools, action, timeout=self.tool_timeout)
        else:
            result = StepResult(observation="", reward=0.0, done=True, info={"status": "no_action"})
        self._done = result.done
        self.step_rewards.append(result.reward)
        return result

    async def evaluate(self) -> float:
        """The reward of the final answer; 0.0 if the agent never answered."""
        return 0.0 if self._answer_reward is None else self._answer_reward
