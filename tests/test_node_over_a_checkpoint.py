"""A rollout node with no trainer in front of ``serve-engine --params RUN``: the docs' path
"try an agent against your trained checkpoint" (docs/service.md).

One real ``serve-engine`` process serves a run dir whose only checkpoint (step 40) holds a
built-in model that memorised a calculator episode; nodes run in this process on real
HTTP servers and are called with the official ``openai`` client. The node serves the
checkpoint's version (no trainer published one) until a trainer publishes its own; the
built-in model honours ``tool_choice`` and ``response_format`` through ``serve-engine``; a
prompt with a tab and non-ASCII characters is folded into the built-in vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.envs.calculator import make_arithmetic_task
from tunix_agentic.rollout.service.admin import RUNTIME_DIR_ENV
from tunix_agentic.testing import (
    TINY_RUN_OVERRIDES,
    cli,
    memorize,
    spawn_server,
    stop_server,
)
from tunix_agentic.testing import arithmetic_demonstration as demonstration

openai = pytest.importorskip("openai")
pytest.importorskip("xgrammar")

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
ENGINE_OVERRIDES = ["engine.max_seq_len=192", "engine.decode_steps=2"]
STEP = 40  # the checkpoint's step: the weights' version serve-engine reports
TASK = make_arithmetic_task(0, seed=0, split="train")
BOUND_S = 120  # a bound against hangs, never a timing assertion
VERDICT = {
    "type": "function",
    "function": {
        "name": "Verdict",
        "description": "whether the sum is right",
        "parameters": {
            "type": "object",
            "properties": {"ok": {"type": "boolean"}},
            "required": ["ok"],
        },
    },
}


def _setup():
    from tunix_agentic.config import load_config
    from tunix_agentic.rollout.service.node import setup_from_config

    return setup_from_config(load_config(CONFIG, list(TINY_RUN_OVERRIDES)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A run dir as ``train`` leaves it: config.yaml and one checkpoint (step 40) of a
    built-in model that memorised a tool-using calculator episode in the node's framing."""
    from flax import nnx

    from tunix_agentic.checkpoint import Checkpointer
    from tunix_agentic.config import load_config, save_config
    from tunix_agentic.learners.state import make_optimizer
    from tunix_agentic.models.hf import build_model

    run = tmp_path_factory.mktemp("run")
    cfg = load_config(CONFIG, [*TINY_RUN_OVERRIDES, f"run_dir={run}"])
    save_config(cfg, run / "config.yaml")
    demo = demonstration(TASK, _setup().template, use_tool=True, rng=np.random.default_rng(0))
    model = memorize(
        build_model(cfg.model, seed=1), [(demo["input_ids"], demo["loss_mask"])], steps=150
    )
    params = nnx.state(model, nnx.Param)
    ckpt = Checkpointer(run / "checkpoints")
    ckpt.save(STEP, params, make_optimizer(cfg.learner.optimizer).init(params), {"version": STEP})
    ckpt.close()
    return run


@pytest.fixture(scope="module")
def engine_url(run_dir):
    argv = cli("serve-engine", "--params", str(run_dir), "--port", "0", *ENGINE_OVERRIDES)
    proc, url = spawn_server(argv, "serving on ", timeout_s=BOUND_S)
    yield url
    stop_server(proc)


@pytest.fixture
async def node(engine_url, tmp_path, monkeypatch):
    """A node over the engine, as ``serve-rollout --engine-url URL`` runs it, and its
    ``openai`` client: ``(node, client)``."""
    from tunix_agentic.rollout.service.engines import EngineSet
    from tunix_agentic.rollout.service.node import RolloutNode
    from tunix_agentic.rollout.service.node_http import start_node_server

    monkeypatch.setenv(RUNTIME_DIR_ENV, str(tmp_path / "run"))
    served = RolloutNode(_setup(), EngineSet([engine_url]), tmp_path / "node")
    runner, port = await start_node_server(served)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0
    )
    yield served, client
    await client.close()
    await runner.cleanup()
    await served.close()


