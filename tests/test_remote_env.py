"""Remote environments: the env server (as a real CLI process, and in-process on loopback)
and RemoteEnv, alone and under the rollout orchestrator."""

from __future__ import annotations

import asyncio
import dataclasses
import signal
import subprocess
import time

import aiohttp
import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.agent.tool_parser import format_tool_call, parse_qwen3
from tunix_agentic.cli.main import main as cli_main
from tunix_agentic.envs.base import Action, Environment, StepResult, Task, make_env, register_env
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.envs.frozenlake import FrozenLakeTasks
from tunix_agentic.envs.remote import (
    RemoteEnv,
    RemoteEnvError,
    action_from_json,
    action_to_json,
    task_from_json,
    task_to_json,
)
from tunix_agentic.envs.tools import ToolCall, ToolUnavailable
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.rollout.episode import InitResult
from tunix_agentic.serving.env_server import EnvServerConfig, start_env_server
from tunix_agentic.testing import memorize, spawn_serve_env, tiny_model

TEMPLATE = ChatTemplate(CharTokenizer(128))
TASKS = [make_arithmetic_task(i, seed=0, split="train") for i in range(3)]
GREEDY = AgentConfig(max_turns=3, max_new_tokens=40, temperature=0.0)


# --- a real server process ------------------------------------------------------------------


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="module")
def server():
    proc, url = spawn_serve_env("--env", "arithmetic")
    yield url
    assert stop(proc) == 0  # a clean shutdown on SIGTERM


@pytest.fixture(scope="module")
def tool_user():
    """A tiny real policy that memorized one correct tool-use episode of TASKS[0]."""
    task = TASKS[0]
    call = format_tool_call("calculator", {"expression": task.expression})
    segments = [
        (TEMPLATE.prompt_ids(task.prompt), 0.0),
        (TEMPLATE.assistant_ids(call), 1.0),
        (TEMPLATE.observation_ids([{"role": "tool", "content": task.answer}]), 0.0),
        (TEMPLATE.assistant_ids(f"<answer>{task.answer}</answer>"), 1.0),
    ]
    ids = [i for seg, _ in segments for i in seg]
    mask = [m for seg, m in segments for _ in seg]
    return memorize(tiny_model(seed=1), [(ids, mask)], steps=150), ids


def orchestrator(model, env_factory, **cfg) -> RolloutOrchestrator:
    engine = JaxEngine(model, EngineConfig(max_slots=8, max_seq_len=128, decode_steps=8))
    config = RolloutConfig(**{"group_size": 2, "filter_uniform_groups": False, **cfg})
    return RolloutOrchestrator.in_process(engine, env_factory, TEMPLATE, GREEDY, config)


async def test_remote_episodes_match_local_ones(server):
    for task, right in zip(TASKS, (True, False, True), strict=True):
        local, remote = ArithmeticEnv(), RemoteEnv(server, env_name="arithmetic")
        try:
            assert await remote.reset(task) == await local.reset(task)
            assert remote.tool_schemas() == local.tool_schemas() and remote.episode_id
            call = parse_qwen3(format_tool_call("calculator", {"expression": task.expression}))
            got, want = await remote.step(call), await local.step(call)
            assert (got.observation, got.messages, got.done) == (
                want.observation,
                want.messages,
                want.done,
            )
            assert got.info["status"] == "tool" and got.info["tool_calls"][0]["error"] is False
            answer = task.answer if right else task.answer + "1"
            got, want = (
                await remote.step(parse_qwen3(f"<answer>{answer}</answer>")),
                await local.step(parse_qwen3(f"<answer>{answer}</answer>")),
            )
            assert got.done and got.reward == want.reward == (1.0 if right else 0.0)
            assert await remote.evaluate() == await local.evaluate()
        finally:
            await remote.close()
            await remote.close()  # idempotent
    async with aiohttp.ClientSession() as http, http.get(server + "/health") as resp:
        assert (await resp.json())["episodes"] == 0  # every closed episode is gone


