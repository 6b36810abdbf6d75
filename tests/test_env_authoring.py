"""Writing your own environment: ToolEnvironment, tool schemas, failure counts, start-up checks,
and the docs' key-value example (docs/writing_environments.md) trained from the CLI."""

from __future__ import annotations

import atexit
import collections
import json
import logging
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Literal

import pytest

from tunix_agentic.agent.loop import _record_tool_call
from tunix_agentic.cli.main import main
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.envs import (
    Action,
    CalculatorTool,
    Task,
    ToolCall,
    ToolEnvironment,
    ToolError,
    import_env_modules,
    register_env,
    tool,
)
from tunix_agentic.envs.base import offered_keywords
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks
from tunix_agentic.envs.tool_env import schema_from_signature
from tunix_agentic.envs.tools import Tool, ToolFailureMonitor, call_tool
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.rollout.batch_queue import BatchQueue, _all_filtered_message
from tunix_agentic.rollout.config import RolloutConfig, ServiceConfig
from tunix_agentic.rollout.group import Group
from tunix_agentic.rollout.grouping import StalenessPacer
from tunix_agentic.testing import TINY_RUN_OVERRIDES
from tunix_agentic.trainer import Trainer
from tunix_agentic.trajectory import Trajectory

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs" / "calculator_tiny.yaml")


def _readme_kv_env() -> str:
    """The docs' tool-using example (docs/writing_environments.md), written to a file of this
    test run's own."""
    text = (ROOT / "docs" / "writing_environments.md").read_text()
    match = re.search(r"<!-- example: kv_env.py.*?-->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/writing_environments.md's tool-using environment example is missing"
    path = Path(tempfile.mkdtemp(prefix="tunix-readme-")) / "kv_env.py"
    path.write_text(match.group(1))
    atexit.register(shutil.rmtree, path.parent, True)
    return str(path)


KV_ENV = _readme_kv_env()


class Shapes(Tool):
    name = "shapes"
    description = "Draws a shape."
    parameters = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["circle", "square"]},
            "size": {"type": "integer", "minimum": 1, "maximum": 10},
            "at": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
            },
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["kind"],
    }

    async def run(self, **arguments: Any) -> str:
        return json.dumps(arguments, sort_keys=True)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"kind": "circle", "size": 3, "at": {"x": 1, "y": 2.5}, "tags": ["a"]}, None),
        ({"kind": "oval"}, "argument 'kind' of tool 'shapes': 'oval' is not one of"),
        ({"kind": "circle", "size": 11}, "'size' of tool 'shapes': 11 is greater than the max"),
        ({"kind": "circle", "at": {"x": 1}}, "argument 'at' of tool 'shapes': 'y' is a required"),
        ({"kind": "circle", "at": {"x": 1, "y": "2"}}, "'at.y' of tool 'shapes' must be of type"),
        ({"kind": "circle", "tags": ["a", 3]}, "'tags[1]' of tool 'shapes' must be of type string"),
        ({"size": 2}, "tool 'shapes' is missing required argument(s): kind"),
        ({"kind": "circle", "color": 1}, "unknown argument(s): color (allowed: kind, size"),
    ],
    ids=["ok", "enum", "range", "nested-required", "nested-type", "array-item", "missing", "extra"],
)
async def test_tool_arguments_are_checked_against_the_whole_schema(arguments, message):
    result = await call_tool({"shapes": Shapes()}, ToolCall("shapes", arguments), monitor=None)
    if message is None:
        assert not result.error and json.loads(result.output) == arguments
    else:
        assert result.error and result.kind == "bad_arguments" and message in result.output


def test_a_bad_schema_is_refused_where_the_tool_is_declared():
    with pytest.raises(ValueError, match=r"tool 'broken': parameters is not a valid JSON schema"):

        class Broken(Tool):
            name = "broken"
            description = ""
            parameters = {"type": "object", "properties": {"n": {"type": "integr"}}}

            async def run(self, **arguments: Any) -> str:
                return ""

    with pytest.raises(TypeError, match="argument 'when' has no type hint"):

        @tool
        def untyped(when) -> str:
            return when

    # A hint with no JSON schema lists the hints a tool can take.
    with pytest.raises(TypeError, match=r"argument 'at' has type .*a tool's hints can be str, int"):

        @tool
        def dated(at: complex) -> str:
            return str(at)


def test_schema_from_type_hints():
    def look(key: str, depth: int = 1, mode: Literal["a", "b"] = "a", at: float | None = None):
        return key

    assert schema_from_signature(look) == {
        "type": "object",
        "properties": {
            "key": {"type": "string"},
            "depth": {"type": "integer"},
            "mode": {"enum": ["a", "b"]},
            "at": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        },
        "required": ["key"],
    }


