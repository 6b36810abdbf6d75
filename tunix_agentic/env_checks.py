"""Checks of a run's environments before any work, for the mistakes a new environment makes.

:func:`check_sources` (called by :class:`~tunix_agentic.trainer.Trainer` at init, about a
second) resets one environment per task source with demonstrations and compares the
prompt with the one its demonstrations are written for, and checks that demonstrations
fit the engine's ``max_seq_len``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

import numpy as np

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.data.tasks import task_dataset

_log = logging.getLogger(__name__)

# Demonstrations measured per source (both with and without tools): cheap, and enough to
# catch a task family whose episodes are too long for the model.
DEMOS_MEASURED = 8
RESET_TIMEOUT_S = 30.0


def check_sources(sources: Any, template: ChatFormat, config: Any) -> None:
    """Raises ``ValueError`` naming the task source whose environment's ``reset`` gives
    another prompt than its demonstrations' (where they first differ), or whose
    demonstrations do not fit ``engine.max_seq_len`` (by how many tokens). Checked only
    for sources with demonstrations when ``sft.steps > 0``; remote environments are not
    reset here, and a ``reset`` that raises is only logged (the run retries those as
    infrastructure faults)."""
    if not config.sft.steps:
        return
    max_len = config.engine.max_seq_len
    for name, spec in sources.specs.items():
        source = sources.sources[name]
        if not source.has_demonstrations:
            continue
        tasks = task_dataset(source, seed=config.seed + 7919, split="train")
        first = tasks[0]
        if spec.env != "remote":
            _check_reset(name, sources, first)
        tools = sources.make_env(_named(first, name)).tool_schemas()
        longest, longest_task = 0, first
        rng = np.random.default_rng(config.seed)
        for i in range(min(DEMOS_MEASURED, len(tasks))):
            task = tasks[i]
            for use_tools in (True, False):
                messages = source.demonstration(task, rng=rng, use_tools=use_tools)
                if messages is None:
                    continue
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
                        f"{getattr(task, 'task_id', task)!r} cannot be used: {exc}"
                    ) from None
                n = max(len(r["input_ids"]) for r in traj.learner_rows())
                if n > longest:
                    longest, longest_task = n, task
        if longest > max_len:
            raise ValueError(
                f"tasks source {name!r}: a demonstration ({getattr(longest_task, 'task_id', '')}) "
                f"is {longest} tokens, {longest - max_len} over engine.max_seq_len={max_len}, "
                "which bounds a whole episode (prompt, every turn, every tool output): shorten "
                "the prompts, tool outputs or answers, or raise engine.max_seq_len"
            )


def _check_reset(name: str, sources: Any, task: Any) -> None:
    """One ``reset`` of source ``name``'s environment on ``task``, compared with the
    prompt its demonstrations are framed with (``task.prompt``)."""
    expected = getattr(task, "prompt", None)
    env = sources.make_env(_named(task, name))

    async def reset() -> Any:
        try:
            async with asyncio.timeout(RESET_TIMEOUT_S):
                return await env.reset(task)
        finally:
            await env.close()

    try:
        got = _run(reset())
    except Exception as exc:  # the run treats a failed reset as an infrastructure fault
        _log.warning(
            "tasks source %r: reset() raised %s: %s in the start-up check; its prompt was "
            "not compared with the demonstrations'",
            name,
            type(exc).__name__,
            exc,
        )
        return
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

    if dataclasses.is_dataclass(task) and getattr(task, "task_name", name) != name:
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
