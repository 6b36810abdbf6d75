"""Groups run by agents outside the node (``"agent": "external"``): the 30-line agent of
examples/openai_agent.py, written against the official ``openai`` client, claims their
members from a rollout node and trains the tiny calculator policy through it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.envs.calculator import make_arithmetic_task
from tunix_agentic.rollout.client.node_client import NodeClient
from tunix_agentic.rollout.service.engines import EngineSet
from tunix_agentic.rollout.service.node import RolloutNode, setup_from_config
from tunix_agentic.rollout.service.node_http import start_node_server
from tunix_agentic.rollout.wire import (
    GroupRequest,
    SamplingSpec,
    SeedSpec,
    group_from_json,
)
from tunix_agentic.testing import (
    TINY_MODEL_OVERRIDES,
    TINY_RUN_OVERRIDES,
    cli,
    spawn_server,
    stop_server,
)

openai = pytest.importorskip("openai")

REPO = Path(__file__).resolve().parents[1]
CONFIG = str(REPO / "configs" / "calculator_tiny.yaml")
SHARED = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128"]
AGENT_SCRIPT = REPO / "examples" / "openai_agent.py"
TASK = make_arithmetic_task(0, seed=0, split="train")
BOUND_S = 120  # a bound against hangs, never a timing assertion

_spec = importlib.util.spec_from_file_location("openai_agent", AGENT_SCRIPT)
agent_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(agent_script)
sys.modules.setdefault("openai_agent", agent_script)  # the other examples import it


# Each example's agent: its script, its function and the package it needs (a case skips
# without it; CI installs them all).
AGENTS = {
    "openai": ("openai_agent", "calculator_agent", "openai"),
    "langchain": ("langchain_agent", "langchain_calculator_agent", "langchain_openai"),
    "agents-sdk": ("agents_sdk_agent", "agents_sdk_calculator_agent", "agents"),
    "pydantic-ai": ("pydantic_ai_agent", "pydantic_ai_calculator_agent", "pydantic_ai"),
    "autogen": ("autogen_agent", "autogen_calculator_agent", "autogen_agentchat"),
    "llamaindex": (
        "llamaindex_agent",
        "llamaindex_calculator_agent",
        "llama_index.llms.openai_like",
    ),
    "smolagents": ("smolagents_agent", "smolagents_calculator_agent", "smolagents"),
}


# DSPy's ReAct needs a wider window than the module's engine has (its own test below).
DSPY = {"dspy": ("dspy_agent", "dspy_calculator_agent", "dspy")}


def _agent(name: str, examples: dict = AGENTS):
    """The agent function of ``examples/SCRIPT.py`` for the case ``name``."""
    script, function, package = examples[name]
    pytest.importorskip(package)
    spec = importlib.util.spec_from_file_location(script, REPO / "examples" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, function)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    return {**env, "JAX_PLATFORMS": "cpu"}


@contextlib.contextmanager
def _served_engine(tmp_path_factory, window: int):
    """A tiny random model behind ``serve-engine`` with a ``window``-token window: its URL."""
    overrides = [*TINY_MODEL_OVERRIDES, f"engine.max_seq_len={window}", "engine.decode_steps=2"]
    argv = cli("serve-engine", "--config", CONFIG, "--port", "0", *overrides)
    log = tmp_path_factory.mktemp(f"engine-{window}") / "engine.log"
    proc, url = spawn_server(argv, "serving on ", log=log, timeout_s=BOUND_S)
    try:
        yield url
    finally:
        stop_server(proc)


@contextlib.asynccontextmanager
async def _served_node(engine_url: str, state_dir: Path, window: int):
    """A rollout node served here over ``engine_url``, its config's window ``window``:
    ``(node, url)``."""
    overrides = [*TINY_RUN_OVERRIDES, f"engine.max_seq_len={window}"]
    setup = setup_from_config(load_config(CONFIG, overrides))
    node = RolloutNode(setup, EngineSet([engine_url]), state_dir)
    # The tests claim a group's members at once and run them one after another, so a
    # member's first call may wait for the member before it: a loaded machine must not
    # withdraw it.
    runner, port = await start_node_server(
        node, external_lease_s=BOUND_S, external_first_call_s=BOUND_S
    )
    try:
        yield node, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await node.close()


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """A tiny random model behind ``serve-engine`` for the module (128-token window)."""
    with _served_engine(tmp_path_factory, 128) as url:
        yield url


@pytest.fixture
async def node(engine_url, tmp_path):
    """A rollout node served here, over the module's engine."""
    async with _served_node(engine_url, tmp_path / "node", 128) as served:
        yield served