async def test_remote_env_raising_is_an_exception_not_a_reward(server):
    env = RemoteEnv(server)
    try:
        # ArithmeticEnv refuses a Task without an answer: the server answers 500, the client
        # raises.
        with pytest.raises(RemoteEnvError, match="TypeError: task 't' has no answer"):
            await env.reset(Task(task_id="t", prompt="Compute 1+1."))
        with pytest.raises(RemoteEnvError, match="HTTP 500") as info:
            await env.step(Action(text="x", answer="2"))  # stepping before a reset
        assert info.value.status == 500
    finally:
        await env.close()
    wrong = RemoteEnv(server, env_name="frozenlake")
    with pytest.raises(RemoteEnvError, match="serves environment 'arithmetic'"):
        await wrong.reset(TASKS[0])
    await wrong.close()


async def test_make_env_remote_passes_env_kwargs_to_the_server(server):
    env = make_env("remote", url=server, env="arithmetic", env_kwargs={"tool_timeout": 2.5})
    assert isinstance(env, RemoteEnv) and env.env_kwargs == {"tool_timeout": 2.5}
    try:
        assert await env.reset(TASKS[1]) == TASKS[1].prompt
    finally:
        await env.close()
    bad = make_env("remote", url=server, env="arithmetic", env_kwargs={"tool_timeout": -1.0})
    with pytest.raises(RemoteEnvError, match="HTTP 400.*tool_timeout must be positive"):
        await bad.reset(TASKS[1])
    await bad.close()


async def test_orchestrator_runs_remote_episodes_like_local_ones(server, tool_user):
    model, demo_ids = tool_user
    orch = orchestrator(model, lambda: RemoteEnv(server, env_name="arithmetic"))
    try:
        (group,) = await orch.run_tasks([TASKS[0]], group_size=2)
    finally:
        await orch.runner.engine.close()
    assert not group.dropped and len(group.trajectories) == 2
    for traj in group.trajectories:
        assert traj.status == "ok" and traj.reward == 1.0
        assert traj.steps[0].tool_calls[0]["name"] == "calculator"
        assert traj.learner_arrays()["input_ids"].tolist() == demo_ids


async def test_killed_server_mid_episode_is_an_infrastructure_failure(tool_user):
    model, _ = tool_user
    proc, url = spawn_serve_env("--env", "arithmetic")
    env = RemoteEnv(url, env_name="arithmetic", timeout_s=10)
    try:
        prompt = await env.reset(TASKS[0])  # INIT done on the server...
        proc.kill()  # ...which then dies without a goodbye
        proc.wait(timeout=20)
        orch = orchestrator(  # a server that stays down: not waited for (backend_wait_s=0)
            model, lambda: RemoteEnv(url, timeout_s=10), infra_retries=1, backend_wait_s=0
        )
        try:
            group = await orch.run_group(
                TASKS[0], prepared=[InitResult(env, TEMPLATE.prompt_ids(prompt))]
            )
        finally:
            await orch.runner.engine.close()
    finally:
        stop(proc)
    # The model acted, the environment could not answer: no trajectory is scored.
    assert group.trajectories == [] and group.lost == 1
    first, retry = group.dropped
    assert first.status == "env_error" and "unreachable" in first.error and first.steps
    assert retry.status == "env_error" and retry.error.startswith("INIT")  # a fresh env fails
    assert orch.stats["infra_failures"] == 2
    await env.close()  # closing against a dead server is not an error


def test_cli_refuses_beyond_loopback_without_a_key(capsys, monkeypatch):
    monkeypatch.delenv("TUNIX_AGENTIC_API_KEY", raising=False)
    argv = ["serve-env", "--env", "arithmetic", "--host", "0.0.0.0", "--port", "0"]
    assert cli_main(argv) == 2
    assert "refusing to serve on 0.0.0.0" in capsys.readouterr().err
    assert cli_main(["serve-env", "--env", "no-such-env", "--port", "0"]) == 2
    assert "unknown environment 'no-such-env'" in capsys.readouterr().err


# --- an in-process server with a probe environment ----------------------------------------


