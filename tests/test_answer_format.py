"""The answer-in-a-sentence environments of the SmolLM2 recipe (envs/answer_format.py)."""

from __future__ import annotations

import asyncio

import pytest

from tunix_agentic.envs import Action, make_env
from tunix_agentic.envs.answer_format import (
    CAPITALS,
    CapitalTasks,
    final_answer,
    final_word_answer,
    make_sum_task,
)


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        ("The capital of France is Paris. The answer is Paris.", "Paris"),
        ("The answer is **Addis Ababa**.", "Addis Ababa"),
        ("the answer is: Mexico City", "Mexico City"),
        ("The answer is Rome. No wait, the answer is Milan.", "Milan"),
        ("Paris is the capital of France.", None),
    ],
    ids=["sentence", "bold", "colon-no-stop", "last-wins", "prose"],
)
def test_the_last_answer_sentence_is_the_answer(reply, want):
    assert final_word_answer(reply) == want


def test_sum_answers_and_splits():
    assert final_answer("12 + 30 = 42. The answer is 42.") == "42"
    assert final_answer("It is 42.") is None
    train = {make_sum_task(i, seed=0, split="train").prompt for i in range(200)}
    heldout = {make_sum_task(i, seed=0, split="heldout").prompt for i in range(50)}
    assert not train & heldout


def test_capital_splits_are_disjoint_and_cover_every_country():
    tasks = CapitalTasks()
    n = {split: tasks.num_tasks(split) for split in ("train", "heldout")}
    assert sum(n.values()) == len(CAPITALS) and min(n.values()) > 20
    prompts = {
        split: {tasks.task(i, seed=3, split=split).prompt for i in range(n[split])} for split in n
    }
    assert len(prompts["heldout"]) == n["heldout"]  # every held-out country once
    assert not prompts["train"] & prompts["heldout"]


@pytest.mark.parametrize(
    ("reply", "reward"),
    [
        ("Its capital is Sofia. The answer is Sofia.", 1.0),
        ("The answer is Varna.", 0.0),
        ("Sofia.", 0.0),
    ],
    ids=["right", "wrong-city", "no-sentence"],
)
def test_the_reward_needs_the_right_city_in_the_sentence(reply, reward):
    import tunix_agentic.envs.answer_format  # noqa: F401  (registers the environments)

    async def episode() -> float:
        env = make_env("capital_format")
        task = next(
            t
            for i in range(40)
            if "Bulgaria" in (t := CapitalTasks().task(i, seed=0, split="heldout")).prompt
        )
        await env.reset(task)
        result = await env.step(Action(text=reply))
        assert result.done
        return await env.evaluate()

    assert asyncio.run(episode()) == reward