def _request(group_id: str, num_samples: int, **fields) -> GroupRequest:
    return GroupRequest(
        group_id=group_id,
        num_samples=num_samples,
        task=TASK,
        sampling=SamplingSpec(temperature=1.0, max_tokens=6),
        max_turns=2,
        seed=SeedSpec(run_seed=7, index=3),
        **{"agent": "external", **fields},
    )


@pytest.mark.parametrize("agent", list(AGENTS), ids=list(AGENTS))
async def test_an_external_group_is_its_agents_recorded_episodes(node, agent):
    """The examples' agents (the ``openai`` client's, LangChain's, the Agents SDK's on its
    Responses model, pydantic-ai's, AutoGen's, LlamaIndex's streamed ``FunctionAgent`` and
    smolagents' forced tool calls) each run a claimed group's members; each member's
    learner row is exactly its recorded calls."""
    await _claimed_group_is_recorded(node[1], _agent(agent))


@pytest.fixture(scope="module")
def wide_engine_url(tmp_path_factory):
    """The module's tiny model with a 4096-token window: DSPy's ReAct prompt alone is
    ~1,700 characters, one token each for the built-in model."""
    with _served_engine(tmp_path_factory, 4096) as url:
        yield url


async def test_a_dspy_react_group_is_its_recorded_calls(wide_engine_url, tmp_path):
    """DSPy's ``ReAct`` (``examples/dspy_agent.py``) runs a claimed group's members: its
    text-field replies, and the JSON adapter's retry under ``response_format`` (forced
    tokens, trained by default), are each member's recorded calls, token for token."""
    pytest.importorskip("dspy")
    async with _served_node(wide_engine_url, tmp_path / "node", 4096) as (_, url):
        members = await _claimed_group_is_recorded(url, _agent("dspy", examples=DSPY))
    # Each member's first reply did not parse (6 tokens of a random model), so DSPy asked
    # again in JSON mode: those tokens were sampled under the grammar, and they train.
    for member in members.values():
        forced = member["constrained"]
        assert any(forced), member["episode_id"]
        assert all(m == 1 for f, m in zip(forced, member["loss_mask"], strict=True) if f)


