"""Checks of a run's environments before any work, for the mistakes a new environment makes.

:func:`check_sources` (called by :class:`~tunix_agentic.trainer.Trainer` at init, about a
second) plays one probe of every local task source's environment: ``reset`` on its first
training task must return the prompt text (a ``str``) and one ``step`` on an empty action
a :class:`~tunix_agentic.envs.base.StepResult` (the environment contract: a wrong type
stops the run at once with an :class:`EnvContractError` naming the method, the expected
type and the method's file and line, instead of every episode failing as an
infrastructure fault). For sources with demonstrations (when ``sft.steps > 0``) it also
compares the prompt with the one the demonstrations are written for, and checks that
demonstrations fit the engine's ``max_seq_len``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
from typing import Any

import numpy as np

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.config import RunConfig
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.data.sources import RunSources
from tunix_agentic.data.tasks import task_dataset
from tunix_agentic.envs.base import Action, StepResult
from tunix_agentic.envs.tools.base import validate_arguments
from tunix_agentic.trajectory import task_key

_log = logging.getLogger(__name__)

# Demonstrations measured per source (both with and without tools): cheap, and enough to
# catch a task family whose episodes are too long for the model.
DEMOS_MEASURED = 8
RESET_TIMEOUT_S = 30.0


class EnvContractError(ValueError):
    """An environment's method returned the wrong type (the message names the method, the
    expected type, what came back, and the method's file and line)."""


def check_sources(sources: RunSources, template: ChatFormat, config: RunConfig) -> None:
    """Raises :class:`EnvContractError` when a task source's environment breaks the
    contract (``reset`` not returning a ``str``, ``step`` not a ``StepResult``), and
    ``ValueError`` naming the task source whose ``reset`` gives another prompt than its
    demonstrations' (where they first differ), whose demonstrations call a tool with
    arguments its schema refuses, or whose demonstrations do not fit
    ``engine.max_seq_len`` (by how many tokens). The contract is checked for every source,
    the rest only for sources with demonstrations when ``sft.steps > 0``; remote
    environments are not probed here, and a probe that raises is only logged (the run
    retries those as infrastructure faults)."""
    max_len = config.engine.max_seq_len
    for name, spec in sources.specs.items():
        source = sources.sources[name]
        demos = bool(config.sft.steps) and source.has_demonstrations
        if spec.env == "remote" and not demos:
            continue
        tasks = task_dataset(source, seed=config.seed + 7919, split="train")
        first = tasks[0]
        if spec.env != "remote":
            prompt = _probe(name, sources, first)
            if demos and prompt is not None:
                _compare_prompt(name, prompt, getattr(first, "prompt", None))
        if not demos:
            continue
        tools = sources.make_env(_named(first, name)).tool_schemas()
        longest, longest_task = 0, first
        rng = np.random.default_rng(config.seed)
        for i in range(min(DEMOS_MEASURED, len(tasks))):
            task = tasks[i]
            for use_tools in (True, False):
                messages = source.demonstration(task, rng=rng, use_tools=use_tools)
                if messages is None:
                    continue
                _check_calls(name, task, messages, tools)
                try:
                    traj = demonstration_trajectory(
                        task.prompt,
                        messages,
                        template,
                        tools=tools,
                        context_rule=config.agent.context_rule,
                        context_window=config.agent.context_window,
                    )
                except ValueError as exc:  # a bad shape, a character the tokenizer lacks
                    raise ValueError(
                        f"tasks source {name!r}: the demonstration of task "
                        f"{task_key(task).id!r} cannot be used: {exc}"
                    ) from None
                n = max(len(r["input_ids"]) for r in traj.learner_rows())
                if n > longest:
                    longest, longest_task = n, task
        if longest > max_len:
            raise ValueError(
                f"tasks source {name!r}: a demonstration ({task_key(longest_task).id}) "
                f"is {longest} tokens, {longest - max_len} over engine.max_seq_len={max_len}, "
                "which bounds a whole episode (prompt, every turn, every tool output): shorten "
                "the prompts, tool outputs or answers, or raise engine.max_seq_len"
            )


