"""SFT demonstrations for a warm start, from the environments' own task sources.

A task source's :meth:`~tunix_agentic.envs.base.TaskSource.demonstration` gives a
worked episode as chat messages; here it is framed by the chat template exactly
as a rollout frames it (the same prompt with the environment's tool schemas, the
same observation deltas), so SFT teaches the ids RL sees. Several sources mix by
quota like the RL task stream.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.context import context_rule_for
from tunix_agentic.data.mixture import next_by_quota
from tunix_agentic.data.tasks import task_iterator
from tunix_agentic.envs.base import TaskSource
from tunix_agentic.trajectory import Step, Trajectory


def demonstration_trajectory(
    prompt: str,
    messages: list[dict[str, Any]],
    template: ChatFormat,
    *,
    tools: list[dict[str, Any]] | None = None,
    context_rule: str = "append_only",
    context_window: int = 1,
) -> Trajectory:
    """One demonstration as the trajectory a rollout would record for it.

    ``messages`` follow the prompt: assistant turns (``content`` and ``tool_calls``,
    rendered by the template as the model would generate them, its own tool-call format
    included: ``JinjaChatTemplate.assistant_message_text``), each followed by the
    environment's reply (consecutive ``tool``/``user`` messages form one observation). Each step's context
    is what ``context_rule`` would show the model, so SFT and RL train on the same
    views. Raises ``ValueError`` for a conversation that does not start and end with
    an assistant turn.
    """
    if not messages or messages[0].get("role") != "assistant":
        raise ValueError("a demonstration starts with an assistant turn after the prompt")
    if messages[-1].get("role") != "assistant":
        raise ValueError("a demonstration ends with the assistant's turn, not an observation")
    rule = context_rule_for(context_rule, template)
    traj = Trajectory(task_id="demo", episode_id="demo")
    traj.append_prompt(template.prompt_ids(prompt, tools=tools))
    pending: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role in ("tool", "user"):
            pending.append(message)
            continue
        if role != "assistant":
            raise ValueError(f"demonstration message with role {role!r}")
        if pending:
            traj.append_observation(template.observation_ids(pending))
            pending = []
        ids = template.assistant_message_ids(message)
        context = rule(traj, context_window)
        whole = context == traj.token_ids
        traj.append_action(
            Step(
                len(context),
                ids,
                [0.0] * len(ids),
                [0] * len(ids),
                "stop",
                context_ids=None if whole else list(context),
            )
        )
    return traj


def demonstration_rows(
    prompt: str,
    messages: list[dict[str, Any]],
    template: ChatFormat,
    *,
    tools: list[dict[str, Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Token ids and loss mask (1 on the assistant's tokens) of one demonstration, framed
    by ``template`` exactly as a rollout frames it, whole history (one row)."""
    (row,) = demonstration_trajectory(prompt, messages, template, tools=tools).learner_rows()
    return {k: row[k] for k in ("input_ids", "loss_mask", "old_logprobs")}


@dataclass(frozen=True)
class DemoSource:
    """One environment's demonstrations in a warm start: its task source, the tool
    schemas its prompts carry, and its share of the rows."""

    source: TaskSource
    tools: list[dict[str, Any]]
    weight: float = 1.0


def demonstration_batches(
    sources: Mapping[str, DemoSource],
    template: ChatFormat,
    *,
    seed: int,
    batch_size: int,
    tool_fraction: float,
    context_rule: str = "append_only",
    context_window: int = 1,
) -> Iterator[list[dict[str, np.ndarray]]]:
    """Endless SFT batches of ``batch_size`` learner rows (``input_ids``, ``loss_mask``;
    the learner pads them: :func:`tunix_agentic.learners.batching.sft_batch`) from the
    train splits of ``sources``, mixed by weight; ``tool_fraction`` of the demonstrations ask to use
    the tools. Under a context rule that shows less than the whole history, a
    demonstration gives one row per step (its context as the rule shows it), and rows
    carry over from batch to batch.

    Raises ``ValueError`` if a source has no demonstrations.
    """
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"sft.tool_fraction must be in [0, 1], got {tool_fraction}")
    if not sources:
        raise ValueError("demonstrations need at least one task source")
    for name, demo in sources.items():
        if not demo.source.has_demonstrations:
            raise ValueError(f"task source {name!r} provides no demonstrations")
    rng = np.random.default_rng(seed)
    names = list(sources)
    streams = {n: task_iterator(sources[n].source, seed=seed + 7919, split="train") for n in names}
    total = sum(sources[n].weight for n in names)
    shares = {n: sources[n].weight / total for n in names}
    counts = dict.fromkeys(names, 0)

    def make(name: str) -> list[dict[str, np.ndarray]]:
        demo = sources[name]
        task = next(streams[name])
        use_tools = bool(rng.random() < tool_fraction)
        messages = demo.source.demonstration(task, rng=rng, use_tools=use_tools)
        if messages is None:
            raise ValueError(f"task source {name!r} gave no demonstration for {task!r:.100}")
        traj = demonstration_trajectory(
            _prompt(task),
            messages,
            template,
            tools=demo.tools,
            context_rule=context_rule,
            context_window=context_window,
        )
        return traj.learner_rows()

    rows: list[dict[str, np.ndarray]] = []
    while True:
        while len(rows) < batch_size:
            name = next_by_quota(shares, counts)  # the RL stream's exact quotas
            counts[name] += 1
            rows += make(name)
        batch, rows = rows[:batch_size], rows[batch_size:]
        yield batch


def _prompt(task: Any) -> str:
    prompt = getattr(task, "prompt", None)
    if not isinstance(prompt, str):
        raise ValueError(f"a task with demonstrations needs a text 'prompt', got {task!r:.100}")
    return prompt