class _Lookup(ToolEnvironment):
    """Tools from a method, a Tool subclass and a plain function; one that raises."""

    tools = [CalculatorTool]

    @tool
    def get(self, key: str) -> str:
        """The value of a key."""
        if key not in self.table:
            raise ToolError(f"no key {key!r}")
        return self.table[key]

    @tool(parameters={"type": "object", "properties": {"d": {"type": "number"}}})
    async def inverse(self, d: float = 1.0) -> str:
        return str(1 / d)

    async def reset(self, task: Task) -> str:
        self.task, self.table = task, dict(task.data)
        return task.prompt

    def reward(self, answer: str) -> float:
        return float(answer == self.task.answer)


async def test_tool_environment_runs_calls_frames_outputs_and_records_them():
    env = _Lookup(tool_timeout=2.0)
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["calculator", "get", "inverse"]
    assert env.tool_schemas()[1]["function"]["description"] == "The value of a key."
    assert await env.reset(Task("t", "find a", answer="7", data={"a": "b", "b": "7"})) == "find a"
    calls = (ToolCall("get", {"key": "a"}), ToolCall("get", {"key": "z"}))
    calls += (ToolCall("inverse", {"d": 0}), ToolCall("calculator", {"expression": "2*"}))
    result = await env.step(Action("...", tool_calls=calls, parse_errors=("bad JSON",)))
    assert not result.done and result.reward == 0.0
    assert [m["role"] for m in result.messages] == ["tool"] * 5
    assert [m["content"] for m in result.messages][:3] == [
        "b",
        "error: no key 'z'",
        "error: ZeroDivisionError: division by zero",
    ]
    assert result.messages[4]["content"] == "error: bad JSON"
    records = result.info["tool_calls"]
    assert [(r["name"], r["error"], r.get("kind")) for r in records] == [
        ("get", False, None),
        ("get", True, "rejected"),
        ("inverse", True, "raised"),
        ("calculator", True, "rejected"),  # a bad expression is the agent's, not the tool's
    ]
    done = await env.step(Action("<answer>7</answer>", answer="7"))
    assert done.done and done.reward == 1.0 and await env.evaluate() == 1.0
    idle = _Lookup()
    await idle.reset(Task("t", "p", answer="1"))
    assert (await idle.step(Action("hm"))).info["status"] == "no_action"
    assert await idle.evaluate() == 0.0


async def test_tool_failures_are_counted_by_tool_and_kind_and_warned_once(caplog):
    monitor = ToolFailureMonitor(threshold=0.1, min_calls=5)
    env = _Lookup()
    await env.reset(Task("t", "p", data={"a": "b"}))
    results = []
    with caplog.at_level(logging.WARNING, logger="tunix_agentic.envs.tools"):
        for i in range(10):
            call = ToolCall("inverse", {"d": 0 if i % 3 == 0 else 2})  # raises 4 times in 10
            results.append(await call_tool(env.tools, call, monitor=monitor))
            call = ToolCall("get", {"key": "z"})  # refused (ToolError): the agent's mistake
            results.append(await call_tool(env.tools, call, monitor=monitor))
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1  # once, for the tool that raises
    assert "tool 'inverse' failed in 2 of its 5 calls" in warnings[0]
    assert "ZeroDivisionError" in warnings[0] and "Traceback" in warnings[0]
    assert monitor.health()["inverse"].failures == 4 and monitor.health()["get"].failures == 0

    metrics = MetricsRecorder(None)
    for res, name in zip(results, ["inverse", "get"] * 10, strict=True):
        _record_tool_call(
            metrics, {"name": name, "seconds": res.seconds, "error": res.error, "kind": res.kind}
        )
    _record_tool_call(
        metrics, {"name": "made_up", "seconds": 0.0, "error": True, "kind": "unknown_tool"}
    )
    out = metrics.write_step(1)
    assert (
        out["count/tool/inverse/error_total"] == 4 and out["count/tool/inverse/raised_total"] == 4
    )
    assert out["count/tool/get/rejected_total"] == 10 and out["time/tool/get_count"] == 10
    assert out["count/tool_calls/unknown_tool_total"] == 1 and "time/tool/made_up_s" not in out