def _check_calls(name: str, task: Any, messages: list, tools: list[dict[str, Any]]) -> None:
    """ValueError in one line when a demonstration calls a tool the environment does not
    have, or with arguments its schema refuses: SFT would teach calls every episode's
    tool rejects, and RL would learn nothing from them."""
    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in tools}
    for message in messages:
        for call in message.get("tool_calls") or ():
            tool, arguments = call.get("name"), call.get("arguments")
            if tool not in schemas:
                why = f"the environment has no tool {tool!r} (its tools: {', '.join(schemas)})"
            else:
                why = validate_arguments(tool, schemas[tool], arguments)
            if why is not None:
                raise ValueError(
                    f"tasks source {name!r}: the demonstration of task "
                    f"{task_key(task).id!r} calls {tool}({arguments!r:.200}), "
                    f"which its tool refuses: {why}; fix the tool's parameters or the "
                    "demonstrations"
                )


def where(env: Any, method: str) -> str:
    """``Class.method (file:line)`` of ``env``'s ``method`` as its class defines it."""
    fn = getattr(type(env), method, None)
    label = f"{type(env).__qualname__}.{method}"
    try:
        fn = inspect.unwrap(fn)
        return f"{label} ({inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]})"
    except (TypeError, OSError):  # a builtin, or no source on disk
        return label


def _wrong_type(name: str, env: Any, method: str, expected: str, got: Any, hint: str) -> str:
    return (
        f"tasks source {name!r}: {where(env, method)} returned {type(got).__name__} "
        f"{got!r:.80}, expected {expected}: {hint}"
    )


def _probe(name: str, sources: RunSources, task: Any) -> str | None:
    """One ``reset`` of source ``name``'s environment on ``task`` and one ``step`` on an
    empty action, their return types checked; the prompt, or None when either raised
    (logged: the run treats those as infrastructure faults)."""
    env = sources.make_env(_named(task, name))

    async def play() -> tuple[Any, Any]:
        try:
            async with asyncio.timeout(RESET_TIMEOUT_S):
                prompt = await env.reset(task)
                if not isinstance(prompt, str):
                    return prompt, None
                return prompt, await env.step(Action(text=""))
        finally:
            await env.close()

    try:
        prompt, result = _run(play())
    except Exception as exc:
        _log.warning(
            "tasks source %r: the start-up probe of its environment (reset, then one step) "
            "raised %s: %s; its return types were not checked",
            name,
            type(exc).__name__,
            exc,
        )
        return None
    if not isinstance(prompt, str):
        raise EnvContractError(
            _wrong_type(name, env, "reset", "str", prompt, "return the prompt text")
        )
    if not isinstance(result, StepResult):
        raise EnvContractError(
            _wrong_type(
                name,
                env,
                "step",
                "StepResult",
                result,
                "return StepResult(observation, reward, done, info) "
                "(from tunix_agentic.envs import StepResult)",
            )
        )
    return prompt


def _compare_prompt(name: str, got: str, expected: Any) -> None:
    """``reset``'s prompt against the one source ``name``'s demonstrations are framed
    with (``task.prompt``)."""
    if got != expected:
        raise ValueError(
            f"tasks source {name!r}: reset() returned another prompt than the one its "
            f"demonstrations are written for (the task's prompt), {_difference(got, expected)}: "
            "SFT would teach episodes that RL never sees. Return task.prompt from reset(), "
            "or build the task's prompt the way reset() does"
        )


def _difference(got: Any, expected: Any) -> str:
    if not isinstance(got, str):
        return f"got {type(got).__name__} {got!r:.80} (reset must return the prompt text)"
    at = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
        min(len(got), len(expected)),
    )
    lo = max(0, at - 20)
    return (
        f"first different at character {at}: reset() gave {got[lo : at + 30]!r}, "
        f"the demonstrations {expected[lo : at + 30]!r}"
    )


def _named(task: Any, name: str) -> Any:
    import dataclasses

    if dataclasses.is_dataclass(task) and task_key(task).name != name:
        try:
            return dataclasses.replace(task, task_name=name)
        except TypeError:
            return task
    return task


def _run(coro: Any) -> Any:
    """``asyncio.run(coro)``, on a thread of its own when a loop already runs here (a
    notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()
