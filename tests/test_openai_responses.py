"""Agent frameworks against the endpoint. The Responses API subset (``POST /v1/responses``):
the official ``openai`` client (stream and not) and the OpenAI Agents SDK (its default
Responses model and its chat-completions model) run calculator episodes against a real
server over a policy that memorised one; each episode is recorded token for token as the
chat endpoint records it, and its ids decode to what the client received. Bad requests get
a 400 naming the field. A LangChain agent (``ChatOpenAI.bind_tools``, whole and
``streaming=True``) completes the same episode and is recorded as one learner row (it
re-sends the history with ``content: null`` and its own tool-call ids);
``with_structured_output`` (a JSON schema or a forced tool call) gets an object of the
schema, enforced by constrained decoding, from a policy that never saw one."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import jsonschema
import numpy as np
import pytest
from aiohttp import web

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.config import load_config
from tunix_agentic.envs.calculator import ArithmeticEnv, CalculatorTool, make_arithmetic_task
from tunix_agentic.inference.config import EngineConfig
from tunix_agentic.inference.engine import JaxEngine
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout.openai_endpoint.api import OpenAIConfig, add_openai_routes
from tunix_agentic.rollout.openai_endpoint.recording import episode_trajectory
from tunix_agentic.rollout.openai_endpoint.serving_responses import input_messages, text_pieces
from tunix_agentic.rollout.openai_endpoint.store import episode_key
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
from tunix_agentic.rollout.service.node_http import start_node_server
from tunix_agentic.serving.http import api_key_guard, serve_app
from tunix_agentic.serving.timeouts import ServerTimeouts
from tunix_agentic.testing import TINY_RUN_OVERRIDES, AnswerGate, memorize, tiny_model
from tunix_agentic.testing import arithmetic_demonstration as demonstration

openai = pytest.importorskip("openai")

CHAR = CharTokenizer(128)
BUILTIN = ChatTemplate(CHAR)
TASK = make_arithmetic_task(0, seed=0, split="train")
ANSWER = f"<answer>{TASK.answer}</answer>"
# The calculator as the Responses API lists a function tool: flat, not under "function".
TOOLS = [{"type": "function", **t["function"]} for t in ArithmeticEnv().tool_schemas()]
ENGINE = EngineConfig(max_slots=4, max_seq_len=128, decode_steps=8, warmup=False)
TOKEN = "a-token-the-client-chose"
BOUND_S = 120  # a bound against hangs, never a timing assertion
CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")
SAMPLING = {"temperature": 0, "max_output_tokens": 40}


def ep(episode_id):
    return {"X-Episode-Id": episode_id, "X-Episode-Token": TOKEN}


@pytest.fixture(scope="module")
def tool_user():
    """A real policy that memorised one calculator episode in the built-in framing."""
    demo = demonstration(TASK, BUILTIN, use_tool=True, rng=np.random.default_rng(0))
    model = memorize(tiny_model(seed=1), [(demo["input_ids"], demo["loss_mask"])], steps=150)
    engine = JaxEngine(model, ENGINE)
    yield engine, demo
    asyncio.run(engine.close())


@pytest.fixture
async def serve():
    """``serve(engine) -> (api, url)``: the endpoints as the rollout node mounts them
    (:func:`add_openai_routes`) on a real server on a free port."""
    runners = []

    async def start(engine):
        app = web.Application(middlewares=[api_key_guard(lambda app: None)])
        api = add_openai_routes(
            app, engine=engine, chat_format=BUILTIN, version_of=lambda: 7, config=OpenAIConfig()
        )
        runner, port = await serve_app(
            app, "127.0.0.1", 0, timeouts=ServerTimeouts(), shutdown_timeout_s=1.0
        )
        runners.append(runner)
        return api, f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


def client_of(url, **kw):
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, **kw)


async def calculate(arguments: str) -> str:
    try:
        return await CalculatorTool().run(**json.loads(arguments))
    except (TypeError, ValueError) as exc:
        return f"error: {exc}"


async def responses_agent(client, episode_id, *, stream: bool):
    """A Responses-API agent: call, run the function calls, send their outputs back with
    the output items, until a reply without calls. Returns the responses received."""
    items: list = [{"role": "user", "content": TASK.prompt}]
    received = []
    for _ in range(3):
        kw = dict(model="policy", input=items, tools=TOOLS, extra_headers=ep(episode_id))
        if stream:
            async with client.responses.stream(**kw, **SAMPLING) as events:
                kinds = [event.type async for event in events]
                response = await events.get_final_response()
            assert kinds[:2] == ["response.created", "response.in_progress"]
            assert kinds[-1] == "response.completed"
        else:
            response = await client.responses.create(**kw, **SAMPLING)
        received.append(response)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        calls = [item for item in response.output if item.type == "function_call"]
        for call in calls:
            output = await calculate(call.arguments)
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )
        if not calls:
            break
    await close(client, episode_id)
    return received


async def close(client, episode_id):
    """Close the episode with a reward (the learner's trajectory is a closed one's)."""
    await client.post(
        f"/episodes/{episode_id}/reward",
        body={"reward": 1.0, "task_id": TASK.task_id},
        cast_to=object,
        options={"headers": ep(episode_id)},
    )


def assert_recorded_as_received(api, episode_id, received, demo):
    """The episode's calls chain into the memorised demonstration's row, and each call's
    completion ids decode to the response the client got."""
    episode = api.store.get(episode_key(episode_id, TOKEN))
    assert len(episode.calls) == len(received) == 2
    for call, response in zip(episode.calls, received, strict=True):
        (completion,) = call.completions
        ids = completion.token_ids
        text = CHAR.decode(ids[:-1] if completion.ended_turn else ids)
        assert response.usage.output_tokens == len(ids)
        assert response.usage.input_tokens == len(call.prompt_ids)
        calls = [item for item in response.output if item.type == "function_call"]
        if calls:  # the model's text is the call the client was handed
            action = get_parser("qwen3")(text)
            got = [(c.name, json.loads(c.arguments)) for c in calls]
            assert [(t.name, t.arguments) for t in action.tool_calls] == got
        else:
            assert response.output_text == text
    traj = episode_trajectory(episode)
    assert traj.whole_history  # the second call continued the first's ids
    (row,) = traj.learner_rows()
    np.testing.assert_array_equal(row["input_ids"], demo["input_ids"])
    np.testing.assert_array_equal(row["loss_mask"], demo["loss_mask"])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_responses_agent_records_what_it_received(serve, tool_user, stream):
    engine, demo = tool_user
    api, url = await serve(engine)
    client = client_of(url)
    received = await responses_agent(client, "r-1", stream=stream)
    (call,) = received[0].output
    assert call.type == "function_call" and call.name == "calculator"
    assert json.loads(call.arguments) == {"expression": TASK.expression}
    assert received[-1].output_text == ANSWER and received[-1].status == "completed"
    assert_recorded_as_received(api, "r-1", received, demo)
    await client.close()


async def test_streamed_events_add_up_to_the_response(serve, tool_user):
    """The deltas of a streamed reply add up to its items, which are the whole reply's; its
    text shows while the engine samples (the engine's answer waits behind a gate)."""
    engine, _ = tool_user
    gate = AnswerGate(engine)
    api, url = await serve(gate)
    client = client_of(url)
    args = json.dumps({"expression": TASK.expression})
    items = [
        {"role": "user", "content": TASK.prompt},
        {"type": "function_call", "call_id": "c1", "name": "calculator", "arguments": args},
        {"type": "function_call_output", "call_id": "c1", "output": await calculate(args)},
    ]
    gate.open.set()
    whole = await client.responses.create(model="policy", input=items, tools=TOOLS, **SAMPLING)
    gate.open.clear()
    events = await client.responses.create(
        model="policy", input=items, tools=TOOLS, stream=True, **SAMPLING, extra_headers=ep("live")
    )
    got = []
    async with asyncio.timeout(BOUND_S):
        async for event in events:
            got.append(event)
            if event.type == "response.output_text.delta":
                break
    assert not gate.open.is_set() and ANSWER.startswith(got[-1].delta)
    assert api.store.get(episode_key("live", TOKEN)).calls == []  # still sampling
    gate.open.set()
    got += [event async for event in events]
    assert [e.sequence_number for e in got] == list(range(len(got)))
    final = got[-1].response
    assert {e.response.id for e in got if hasattr(e, "response")} == {final.id}
    assert {e.item_id for e in got if hasattr(e, "item_id")} == {final.output[0].id}
    deltas = [e.delta for e in got if e.type == "response.output_text.delta"]
    assert "".join(deltas) == ANSWER == whole.output_text
    assert [i.model_dump(exclude={"id"}) for i in final.output] == [
        i.model_dump(exclude={"id"}) for i in whole.output
    ]
    assert final.usage == whole.usage
    await client.close()


def test_input_items_are_the_chat_messages_they_mean():
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc"}
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"role": "user", "content": "q"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "a", "annotations": [], "logprobs": []}],
        },
        call,
        {**call, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
        call,  # a reply of calls alone
    ]
    fn = {"name": "f", "arguments": "{}"}
    assert input_messages(items, "be brief") == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "d"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": fn},
                {"id": "c2", "type": "function", "function": fn},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": fn}],
        },
    ]
    assert input_messages("hi", None) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "text, decoded, expected",
    [("abc", "abc", ["a", "b", "c"]), ("b", "ab", ["b"])],
    ids=["per-token", "not-the-decoding"],
)
def test_text_pieces_are_the_tokens_text_or_the_whole(text, decoded, expected):
    assert text_pieces(CHAR.decode, CHAR.encode(decoded), text) == expected