async def test_a_tool_whose_calls_mostly_fail_its_schema_is_warned_once(caplog):
    """Calls refused for their arguments are the agent's mistakes, but most of them failing
    says the schema disagrees with what the model was shown: one warning, with the share
    and the first call's error."""
    monitor = ToolFailureMonitor(min_calls=4)
    env = _Lookup()
    await env.reset(Task("t", "p", data={"a": "b"}))
    with caplog.at_level(logging.WARNING, logger="tunix_agentic.envs.tools"):
        for i in range(8):
            d = 2 if i % 4 == 0 else str(i)  # text where the schema takes a number, 3 in 4
            result = await call_tool(env.tools, ToolCall("inverse", {"d": d}), monitor=monitor)
            assert result.kind == (None if i % 4 == 0 else "bad_arguments")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1, warnings
    assert "tool 'inverse' refused 3 of its 4 calls for their arguments (75%" in warnings[0]
    assert "argument 'd' of tool 'inverse' must be of type number, got string" in warnings[0]
    assert monitor.health()["inverse"].bad_arguments == 6
    with pytest.raises(ValueError, match="arguments_threshold"):
        ToolFailureMonitor(arguments_threshold=1.0)


class _OwnInit(ToolEnvironment):
    def __init__(self, *, hops: int = 2):
        super().__init__()
        self.hops = hops

    async def reset(self, task: Any) -> str:
        return task.prompt


class _BadPrompt(ArithmeticEnv):
    async def reset(self, task):
        await super().reset(task)
        return task.prompt.replace("Compute ", "Compute: ")


class _NumberCalculator(CalculatorTool):  # its schema takes a number; the demos pass text
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "number"}},
        "required": ["expression"],
    }


class _SchemaDisagrees(ArithmeticEnv):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.tools = {"calculator": _NumberCalculator()}


register_env("_test_own_init", tasks=ArithmeticTasks())(_OwnInit)
register_env("_test_bad_prompt", tasks=ArithmeticTasks())(_BadPrompt)
register_env("_test_schema_disagrees", tasks=ArithmeticTasks())(_SchemaDisagrees)


def test_env_tool_timeout_reaches_a_user_environment():
    cfg = load_config(CONFIG, ["env.name=_test_own_init", "env.tool_timeout_s=0.25", "sft.steps=0"])
    env = Trainer(cfg, progress=False).sources.make_env(
        ArithmeticTasks().task(0, seed=0, split="train")
    )
    assert env.tool_timeout == 0.25 and env.hops == 2


@pytest.mark.parametrize(
    "overrides, expected, absent",
    [
        (
            ["env.name=countdown", "env.kwargs={tool_timout: 1}"],
            "env.kwargs: environment 'countdown' takes no keyword 'tool_timout'; did you mean "
            "'tool_timeout'? (it takes: tool_timeout, format_reward)",
            "tasks source",
        ),
        (
            ["env.imprt=x.py"],
            "unknown config key 'env.imprt'; did you mean 'import'? (known keys here: name, "
            "import,",
            "imports",
        ),
        (
            ["env.name=_test_bad_prompt"],
            "tasks source '_test_bad_prompt': reset() returned another prompt than the one its "
            "demonstrations are written for (the task's prompt), first different at character 7",
            None,
        ),
        (
            [f"env.import={KV_ENV}", "env.name=kv", "engine.max_seq_len=64"],
            "tasks source 'kv': a demonstration (kv-train-",
            None,
        ),
        (
            ["env.name=_test_schema_disagrees"],
            "which its tool refuses: argument 'expression' of tool 'calculator' must be of "
            "type number, got string; fix the tool's parameters or the demonstrations",
            "Traceback",
        ),
    ],
    ids=["env-kwarg-typo", "config-key-typo", "reset-prompt", "too-long", "demo-vs-schema"],
)
def test_start_up_checks_name_the_mistake(overrides, expected, absent):
    with pytest.raises(ConfigError) as info:
        Trainer(load_config(CONFIG, overrides), progress=False)
    message = str(info.value)
    assert expected in message
    if absent is not None:
        assert absent not in message
    if "max_seq_len=64" in overrides:
        assert "tokens, 26 over engine.max_seq_len=64" in message


def test_a_run_error_is_not_chained_to_the_event_loop_probe(tmp_path):
    trainer = Trainer(load_config(CONFIG, [f"run_dir={tmp_path}", "sft.steps=0"]), progress=False)

    async def fails():
        raise RuntimeError("the cause")

    trainer._run = fails
    with pytest.raises(RuntimeError, match="the cause") as info:
        trainer.run()
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_an_all_filtered_run_names_the_knobs():
    never = _all_filtered_message(500, [0.0, 0.0])
    assert "never succeeds" in never and "sft.steps" in never
    assert "rollout.filter_uniform_groups=false" in never
    assert "harder" in _all_filtered_message(500, [1.0, 1.0])
    own = _all_filtered_message(500, [1.0, 1.0], own_tasks=True)
    assert "agents' own tasks" in own and "give the agents harder tasks" in own