def _ask(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


TOKEN = {"X-Episode-Token": "a-token-the-client-chose"}


async def _episode(client, episode_id: str) -> dict:
    """``GET /v1/episodes/{episode_id}`` of the token's holder."""
    return await client.get(f"/episodes/{episode_id}", cast_to=object, options={"headers": TOKEN})


async def test_a_node_with_no_trainer_serves_the_checkpoints_version(node):
    """No trainer published a version: the node's policy is the one the engine holds
    (v40, read at start), and it answers instead of refusing every reply as ahead of v0."""
    served, client = node
    assert served.engines.policy_version == STEP
    reply = await client.chat.completions.create(
        model="policy",
        messages=_ask(TASK.prompt),
        max_tokens=8,
        temperature=0,
        extra_headers={"X-Episode-Id": "v", **TOKEN},
    )
    assert reply.usage.completion_tokens >= 1
    ((choice,),) = [call["choices"] for call in (await _episode(client, "v"))["calls"]]
    assert set(choice["versions"]) == {STEP}
    (model,) = (await client.models.list()).data
    assert model.model_extra["policy_version"] == STEP
    assert served.status()["policy_version"] == STEP


async def test_a_node_a_trainer_published_to_keeps_its_staleness_rule(node):
    """Once a trainer publishes v0, a reply of the engine's v40 is ahead of it: refused as
    the engine's infrastructure error (503), never recorded."""
    served, client = node
    served.engines.publish(0, None)  # what POST /v1/policy {"version": 0} does
    served.engines.wait_s = 0  # no wait for an engine that holds the published weights
    with pytest.raises(openai.InternalServerError) as caught:
        await client.chat.completions.create(
            model="policy", messages=_ask(TASK.prompt), max_tokens=4, temperature=0
        )
    assert caught.value.status_code == 503
    assert served.engines.policy_version == 0


@pytest.mark.parametrize(
    "forced",
    [{"tools": [VERDICT], "tool_choice": "required"}, {"response_format": {"type": "json_object"}}],
    ids=["tool_choice-required", "response_format-json_object"],
)
async def test_the_builtin_model_behind_serve_engine_is_forced(node, forced):
    """``serve-engine`` gives the built-in model's characters to the grammar: with
    ``tool_choice: required`` the reply is a call to the one tool offered, arguments of its
    schema; with ``response_format: json_object`` it parses as a JSON object. Either is
    recorded as sampled under a grammar."""
    _, client = node
    reply = await client.chat.completions.create(
        model="policy",
        messages=_ask(TASK.prompt),
        max_tokens=80,
        temperature=0,
        extra_headers={"X-Episode-Id": "forced", **TOKEN},
        **forced,
    )
    message = reply.choices[0].message
    if "tools" in forced:
        (call,) = message.tool_calls
        assert call.function.name == "Verdict"
        assert json.loads(call.function.arguments) in ({"ok": True}, {"ok": False})
    else:
        assert isinstance(json.loads(message.content), dict)
    ((choice,),) = [call["choices"] for call in (await _episode(client, "forced"))["calls"]]
    assert choice["constrained"]


async def test_a_prompt_with_a_tab_and_non_ascii_text_is_folded_and_served(node):
    """A tab becomes a space and a character outside printable ASCII a ``?`` (the built-in
    tokenizer's ``fold``): the call is served, and what the model saw is the folded text."""
    from tunix_agentic.models.char_tokenizer import CharTokenizer

    served, client = node
    await client.chat.completions.create(
        model="policy",
        messages=_ask("Follow-up:\tCompute 1+1 — café."),
        max_tokens=4,
        extra_headers={"X-Episode-Id": "folded", **TOKEN},
    )
    (call,) = (await _episode(client, "folded"))["calls"]
    text = CharTokenizer(served.setup.vocab_size).decode(call["prompt_ids"])
    assert "Follow-up: Compute 1+1 ? caf?." in text
