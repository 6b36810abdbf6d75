"""Generated SFT demonstrations for the arithmetic tool task (the warm start).

A demonstration either uses the calculator correctly (call, read the
response, answer) or answers directly with a guess that is usually wrong. The
mix is what gives RL something to discover: the warm-started policy calls the
tool only part of the time, and reward teaches it to always do so.
"""

from __future__ import annotations

import functools

import numpy as np

from tunix_agentic.agent.chat import ChatFormat
from tunix_agentic.agent.tool_parser import format_tool_call
from tunix_agentic.data.tasks import task_iterator
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTask
from tunix_agentic.learners.batching import pad_rows


def demonstration(
    task: ArithmeticTask, template: ChatFormat, *, use_tool: bool, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Token ids and loss mask (1 on the assistant's tokens) of one demonstration.

    Framed by ``template`` exactly as a rollout frames it (the same prompt, tool
    schemas included, the same observation delta), so SFT teaches the ids RL sees.
    """
    prompt = template.prompt_ids(task.prompt, tools=_calculator_schemas())
    if use_tool:
        call = format_tool_call("calculator", {"expression": task.expression})
        segments = [
            (prompt, 0.0),
            (template.assistant_ids(call), 1.0),
            (template.observation_ids([{"role": "tool", "content": task.answer}]), 0.0),
            (template.assistant_ids(f"<answer>{task.answer}</answer>"), 1.0),
        ]
    else:
        value = int(float(task.answer))
        guess = value + int(rng.choice([-1, 1])) * int(
            rng.integers(1, max(10, abs(value) // 4 + 2))
        )
        segments = [(prompt, 0.0), (template.assistant_ids(f"<answer>{guess}</answer>"), 1.0)]
    ids: list[int] = []
    mask: list[float] = []
    for seg, m in segments:
        ids += seg
        mask += [m] * len(seg)
    return {
        "input_ids": np.asarray(ids, np.int32),
        "loss_mask": np.asarray(mask, np.float32),
        "old_logprobs": np.zeros(len(ids), np.float32),
    }


@functools.cache
def _calculator_schemas() -> list[dict]:
    return ArithmeticEnv().tool_schemas()


def demonstration_batches(
    template: ChatFormat, *, seed: int, batch_size: int, tool_fraction: float
):
    """Endless padded SFT batches from the train split; ``tool_fraction`` of rows use the tool."""
    if not 0.0 <= tool_fraction <= 1.0:
        raise ValueError(f"sft.tool_fraction must be in [0, 1], got {tool_fraction}")
    rng = np.random.default_rng(seed)
    tasks = task_iterator(seed=seed + 7919, split="train")
    while True:
        rows = [
            demonstration(
                next(tasks), template, use_tool=bool(rng.random() < tool_fraction), rng=rng
            )
            for _ in range(batch_size)
        ]
        batch = pad_rows(rows, pad_id=template.tokenizer.pad_id, length_multiple=16)
        yield {"input_ids": batch["input_ids"], "loss_mask": batch["loss_mask"]}