def _uniform_group(index: int, reward: float) -> Group:
    group = Group(f"g{index}", index, Task(task_id="t", prompt=""), 0, [])
    for member in range(2):
        group.trajectories.append(
            Trajectory(task_id="t", episode_id=f"g{index}-{member}", reward=reward)
        )
    return group


def test_a_run_that_waits_on_filtered_groups_says_why_long_before_it_stops(caplog):
    """An own-task trainer whose agents' tasks the policy always solves keeps waiting for a
    group it can learn from: the wait is a gauge and, after four batches' worth, one
    warning naming the agents' tasks; a kept group ends the streak."""
    service = ServiceConfig(urls=("http://127.0.0.1:1",), agent="own_tasks")
    config = RolloutConfig(
        group_size=2, groups_per_batch=2, max_filtered_in_a_row=40, service=service
    )
    metrics = MetricsRecorder(None)
    queue = BatchQueue(
        config,
        StalenessPacer(2, 1),
        stats=collections.Counter(),
        metrics=metrics,
        done_with=lambda index: None,
        freed=lambda: None,
    )
    assert queue.warn_filtered_at == 16
    with caplog.at_level(logging.WARNING, logger="tunix_agentic.rollout.batch_queue"):
        for index in range(20):
            assert queue.judge(_uniform_group(index, 1.0)) == "filtered"
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned
    assert "16 groups in a row" in warned[0] and "give the agents harder tasks" in warned[0]
    assert "the run stops at 40 in a row" in warned[0]
    assert queue.fatal is None
    mixed = _uniform_group(20, 1.0)
    mixed.trajectories[1].reward = 0.0
    assert queue.judge(mixed) == "keep"
    wrote = metrics.write_step(1)
    assert wrote["gauge/rollout/filtered_streak_groups"] == 0  # the kept group ended the streak
    assert wrote["gauge/rollout/filtered_streak_groups_max"] == 20
    for index in range(21, 61):
        queue.judge(_uniform_group(index, 1.0))
    assert isinstance(queue.fatal, RuntimeError) and "40 groups in a row" in str(queue.fatal)


@pytest.mark.slow
def test_the_readme_example_trains_from_the_cli_with_tool_metrics(tmp_path, capsys):
    import_env_modules(KV_ENV)  # the CLI imports it again: imported once
    run_dir = tmp_path / "kv"
    code = main(
        [
            "train",
            "--quiet",
            f"env.import={KV_ENV}",
            "env.name=kv",
            f"run_dir={run_dir}",
            *TINY_RUN_OVERRIDES,
            # A short, steep warm start on the demonstrations that call get(): enough for
            # the tiny model to call it at all.
            "sft.tool_fraction=1.0",
            "sft.steps=40",
            "sft.optimizer.learning_rate=0.01",
            "sft.optimizer.warmup_steps=0",
            "sft.optimizer.decay_steps=0",
            "rl.steps=1",
            "rl.eval_tasks=2",
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (run_dir / "tensorboard" / "metrics.jsonl").open()]
    seen = {k: v for row in rows for k, v in row.items()}
    assert seen["rollout/tool_use_fraction"] > 0 and seen["eval/tool_use_fraction"] > 0
    assert seen["time/tool/get_count"] > 0


def _names_its_keywords(*, tool_timeout: float = 1.0, sandbox: Any = None) -> Any:
    return ArithmeticEnv()


def _takes_any_keyword(**kwargs: Any) -> Any:
    return ArithmeticEnv()


register_env("_test_names_keywords")(_names_its_keywords)
register_env("_test_any_keyword")(_takes_any_keyword)


@pytest.mark.parametrize(
    "env, offered, given",
    [
        ("_test_names_keywords", {"tool_timeout": 2.0, "sandbox": None}, {"tool_timeout": 2.0}),
        ("_test_names_keywords", {"tool_timeout": 2.0, "other": 1}, {"tool_timeout": 2.0}),
        ("_test_any_keyword", {"tool_timeout": 2.0}, {}),  # **kwargs: it names what it wants
        ("_test_not_registered", {"tool_timeout": 2.0}, {}),  # reported where it is made
    ],
    ids=["named-not-none", "named-only", "var-keyword", "unknown"],
)
def test_run_wide_keywords_reach_factories_that_name_them(env, offered, given):
    assert offered_keywords(env, offered) == given
