"""Tests for tunix_agentic.envs: the calculator, tool validation and calls, the registry, ArithmeticEnv."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tunix_agentic.envs import (
    Action,
    ArithmeticEnv,
    ArithmeticTask,
    CalculatorTool,
    Environment,
    StepResult,
    Tool,
    ToolCall,
    ToolUnavailable,
    available_envs,
    call_tool,
    format_number,
    make_arithmetic_task,
    make_env,
    register_env,
    safe_eval,
)
from tunix_agentic.envs.calculator import answers_match, expression_split

# --- safe_eval / format_number -------------------------------------------------------------


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("48*73+19", 3523),
        ("91-17*3", 40),
        ("10-99*2", -188),
        ("(1+2)*3", 9),
        ("-4", -4),
        ("+-+4", -4),
        ("7/2", 3.5),
        ("7//2", 3),
        ("-7//2", -4),
        ("7%3", 1),
        ("2**10", 1024),
        ("2**-1", 0.5),
        ("1.5*2", 3.0),
        ("  12 + 3  ", 15),
    ],
    ids=[
        "task-form",
        "precedence",
        "negative",
        "parens",
        "unary-minus",
        "unary-chain",
        "true-div",
        "floor-div",
        "floor-div-neg",
        "mod",
        "pow",
        "neg-pow",
        "float",
        "whitespace",
    ],
)
def test_safe_eval_valid(expression: str, expected: float) -> None:
    assert safe_eval(expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os')", "function calls"),
        ("__import__('os').system('ls')", "function calls"),
        ("().__class__.__bases__", "unsupported syntax"),
        ("a+1", "names are not allowed"),
        ("(1).__class__", "unsupported syntax"),
        ("'ab'*3", "only numbers"),
        ("True+1", "only numbers"),
        ("[1, 2]", "unsupported syntax"),
        ("lambda: 1", "unsupported syntax"),
        ("1 if 1 else 2", "unsupported syntax"),
        ("2**100000", "exponent"),
        ("9**9**9", "exponent"),
        ("10**10*10**10", "magnitude"),
        ("1e999", "finite"),
        ("1/0", "division by zero"),
        ("5//0", "division by zero"),
        ("5%0", "division by zero"),
        ("0**-1", "division by zero"),
        ("(-8)**0.5", "real number"),
        ("2^3", r"use \*\* for powers"),
        ("1 < 2", "unsupported syntax"),
        ("1+", "invalid expression"),
        ("", "empty"),
        ("1+" * 150 + "1", "longer than"),
    ],
    ids=[
        "import-call",
        "import-attribute",
        "class-walk",
        "name",
        "dunder-attribute",
        "string",
        "bool",
        "list",
        "lambda",
        "ifexp",
        "huge-exponent",
        "tower",
        "huge-result",
        "inf-literal",
        "div-zero",
        "floordiv-zero",
        "mod-zero",
        "pow-zero-neg",
        "complex",
        "xor",
        "compare",
        "syntax",
        "empty",
        "too-long",
    ],
)
def test_safe_eval_rejects(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        safe_eval(expression)


@pytest.mark.parametrize(
    "value, expected",
    [
        (3523, "3523"),
        (-4, "-4"),
        (3523.0, "3523"),
        (-4.0, "-4"),
        (2.5, "2.5"),
        (1 / 3, "0.333333"),
        (-2 / 3, "-0.666667"),
        (0.1 + 0.2, "0.3"),
        (-1e-9, "0"),
        (1234.5678, "1234.5678"),
    ],
    ids=[
        "int",
        "neg-int",
        "integral-float",
        "neg-integral",
        "half",
        "third",
        "neg",
        "fp-noise",
        "neg-zero",
        "decimals",
    ],
)
def test_format_number(value: float, expected: str) -> None:
    assert format_number(value) == expected


@pytest.mark.parametrize(
    "given, expected, match",
    [
        ("3523", "3523", True),
        (" 3523\n", "3523", True),
        ("3523.0", "3523", True),
        ("-18", "-18", True),
        ("3524", "3523", False),
        ("3,523", "3523", False),
        ("about 3523", "3523", False),
        ("", "3523", False),
    ],
    ids=["exact", "whitespace", "float-form", "negative", "wrong", "comma", "prose", "empty"],
)
def test_answers_match(given: str, expected: str, match: bool) -> None:
    assert answers_match(given, expected) is match


# --- tools ---------------------------------------------------------------------------------


class TypedTool(Tool):
    """A tool with one parameter of each JSON type, echoing its arguments."""

    name = "typed"
    description = "Echoes typed arguments."
    parameters = {
        "type": "object",
        "properties": {
            "s": {"type": "string"},
            "n": {"type": "number"},
            "i": {"type": "integer"},
            "b": {"type": "boolean"},
            "o": {"type": "object"},
            "a": {"type": "array"},
        },
        "required": ["s"],
    }

    async def run(self, **arguments: Any) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(arguments.items()))


class SleepTool(Tool):
    """Sleeps for the given seconds; used to exercise timeouts."""

    name = "sleep"
    description = "Sleeps."
    parameters = {
        "type": "object",
        "properties": {"seconds": {"type": "number"}},
        "required": ["seconds"],
    }

    async def run(self, seconds: float) -> str:  # type: ignore[override]
        await asyncio.sleep(seconds)
        return "slept"


class FailingTool(Tool):
    """Always raises, including a TimeoutError of its own."""

    name = "fail"
    description = "Fails."
    parameters = {"type": "object", "properties": {"kind": {"type": "string"}}, "required": []}

    async def run(self, kind: str = "value") -> str:  # type: ignore[override]
        if kind == "timeout":
            raise TimeoutError("upstream slow")
        if kind == "infra":
            raise ToolUnavailable("sandbox died")
        raise KeyError("boom")


TOOLS: dict[str, Tool] = {t.name: t for t in (TypedTool(), SleepTool(), FailingTool())}


def test_tool_schema() -> None:
    schema = CalculatorTool().schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"s": "x"}, None),
        ({"s": "x", "n": 1.5, "i": 3, "b": True, "o": {}, "a": [1]}, None),
        ({"s": "x", "n": 2}, None),
        (["s"], "must be a JSON object, got array"),
        ("s=x", "must be a JSON object, got string"),
        ({}, "missing required argument(s): s"),
        ({"s": "x", "z": 1}, "unknown argument(s): z (allowed: s, n, i, b, o, a)"),
        ({"s": 1}, "argument 's' of tool 'typed' must be of type string, got integer"),
        ({"s": "x", "n": "1"}, "'n' of tool 'typed' must be of type number, got string"),
        ({"s": "x", "n": True}, "'n' of tool 'typed' must be of type number, got boolean"),
        ({"s": "x", "i": 1.5}, "'i' of tool 'typed' must be of type integer, got number"),
        ({"s": "x", "b": 1}, "'b' of tool 'typed' must be of type boolean, got integer"),
        ({"s": "x", "o": []}, "'o' of tool 'typed' must be of type object, got array"),
        ({"s": "x", "a": {}}, "'a' of tool 'typed' must be of type array, got object"),
    ],
    ids=[
        "ok-required-only",
        "ok-all-types",
        "ok-int-as-number",
        "not-dict-list",
        "not-dict-str",
        "missing",
        "unknown",
        "wrong-string",
        "wrong-number",
        "bool-not-number",
        "wrong-integer",
        "wrong-boolean",
        "wrong-object",
        "wrong-array",
    ],
)
def test_tool_validate(arguments: Any, message: str | None) -> None:
    error = TOOLS["typed"].validate(arguments)
    if message is None:
        assert error is None
    else:
        assert error is not None and message in error


async def test_call_tool_passes_infrastructure_faults_through() -> None:
    # Not the agent's fault, so not an observation: the episode ends as tool_error.
    with pytest.raises(ToolUnavailable, match="sandbox died"):
        await call_tool(TOOLS, ToolCall("fail", {"kind": "infra"}), timeout=0.05)


@pytest.mark.parametrize(
    "call, expected",
    [
        (ToolCall("nope", {}), "error: unknown tool 'nope' (available tools: fail, sleep, typed)"),
        (ToolCall("typed", {}), "error: tool 'typed' is missing required argument(s): s"),
        (ToolCall("fail", {}), "error: KeyError: 'boom'"),
        (ToolCall("fail", {"kind": "timeout"}), "error: TimeoutError: upstream slow"),
        (ToolCall("sleep", {"seconds": 5}), "error: tool 'sleep' timed out after 0.05s"),
    ],
    ids=["unknown-tool", "bad-args", "exception", "own-timeout-error", "timeout"],
)
async def test_call_tool_errors(call: ToolCall, expected: str) -> None:
    result = await call_tool(TOOLS, call, timeout=0.05)
    assert result.error is True
    assert result.output == expected
    assert result.seconds >= 0.0


@pytest.mark.parametrize(
    "tools, call, expected",
    [
        (TOOLS, ToolCall("typed", {"s": "x", "i": 2}), "i=2,s=x"),
        (TOOLS, ToolCall("sleep", {"seconds": 0}), "slept"),
        (
            {"calculator": CalculatorTool()},
            ToolCall("calculator", {"expression": "48*73+19"}),
            "3523",
        ),
    ],
    ids=["typed", "sleep-no-timeout", "calculator"],
)
async def test_call_tool_success(tools: dict[str, Tool], call: ToolCall, expected: str) -> None:
    result = await call_tool(tools, call)
    assert result.error is False
    assert result.output == expected


async def test_call_tool_calculator_error_is_result() -> None:
    tools = {"calculator": CalculatorTool()}
    result = await call_tool(tools, ToolCall("calculator", {"expression": "__import__('os')"}))
    assert result.error is True
    assert result.output == "error: ValueError: function calls are not allowed"


async def test_call_tool_propagates_cancellation() -> None:
    task = asyncio.create_task(call_tool(TOOLS, ToolCall("sleep", {"seconds": 10}), timeout=20))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


# --- registry ------------------------------------------------------------------------------


def test_registry_makes_arithmetic() -> None:
    assert "arithmetic" in available_envs()
    env = make_env("arithmetic", tool_timeout=1.0)
    assert isinstance(env, ArithmeticEnv)
    assert env.tool_timeout == 1.0
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["calculator"]


def test_registry_unknown_name_lists_known() -> None:
    with pytest.raises(ValueError, match=r"unknown environment 'nope'.*arithmetic"):
        make_env("nope")


class _SumEnv(Environment):
    """A minimal environment using the base class defaults."""

    async def reset(self, task: Any) -> str:
        self.step_rewards = []
        return str(task)

    async def step(self, action: Action) -> StepResult:
        reward = float(action.text)
        self.step_rewards.append(reward)
        return StepResult(observation="ok", reward=reward, done=False)


async def test_register_env_and_base_defaults() -> None:
    register_env("_test_sum")(_SumEnv)
    register_env("_test_sum")(_SumEnv)  # the same factory again is allowed (module reload)
    with pytest.raises(ValueError, match="already registered"):
        register_env("_test_sum")(ArithmeticEnv)
    env = make_env("_test_sum")
    assert env.tools == {} and env.tool_schemas() == []
    await env.reset("t")
    await env.step(Action(text="0.5"))
    await env.step(Action(text="0.25"))
    assert await env.evaluate() == 0.75
    await env.close()
    await env.close()


# --- ArithmeticEnv -------------------------------------------------------------------------

TASK = ArithmeticTask(
    task_id="t-0", prompt="Compute 48*73+19.", expression="48*73+19", answer="3523"
)


def calc(expression: Any) -> ToolCall:
    return ToolCall("calculator", {"expression": expression})


async def test_arithmetic_episode() -> None:
    env = ArithmeticEnv()
    assert await env.reset(TASK) == "Compute 48*73+19."

    result = await env.step(
        Action(text="<tool_call>...</tool_call>", tool_calls=(calc("48*73+19"),))
    )
    assert result.observation == "<tool_response>3523</tool_response>"
    assert (result.reward, result.done) == (0.0, False)
    assert result.info["status"] == "tool"
    [record] = result.info["tool_calls"]
    assert record["name"] == "calculator" and record["error"] is False
    assert record["seconds"] >= 0.0

    result = await env.step(Action(text="<answer>3523</answer>", answer="3523"))
    assert result == StepResult(observation="", reward=1.0, done=True, info={"status": "answered"})
    assert await env.evaluate() == 1.0
    await env.close()
    await env.close()


@pytest.mark.parametrize(
    "answer, reward",
    [("3523", 1.0), (" 3523.0 ", 1.0), ("3524", 0.0), ("three thousand", 0.0), ("", 0.0)],
    ids=["right", "right-float-form", "wrong", "prose", "empty"],
)
async def test_arithmetic_answer_reward(answer: str, reward: float) -> None:
    env = ArithmeticEnv()
    await env.reset(TASK)
    result = await env.step(Action(text=f"<answer>{answer}</answer>", answer=answer))
    assert (result.reward, result.done, result.info["status"]) == (reward, True, "answered")
    assert await env.evaluate() == reward


async def test_arithmetic_answer_wins_over_tool_calls() -> None:
    env = ArithmeticEnv()
    await env.reset(TASK)
    result = await env.step(Action(text="x", tool_calls=(calc("1+1"),), answer="3523"))
    assert (result.reward, result.done) == (1.0, True)


async def test_arithmetic_tool_errors_and_parse_errors() -> None:
    env = ArithmeticEnv()
    await env.reset(TASK)
    action = Action(
        text="...",
        tool_calls=(calc("1/0"), ToolCall("search", {"q": "x"}), calc(7), calc("2+2")),
        parse_errors=("invalid JSON in <tool_call>: Expecting value",),
    )
    result = await env.step(action)
    assert result.observation == (
        "<tool_response>error: ValueError: division by zero</tool_response>"
        "<tool_response>error: unknown tool 'search' (available tools: calculator)</tool_response>"
        "<tool_response>error: argument 'expression' of tool 'calculator' must be of type "
        "string, got integer</tool_response>"
        "<tool_response>4</tool_response>"
        "<tool_response>error: invalid JSON in <tool_call>: Expecting value</tool_response>"
    )
    assert (result.reward, result.done, result.info["status"]) == (0.0, False, "tool")
    assert [r["error"] for r in result.info["tool_calls"]] == [True, True, True, False]
    assert [r["name"] for r in result.info["tool_calls"]] == [
        "calculator",
        "search",
        "calculator",
        "calculator",
    ]


async def test_arithmetic_parse_error_only() -> None:
    env = ArithmeticEnv()
    await env.reset(TASK)
    result = await env.step(Action(text="<tool_call>{oops", parse_errors=("bad json",)))
    assert result.observation == "<tool_response>error: bad json</tool_response>"
    assert result.done is False and result.info["tool_calls"] == []


async def test_arithmetic_no_action() -> None:
    env = ArithmeticEnv()
    await env.reset(TASK)
    result = await env.step(Action(text="I think it is about 3500."))
    assert result == StepResult(observation="", reward=0.0, done=True, info={"status": "no_action"})
    assert await env.evaluate() == 0.0


async def test_arithmetic_lifecycle_errors() -> None:
    env = ArithmeticEnv()
    with pytest.raises(RuntimeError, match="before reset"):
        await env.step(Action(text="hi"))
    await env.reset(TASK)
    await env.step(Action(text="<answer>1</answer>", answer="1"))
    with pytest.raises(RuntimeError, match="episode ended"):
        await env.step(Action(text="again"))
    # reset starts a fresh episode and clears the previous answer.
    await env.reset(TASK)
    assert await env.evaluate() == 0.0
    with pytest.raises(TypeError):
        await env.reset({"prompt": "Compute 1+1."})


def test_arithmetic_rejects_bad_timeout() -> None:
    with pytest.raises(ValueError, match="tool_timeout"):
        ArithmeticEnv(tool_timeout=0)


# --- task generation -----------------------------------------------------------------------


def test_tasks_deterministic_and_well_formed() -> None:
    for split in ("train", "heldout"):
        tasks = [make_arithmetic_task(i, seed=3, split=split) for i in range(200)]
        assert tasks == [make_arithmetic_task(i, seed=3, split=split) for i in range(200)]
        for i, task in enumerate(tasks):
            assert task.task_id == f"{split}-3-{i}"
            assert task.prompt == f"Compute {task.expression}."
            assert task.answer == str(safe_eval(task.expression))
            assert expression_split(task.expression) == split
            operands = task.expression.replace("+", " ").replace("-", " ").replace("*", " ")
            assert len(operands.split()) in (2, 3)
            assert all(10 <= int(v) <= 99 for v in operands.split())
    assert make_arithmetic_task(0, seed=3, split="train") != make_arithmetic_task(
        0, seed=4, split="train"
    )
    answers = {make_arithmetic_task(i, seed=0, split="train").answer for i in range(200)}
    assert any(a.startswith("-") for a in answers)


def test_splits_disjoint() -> None:
    train = {make_arithmetic_task(i, seed=0, split="train").expression for i in range(2000)}
    heldout = {make_arithmetic_task(i, seed=0, split="heldout").expression for i in range(2000)}
    assert len(heldout) > 1500  # mostly distinct, so the check below means something
    assert not train & heldout


@pytest.mark.parametrize(
    "kwargs",
    [{"seed": 0, "split": "test"}, {"seed": -1, "split": "train"}],
    ids=["bad-split", "negative-seed"],
)
def test_make_task_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        make_arithmetic_task(0, **kwargs)