class ProbeEnv(Environment):
    """Echoes answers; ``boom`` raises, ``down`` is a dead tool sandbox, ``end`` ends."""

    closed = 0

    async def reset(self, task: Task) -> str:
        return f"probe {task.prompt} {task.data.get('n', 0)}"

    async def step(self, action: Action) -> StepResult:
        if action.answer == "boom":
            raise RuntimeError("boom")
        if action.answer == "down":
            raise ToolUnavailable("the sandbox died")
        # info holds something JSON cannot carry: it travels as its text.
        return StepResult("echo " + str(action.answer), 0.5, action.answer == "end", {"s": {1}})

    async def close(self) -> None:
        type(self).closed += 1


register_env("test-probe")(ProbeEnv)


async def start(**cfg):
    config = EnvServerConfig(**{"env_name": "test-probe", **cfg})
    runner, port = await start_env_server(config)
    return runner, f"http://127.0.0.1:{port}"


async def http(method: str, url: str, body=None, key: str | None = None, token: str | None = None):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if token is not None:
        headers["X-Episode-Token"] = token
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, url, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_errors_tool_failures_and_unknown_episodes():
    runner, url = await start()
    env = RemoteEnv(url)
    try:
        assert await env.reset(Task("t", "hi", data={"n": 3})) == "probe hi 3"
        step = await env.step(Action(text="", answer="x"))
        assert step.observation == "echo x" and step.reward == 0.5 and step.info == {"s": "{1}"}
        with pytest.raises(RemoteEnvError, match="RuntimeError: boom") as info:
            await env.step(Action(text="", answer="boom"))
        assert info.value.status == 500
        with pytest.raises(ToolUnavailable, match="the sandbox died"):
            await env.step(Action(text="", answer="down"))  # -> the orchestrator's tool_error
        assert (await env.step(Action(text="", answer="end"))).done
        status, body = await http("POST", url + "/envs/nope/step", {"action": {"text": ""}})
        assert status == 404 and "unknown episode 'nope'" in body["error"]["message"]
        status, body = await http("DELETE", url + "/envs/nope")
        assert status == 404 and body["error"]["type"] == "KeyError"
        # Only Task and the environment's own dataclasses are ever built from a request.
        episode, token = env.episode_id, env._token
        task = {"type": "subprocess:CompletedProcess", "fields": {"args": "x", "returncode": 0}}
        status, body = await http(
            "POST", f"{url}/envs/{episode}/reset", {"task": task}, token=token
        )
        assert status == 400 and "not accepted" in body["error"]["message"]
        action = {"action": {"text": 3}}
        status, body = await http("POST", f"{url}/envs/{episode}/step", action, token=token)
        assert status == 400 and "'text' must be a string" in body["error"]["message"]
    finally:
        await env.close()
        await runner.cleanup()


async def test_another_client_can_neither_step_nor_close_an_episode():
    """Item 2 of issue 32: serve-env episode ids are unguessable (no prefix and counter)
    and every request on an episode needs its token: another client's step, evaluate or
    delete, with no token or a wrong one, is a 403 that leaves the episode as it was."""
    runner, url = await start()
    owner, other = RemoteEnv(url), RemoteEnv(url)
    try:
        await owner.reset(Task("t", "hi"))
        await other.reset(Task("t", "hi"))
        ids = [owner.episode_id, other.episode_id]
        # 128 random bits each: not a shared prefix with a counter after it.
        assert all(len(i) >= 22 for i in ids) and ids[0][:8] != ids[1][:8]
        mine = owner.episode_id
        for token in (None, other._token):
            for method, path, body in (
                ("POST", f"/envs/{mine}/step", {"action": {"text": "", "answer": "end"}}),
                ("POST", f"/envs/{mine}/evaluate", None),
                ("DELETE", f"/envs/{mine}", None),
            ):
                status, answer = await http(method, url + path, body, token=token)
                assert status == 403 and "X-Episode-Token" in answer["error"]["message"]
        step = await owner.step(Action(text="", answer="x"))  # still the owner's, still open
        assert step.observation == "echo x"
    finally:
        await owner.close()
        await other.close()
        await runner.cleanup()