async def _claimed_group_is_recorded(url: str, run) -> dict[str, dict]:
    """Submit an external group of two to the node at ``url``, claim both members and run
    ``run`` on each; checks that each member's learner row is exactly its recorded calls
    and returns the members as the node lists them, by episode id."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with NodeClient(url) as nodes:
        await nodes.submit(_request("ext-a", 2))
        claims = [await agent_script.claim_episode(client, wait_s=BOUND_S) for _ in range(2)]
        assert await agent_script.claim_episode(client, wait_s=0) is None  # both claimed
        assert {c["group_id"] for c in claims} == {"ext-a"} and claims[0]["max_turns"] == 2
        assert claims[0]["task"]["fields"]["answer"] == TASK.answer
        assert claims[0]["prompt"] == TASK.prompt
        # The calls give no sampling (LlamaIndex's give the claim's temperature): the group's
        # applies.
        for claim in claims:
            await run(client, claim)
        got = await nodes.get("ext-a", wait_s=BOUND_S)
    assert got["status"] == "done", got
    group = group_from_json(got["group"])
    ids = [c["episode_id"] for c in claims]
    assert sorted(t.episode_id for t in group.trajectories) == sorted(ids)
    assert group.dropped == [] and group.lost == 0
    members = {m["episode_id"]: m for m in got["members"]}
    async with aiohttp.ClientSession() as http:
        tokens = {c["episode_id"]: c["episode_token"] for c in claims}
        for traj in group.trajectories:
            assert traj.task_id == TASK.task_id and traj.group_id == "ext-a"
            holder = {"X-Episode-Token": tokens[traj.episode_id]}
            async with http.get(f"{url}/v1/episodes/{traj.episode_id}", headers=holder) as resp:
                calls = (await resp.json())["calls"]
            # The learner's row is the recorded ids; the mask is 1 on the completions only.
            assert traj.token_ids[: len(calls[0]["prompt_ids"])] == calls[0]["prompt_ids"]
            mask = traj.learner_arrays()["loss_mask"]
            expected = [0] * len(traj.token_ids)
            for call, start in zip(calls, traj.action_starts(), strict=True):
                (choice,) = call["choices"]
                completion = choice["completion_ids"]
                assert 1 <= len(completion) <= 6  # the group's max_tokens
                assert traj.token_ids[start : start + len(completion)] == completion
                expected[start : start + len(completion)] = [1] * len(completion)
            assert mask.tolist() == expected
            member = members[traj.episode_id]
            assert member["prompt_ids"] + member["response_ids"] == traj.token_ids
            assert member["loss_mask"] == expected[traj.prompt_len :]
    await client.close()
    return members


async def test_a_claim_left_silent_is_offered_again_and_its_agent_refused(node):
    rollout_node, url = node
    rollout_node.external.lease_s = 0.5  # an idle claim expires quickly
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with NodeClient(url) as nodes:
        await nodes.submit(_request("ext-b", 1))
        silent = await agent_script.claim_episode(client, wait_s=BOUND_S)
        again = await agent_script.claim_episode(client, wait_s=BOUND_S)  # after the lease
        assert again["group_id"] == "ext-b" and again["episode_id"] != silent["episode_id"]
        with pytest.raises(openai.APIStatusError) as refused:
            await agent_script.calculator_agent(client, silent)
        assert refused.value.status_code == 409 and "withdrawn" in str(refused.value)
        await agent_script.calculator_agent(client, again)
        got = await nodes.get("ext-b", wait_s=BOUND_S)
    assert got["status"] == "done", got
    group = group_from_json(got["group"])
    assert [t.episode_id for t in group.trajectories] == [again["episode_id"]]
    assert [(t.episode_id, t.status) for t in group.dropped] == [(silent["episode_id"], "timeout")]
    assert group.lost == 0 and rollout_node.external.counts()["expired"] == 1
    await client.close()


async def test_own_task_episodes_make_a_group_of_one_task(node):
    rollout_node, url = node
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    first, second = (make_arithmetic_task(i, seed=5, split="train") for i in (0, 1))
    own = [agent_script.own_episode(first, m, max_turns=2) for m in range(2)]
    own.append(agent_script.own_episode(second, 0, max_turns=2))
    async with NodeClient(url) as nodes:
        await nodes.submit(_request("own-a", 2, agent="own_tasks"))
        rewards = {}
        for episode in own:  # the second task's one episode never fills a group of two
            reward, _ = await agent_script.calculator_agent(client, episode)
            rewards[episode["episode_id"]] = reward
        got = await nodes.get("own-a", wait_s=BOUND_S)
        status = await nodes.status()
    assert got["status"] == "done", got
    group = group_from_json(got["group"])
    assert group.task.task_id == first.task_id and group.dropped == []
    ids = sorted(t.episode_id for t in group.trajectories)
    assert ids == sorted(e["episode_id"] for e in own[:2])
    async with aiohttp.ClientSession() as http:
        tokens = {e["episode_id"]: e["episode_token"] for e in own}
        for traj in group.trajectories:
            assert traj.task_id == first.task_id and traj.reward == rewards[traj.episode_id]
            holder = {"X-Episode-Token": tokens[traj.episode_id]}
            async with http.get(f"{url}/v1/episodes/{traj.episode_id}", headers=holder) as resp:
                calls = (await resp.json())["calls"]
            recorded = calls[0]["prompt_ids"] + calls[0]["choices"][0]["completion_ids"]
            assert traj.token_ids[: len(recorded)] == recorded  # the learner's row is the record
    assert status["own_tasks"] == {"waiting": 1, "task_ids": 1, "expired": 0}
    await client.close()


def test_own_task_groups_take_only_rewarded_ad_hoc_episodes_and_count_expiry():
    import time

    from tunix_agentic.rollout.openai_endpoint.recording import Episode
    from tunix_agentic.rollout.openai_endpoint.store import EpisodeLimits, EpisodeStore

    store = EpisodeStore(EpisodeLimits(closed_ttl_s=60.0))

    def closed(eid, *, task, client="10.0.0.1", reward=1.0, age=0.0):
        ep = Episode(eid, key=eid, client=client, closed=True, reward=reward, task_id=task)
        store.closed[eid] = (ep, time.monotonic() - age)

    closed("old", task="t0", age=120.0)  # past closed_ttl_s: expires, counted
    closed("claimed", task="t1", client="")  # a claimed member: its group takes it
    closed("no-task", task=None)  # never grouped
    closed("withdrawn", task="t1", reward=None)
    closed("a1", task="t1")
    closed("b1", task="t2")
    assert store.take_group(2) is None
    closed("b2", task="t2")
    closed("a2", task="t1")
    task_id, episodes = store.take_group(2)  # t2 filled first
    assert (task_id, [e.episode_id for e in episodes]) == ("t2", ["b1", "b2"])
    assert store.count_waiting() == {"t1": 2} and store.closed_expired == 1
    assert [e.episode_id for e in store.take_group(2)[1]] == ["a1", "a2"]
    assert store.take_group(1) is None  # what is grouped is never taken again
    assert "claimed" in store.closed and "no-task" in store.closed


@pytest.mark.parametrize(
    "body, field",
    [({"wait_s": -1}, "wait_s"), ({"wait_s": "1"}, "wait_s"), ({"n": 1}, "n"), ([1], "object")],
    ids=["negative", "string", "unknown", "not-an-object"],
)
async def test_a_bad_claim_is_a_400_naming_the_field(node, body, field):
    _, url = node
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/episodes/claim", json=body) as resp:
            assert resp.status == 400 and field in (await resp.json())["error"]["message"]


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["rollout.service.agent=outside", "rollout.service.urls=[http://a:1]"], "must be"),
        (["rollout.service.agent=external"], "needs rollout.service.urls"),
        (["rollout.service.agent=own_tasks"], "needs rollout.service.urls"),
    ],
    ids=["unknown", "without-nodes", "own-tasks-without-nodes"],
)
def test_service_agent_is_validated(overrides, key):
    with pytest.raises(ConfigError, match=f"rollout.service.agent.* {key}"):
        load_config(CONFIG, overrides)


def test_the_wire_names_the_agent_only_when_external():
    external = _request("x", 1)
    assert external.to_json()["agent"] == "external"
    assert GroupRequest.from_json(external.to_json()) == external
    # A builtin group's body is as before the field existed (logged bodies still match).
    assert "agent" not in dataclasses.replace(external, agent="builtin").to_json()
    own = dataclasses.replace(external, agent="own_tasks")
    assert GroupRequest.from_json(own.to_json()) == own
    with pytest.raises(ValueError, match="agent must be one of"):
        GroupRequest.from_json({**external.to_json(), "agent": "outside"})


# ----------------------------------------------------------------- training
def _rl_steps(run_dir: Path) -> list[int]:
    path = run_dir / "tensorboard" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    return [row["step"] for row in rows if "learner/loss" in row]


async def _groups_on(url: str, group_ids: list[str]) -> list:
    async with NodeClient(url) as nodes:
        return [group_from_json((await nodes.get(gid, wait_s=0))["group"]) for gid in group_ids]


@pytest.mark.slow  # SFT warm start, then two RL steps whose episodes the agent runs
@pytest.mark.parametrize("kind", ["external", "own_tasks"], ids=["claims", "own-tasks"])
def test_the_openai_agent_trains_the_calculator_through_a_node(tmp_path, kind):
    from tunix_agentic.trainer import Trainer

    argv = cli("serve-rollout", "--config", CONFIG, "--port", "0")
    argv += ["--state-dir", str(tmp_path / "node"), *SHARED]
    node_proc, url = spawn_server(
        argv, "serving rollout node on ", log=tmp_path / "node.log", timeout_s=BOUND_S
    )
    episodes = tmp_path / "agent.out"
    with open(episodes, "w") as out, open(tmp_path / "agent.log", "w") as err:
        agent = subprocess.Popen(
            [sys.executable, str(AGENT_SCRIPT), "--url", url, "--concurrency", "4"]
            + (["--own-tasks", "2"] if kind == "own_tasks" else []),  # the run's group_size
            cwd=REPO,
            stdout=out,
            stderr=err,
            env=_env(),
        )
    run = tmp_path / "run"
    overrides = [*SHARED, "rl.steps=2", "rl.eval_tasks=0", "rl.checkpoint_every=0"]
    overrides += [f"run_dir={run}", f"rollout.service.urls=[{url}]"]
    overrides += [f"rollout.service.agent={kind}"]
    try:
        trainer = Trainer(load_config(CONFIG, overrides), progress=False)
        result = trainer.run()
        trained = asyncio.run(_groups_on(url, [gid for gid, _ in trainer.rollout_service.outcomes]))
    finally:
        stop_server(agent)
        stop_server(node_proc)
    assert len(result.history) == 2 and _rl_steps(run) == [1, 2]
    outcomes = trainer.rollout_service.outcomes
    assert outcomes and {how for _, how in outcomes} == {"done"}
    # "episode ID group GROUP reward R tool_calls N" per episode the agent ran (claims; the
    # ids are the node's unguessable ones, so the claim's group_id ties them to their
    # group), or "episode ID task TASK ..." (own tasks, each run twice).
    ran = [line.split()[3] for line in episodes.read_text().splitlines()]
    if kind == "external":
        for group_id, _ in outcomes:  # every member of every group was the agent's
            assert ran.count(group_id) >= 2, (group_id, ran)
    else:  # every group is two episodes of one of the agent's own tasks (seed 1234)
        for group in trained:
            task_id = group.task.task_id
            assert task_id.startswith("train-1234-") and ran.count(task_id) == 2, (task_id, ran)
            assert [t.task_id for t in group.trajectories] == [task_id] * 2