USER = {"input": "x"}
BAD = [
    ({**USER, "store": True}, "store"),
    ({**USER, "previous_response_id": "resp_1"}, "previous_response_id"),
    ({**USER, "conversation": "conv_1"}, "conversation"),
    ({**USER, "repetition_penalty": 1.2}, "repetition_penalty"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "user", "content": "x", "name": "n"}]}, "input[0].name"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    (
        {"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]},
        "input[0].arguments",
    ),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({**USER, "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({**USER, "tools": [{"type": "function", "name": "f", "x": 1}]}, "tools[0].x"),
    ({**USER, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({**USER, "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ({**USER, "max_output_tokens": 0}, "max_output_tokens"),
    ({**USER, "temperature": 3}, "temperature"),
    ({**USER, "text": {"format": {"type": "json_schema", "name": "n"}}}, "text.format.schema"),
    ({**USER, "text": {"format": {"type": "xml"}}}, "text.format.type"),
    ({**USER, "reasoning": {"effort": "max"}}, "reasoning.effort"),
    ({**USER, "include": ["reasoning.encrypted_content"]}, "include"),
    ({**USER, "instructions": 3}, "instructions"),
]


@pytest.mark.parametrize("body, field", BAD, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD)])
async def test_a_bad_request_is_a_400_naming_the_field(serve, body, field):
    _, url = await serve(None)  # refused before any engine is asked
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/responses", json=body) as resp:
            message = (await resp.json())["error"]["message"]
    assert resp.status == 400 and message.startswith(field), message


async def test_the_rollout_node_serves_responses(tmp_path):
    """The node mounts the route with its chat endpoint: a stateful request is refused
    by name, a good one reaches the (here empty) engine set, a 503."""
    overrides = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "rollout.backend_wait_s=0"]
    setup = setup_from_config(load_config(CONFIG, overrides))
    node = RolloutNode(setup, EngineSet([]), tmp_path / "node")
    runner, port = await start_node_server(node)
    url = f"http://127.0.0.1:{port}/v1/responses"
    try:
        async with aiohttp.ClientSession() as http:
            async with http.post(url, json={"input": "x", "store": True}) as resp:
                assert resp.status == 400 and "store" in (await resp.json())["error"]["message"]
            async with http.post(url, json={"input": "x", "max_output_tokens": 2}) as resp:
                assert resp.status == 503
    finally:
        await runner.cleanup()
        await node.close()


# ------------------------------------------------------------------ the Agents SDK
@pytest.mark.parametrize(
    "model, streamed",
    [("responses", False), ("responses", True), ("chat", False)],
    ids=["responses", "responses-streamed", "chat-completions"],
)
async def test_an_agents_sdk_run_completes_through_the_endpoint(serve, tool_user, model, streamed):
    agents = pytest.importorskip("agents")
    engine, demo = tool_user
    api, url = await serve(engine)
    client = client_of(url, default_headers=ep(f"sdk-{model}-{streamed}"))

    @agents.function_tool
    async def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return await calculate(json.dumps({"expression": expression}))

    kind = (
        agents.OpenAIResponsesModel if model == "responses" else agents.OpenAIChatCompletionsModel
    )
    agent = agents.Agent(
        name="calculator",
        model=kind(model="policy", openai_client=client),
        model_settings=agents.ModelSettings(temperature=0, max_tokens=40),
        tools=[calculator],
    )
    run = agents.RunConfig(tracing_disabled=True)
    if streamed:
        result = agents.Runner.run_streamed(agent, TASK.prompt, run_config=run)
        async for _ in result.stream_events():
            pass
    else:
        result = await agents.Runner.run(agent, TASK.prompt, run_config=run)
    assert result.final_output == ANSWER
    await close(client, f"sdk-{model}-{streamed}")
    episode = api.store.get(episode_key(f"sdk-{model}-{streamed}", TOKEN))
    assert len(episode.calls) == 2
    (row,) = episode_trajectory(episode).learner_rows()
    np.testing.assert_array_equal(row["input_ids"], demo["input_ids"])
    await client.close()


# ------------------------------------------------------------------ LangChain
CHAT_TOOLS = ArithmeticEnv().tool_schemas()  # {"type": "function", "function": {...}}


def chat_model(url: str, episode_id: str, *, streaming: bool, max_tokens: int = 40):
    langchain_openai = pytest.importorskip("langchain_openai")
    return langchain_openai.ChatOpenAI(
        model="policy",
        base_url=f"{url}/v1",
        api_key="unused",
        temperature=0,
        max_tokens=max_tokens,
        max_retries=0,
        streaming=streaming,
        stream_usage=streaming,  # stream_options.include_usage: the last chunk's usage
        default_headers=ep(episode_id),
    )


async def langchain_agent(llm) -> list:
    """The usual LangChain tool loop: invoke, run the tool calls, send ToolMessages back."""
    messages = pytest.importorskip("langchain_core.messages")
    bound = llm.bind_tools(CHAT_TOOLS)
    history: list = [messages.HumanMessage(TASK.prompt)]
    for _ in range(3):
        reply = await bound.ainvoke(history)
        history.append(reply)
        if not reply.tool_calls:
            break
        for call in reply.tool_calls:
            output = await calculate(json.dumps(call["args"]))
            history.append(messages.ToolMessage(output, tool_call_id=call["id"]))
    return history


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_langchain_agent_completes_and_is_recorded(serve, tool_user, streaming):
    engine, demo = tool_user
    api, url = await serve(engine)
    episode_id = f"lc-{streaming}"
    history = await langchain_agent(chat_model(url, episode_id, streaming=streaming))
    first, final = history[1], history[-1]
    assert [c["name"] for c in first.tool_calls] == ["calculator"]
    assert first.tool_calls[0]["args"] == {"expression": TASK.expression}
    assert final.content == ANSWER and not final.tool_calls
    if streaming:  # the usage chunk reached LangChain
        assert final.usage_metadata and final.usage_metadata["output_tokens"] > 0
    episode = api.store.get(episode_key(episode_id, TOKEN))
    assert len(episode.calls) == 2
    episode.closed, episode.reward = True, 1.0  # as POST /v1/episodes/ID/reward does
    (row,) = episode_trajectory(episode).learner_rows()
    np.testing.assert_array_equal(row["input_ids"], demo["input_ids"])
    np.testing.assert_array_equal(row["loss_mask"], demo["loss_mask"])


@pytest.mark.parametrize(
    "method", ["json_schema", "function_calling"], ids=["json-schema", "function-calling"]
)
async def test_structured_output_is_enforced(serve, tool_user, method):
    """``with_structured_output``: a JSON schema (``response_format``) or a forced call to
    the schema's tool (``tool_choice`` named); a policy that never saw either still
    returns an object of the schema, and the recorded completion is marked constrained:
    trained on by default (its ratio to the masked logprob is the correction), context
    only with ``constrained="mask"``."""
    engine, _ = tool_user
    api, url = await serve(engine)
    schema = {
        "title": "Verdict",
        "description": "whether the sum is right",
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
    }
    episode_id = f"lc-structured-{method}"
    llm = chat_model(url, episode_id, streaming=False, max_tokens=80)
    got = await llm.with_structured_output(schema, method=method).ainvoke("2+2=4?")
    assert got in ({"ok": True}, {"ok": False})
    episode = api.store.get(episode_key(episode_id, TOKEN))
    ((completion,),) = [call.completions for call in episode.calls]
    assert completion.constrained
    episode.closed, episode.reward = True, 1.0
    trajectory = episode_trajectory(episode)
    (row,) = trajectory.learner_rows()
    forced = np.asarray(row["constrained"]) > 0
    assert forced.sum() == len(completion.token_ids)
    np.testing.assert_array_equal(np.asarray(row["loss_mask"]) > 0, forced)
    (masked,) = trajectory.learner_rows(constrained="mask")
    assert not np.asarray(masked["loss_mask"]).any()


@pytest.mark.parametrize("kind", ["json_schema", "json_object"], ids=["json-schema", "json-object"])
async def test_text_format_json_is_enforced(serve, tool_user, kind):
    """``text.format`` (what the Agents SDK sends for an ``output_type``) becomes the grammar
    chat's ``response_format`` does: the reply is JSON of the schema from a policy that
    never saw one, recorded as constrained, and the response echoes the format; unknown
    top-level fields are ignored."""
    engine, _ = tool_user
    api, url = await serve(engine)
    client = client_of(url)
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    form = {"type": kind}
    if kind == "json_schema":
        form.update(name="Verdict", schema=schema, strict=True)
    response = await client.responses.create(
        model="policy",
        input="2+2=4?",
        text={"format": form},
        temperature=0,
        max_output_tokens=80,
        extra_body={"x_responses_test_field": 1},
        extra_headers=ep(f"text-{kind}"),
    )
    got = json.loads(response.output_text)
    if kind == "json_schema":
        jsonschema.validate(got, schema)
    assert isinstance(got, dict) and response.text.format.type == kind
    ((completion,),) = [
        c.completions for c in api.store.get(episode_key(f"text-{kind}", TOKEN)).calls
    ]
    assert completion.constrained
    await client.close()
