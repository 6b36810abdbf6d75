"""The answer-in-a-sentence environments of the SmolLM2 recipe (envs/answer_format.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from tunix_agentic.envs import Action, make_env
from tunix_agentic.envs.answer_format import (
    CAPITALS,
    CapitalFormatEnv,
    CapitalTasks,
    final_answer,
    final_word_answer,
    make_sum_task,
)
from tunix_agentic.envs.base import RewardTimeoutError


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


@pytest.mark.parametrize(
    "reply",
    [
        "The answer is A" + " " * 200_000 + "x",  # the cubic case: a run of spaces
        "The answer is **A" + " " * 100_000 + "*" * 100_000 + " " * 100_000 + "x",
        "the answer is " * 30_000 + "5",  # every lead re-reading the rest
        "The answer is:" + " " * 200_000 + "$" + " " * 200_000 + "x",
    ],
    ids=["spaces", "spaces-stars", "many-leads", "number-spaces"],
)
def test_answer_readers_are_linear_in_the_reply(reply):
    done = threading.Event()

    def read() -> None:
        final_word_answer(reply)
        final_answer(reply)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(60), "a reader backtracked on a long reply"  # bounds a hang only


def test_naming_the_country_never_scores():
    # "The answer is Luxembourg." once scored where the capital shares the country's name.
    assert all(city.lower() != country.lower() for country, city in CAPITALS.items())
    tasks = CapitalTasks()

    async def rewards(split: str) -> list[tuple[float, float]]:
        out = []
        for i in range(tasks.num_tasks(split)):
            task = tasks.task(i, seed=0, split=split)
            country = task.prompt.split("capital of ", 1)[1].split("?", 1)[0]
            scores = []
            for reply in (f"The answer is {country}.", f"The answer is {task.answer}."):
                env = CapitalFormatEnv()
                await env.reset(task)
                await env.step(Action(text=reply))
                scores.append(await env.evaluate())
            out.append(tuple(scores))
        return out

    for split in ("train", "heldout"):
        assert set(asyncio.run(rewards(split))) == {(0.0, 1.0)}


class _SlowCheck(CapitalFormatEnv):
    reward_timeout_s = 0.2

    def given(self, text):
        threading.Event().wait(2)  # a verifier stuck for 2 s, in its worker thread
        return super().given(text)


async def test_the_answer_check_runs_off_the_loop_with_a_deadline():
    env = _SlowCheck()
    await env.reset(CapitalTasks().task(0, seed=0, split="train"))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    try:
        with pytest.raises(RewardTimeoutError, match="took over 0.2s"):
            await env.step(Action(text="The answer is Paris."))
    finally:
        ticker.cancel()
    assert ticks > 0  # the loop ran other work while the check was stuck