async def test_api_key_guards_every_route_but_health():
    with pytest.raises(ValueError, match="without an API key"):
        await start_env_server(EnvServerConfig("test-probe"), host="0.0.0.0")
    runner, url = await start(api_key="sesame")
    try:
        assert (await http("GET", url + "/health"))[0] == 200
        assert (await http("POST", url + "/envs", {}))[0] == 401
        wrong = RemoteEnv(url, api_key="open")
        with pytest.raises(RemoteEnvError, match="HTTP 401.*API key") as info:
            await wrong.reset(Task("t", "hi"))
        assert info.value.status == 401
        await wrong.close()
        right = RemoteEnv(url, api_key="sesame")
        assert await right.reset(Task("t", "hi")) == "probe hi 0"
        await right.close()
    finally:
        await runner.cleanup()


async def test_idle_episodes_are_reaped_and_shutdown_closes_the_rest():
    ProbeEnv.closed = 0
    runner, url = await start(idle_timeout_s=0.4, max_episodes=3)
    envs = [RemoteEnv(url) for _ in range(3)]
    try:
        idle, busy = envs[0], envs[1:]
        for env in envs:
            await env.reset(Task("t", "hi"))
        status, body = await http("POST", url + "/envs", {})
        assert status == 503 and "limit" in body["error"]["message"]  # max_episodes
        deadline = time.monotonic() + 1.2
        while time.monotonic() < deadline:  # keep two episodes in use, leave one idle
            for env in busy:
                await env.step(Action(text="", answer="x"))
            await asyncio.sleep(0.1)
        assert ProbeEnv.closed == 1
        assert (await http("GET", url + "/health"))[1]["episodes"] == 2
        with pytest.raises(RemoteEnvError, match="HTTP 404.*unknown episode") as info:
            await idle.step(Action(text="", answer="x"))
        assert info.value.status == 404
    finally:
        await runner.cleanup()
        for env in envs:
            await env.close()  # the server is gone: nothing to free, no error
    assert ProbeEnv.closed == 3  # stopping the server closed the episodes still open


async def test_frozenlake_tasks_travel_to_a_remote_env():
    source = FrozenLakeTasks()
    task = source.task(0, seed=0, split="train")
    demo = source.demonstration(task, rng=np.random.default_rng(0), use_tools=False)
    runner, port = await start_env_server(EnvServerConfig("frozenlake"))
    env = RemoteEnv(f"http://127.0.0.1:{port}", env_name="frozenlake")
    try:
        assert await env.reset(task) == task.prompt and env.tool_schemas() == []
        for k, message in enumerate(demo[::2]):
            result = await env.step(parse_qwen3(message["content"]))
            if not result.done:
                assert demo[2 * k + 1]["content"] == result.observation
        assert result.info["status"] == "success" and await env.evaluate() == 1.0
    finally:
        await env.close()
        await runner.cleanup()


# --- the wire format ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Point:
    x: int
    tags: tuple[str, ...] = ()


def test_tasks_and_actions_round_trip_and_bad_tasks_are_refused():
    task = Task("t1", "p", answer=[1, 2], data={"grid": ("SF", "FG"), "n": 1.5}, task_name="k")
    wire = task_to_json(task)
    assert wire["type"] == "tunix_agentic.envs.base:Task"
    back = task_from_json(wire, {wire["type"]: Task})
    assert back == dataclasses.replace(task, data={"grid": ["SF", "FG"], "n": 1.5})
    assert task_from_json(task_to_json(Point(3, ("a",))), {task_to_json(Point(0))["type"]: Point})
    with pytest.raises(TypeError, match="dataclass instance"):
        task_to_json({"prompt": "p"})
    with pytest.raises(ValueError, match=r"task field 'data'\['s'\] holds a set"):
        task_to_json(Task("t", "p", data={"s": {1}}))
    with pytest.raises(ValueError, match="nan"):
        task_to_json(Task("t", "p", answer=float("nan")))

    @dataclasses.dataclass
    class Local:
        x: int

    with pytest.raises(ValueError, match="inside a function"):
        task_to_json(Local(1))
    with pytest.raises(ValueError, match="no field"):
        task_from_json({"type": "T", "fields": {"bogus": 1}}, {"T": Task})

    action = Action("t", (ToolCall("calc", {"e": "1+1"}),), answer=None, parse_errors=("bad",))
    assert action_from_json(action_to_json(action)) == action
    with pytest.raises(ValueError, match="arguments"):
        action_from_json({"text": "", "tool_calls": [{"name": "c", "arguments": [1]}]})
