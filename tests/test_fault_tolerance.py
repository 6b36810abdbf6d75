"""Nothing hangs silently, nothing is lost: the run-level guarantees of the orchestrator.

Each test drives the real orchestrator with a real JAX engine on a tiny model.
"""

import asyncio
import itertools
import json
import random
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.envs.remote import RemoteEnv
from tunix_agentic.envs.tools import ToolUnavailable
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.rollout.episode import InfraFailureError, InitResult, episode_seed
from tunix_agentic.rollout.outages import backoff_delay
from tunix_agentic.serving.env_server import EnvServerConfig, start_env_server
from tunix_agentic.testing import TINY_RUN_OVERRIDES, memorize, spawn_serve_env, tiny_model
from tunix_agentic.testing import arithmetic_demonstration as demonstration
from tunix_agentic.trainer import train

REPO = Path(__file__).resolve().parents[1]

TEMPLATE = ChatTemplate(CharTokenizer(128))
AGENT = AgentConfig(max_turns=3, max_new_tokens=40, temperature=0.0)
TASK = make_arithmetic_task(0, seed=0, split="train")


@pytest.fixture(scope="module")
def tool_user():
    """A real policy that calls the calculator on TASK (so every episode reaches env.step)."""
    demo = demonstration(TASK, TEMPLATE, use_tool=True, rng=np.random.default_rng(0))
    return memorize(tiny_model(seed=1), [(demo["input_ids"], demo["loss_mask"])], steps=150)


def make_orch(model, env_factory, *, metrics=None, engine=None, **cfg):
    engine = engine or JaxEngine(model, EngineConfig(max_slots=8, max_seq_len=128, decode_steps=8))
    config = RolloutConfig(
        **{
            "group_size": 2,
            "groups_per_batch": 1,
            "filter_uniform_groups": False,
            "infra_retries": 0,
            **cfg,
        }
    )
    return RolloutOrchestrator.in_process(
        engine,
        env_factory,
        TEMPLATE,
        AGENT,
        config,
        tasks=itertools.repeat(TASK),
        metrics=metrics,
    )


class ResetFails(ArithmeticEnv):
    async def reset(self, task):
        raise ConnectionError("sandbox image missing")


class ToolDown(ArithmeticEnv):
    async def step(self, action):
        raise ToolUnavailable("calculator service is down")


async def _closed_engine(model):
    engine = JaxEngine(model, EngineConfig(max_slots=8, max_seq_len=128, decode_steps=8))
    await engine.close()
    return engine


@pytest.mark.parametrize(
    "trigger,quote",
    [
        ("reset_raises", "sandbox image missing"),
        ("dead_engine", "engine_error"),
        ("tool_unavailable", "calculator service is down"),
    ],
    ids=["reset_raises", "dead_engine", "tool_unavailable"],
)
async def test_a_run_whose_episodes_keep_failing_on_infrastructure_stops(tool_user, trigger, quote):
    """Before: get_batch waited forever. Now: an error quoting the last failure."""
    env = {"reset_raises": ResetFails, "tool_unavailable": ToolDown}.get(trigger, ArithmeticEnv)
    engine = await _closed_engine(tool_user) if trigger == "dead_engine" else None
    orch = make_orch(tool_user, env, engine=engine, max_infra_failures_in_a_row=6)
    orch.start()
    try:
        with pytest.raises(InfraFailureError, match="6 episodes in a row") as err:
            await asyncio.wait_for(orch.get_batch(), timeout=120)
        assert quote in str(err.value)
    finally:
        await orch.stop()
        await orch.runner.engine.close()


async def test_evaluation_also_stops_on_endless_infrastructure_failures(tool_user):
    orch = make_orch(tool_user, ResetFails, max_infra_failures_in_a_row=4)
    try:
        with pytest.raises(InfraFailureError, match="sandbox image missing"):
            await orch.run_tasks([TASK] * 3, group_size=2)
    finally:
        await orch.runner.engine.close()


class _Counted(ArithmeticEnv):
    """Every instance numbered, so one member of a group can misbehave."""

    made = itertools.count()

    def __init__(self, **kw):
        super().__init__(**kw)
        self.number = next(self.made)


class NonAsciiObservation(_Counted):
    async def step(self, action):
        result = await super().step(action)
        if self.number == 0 and not result.done:
            result.observation = "<tool_response>résultat 3523 ✓</tool_response>"
            result.messages = [{"role": "tool", "content": "résultat 3523 ✓"}]
        return result


class BuggyReward(_Counted):
    async def evaluate(self):
        if self.number == 0:
            return {"reward": 1.0}["score"]  # a user's bug: KeyError
        return await super().evaluate()


class BuggyStep(_Counted):
    async def step(self, action):
        if self.number == 0:
            raise AttributeError("'NoneType' object has no attribute 'board'")
        return await super().step(action)


@pytest.mark.parametrize(
    "env,error",
    [
        (NonAsciiObservation, "cannot be encoded"),
        (BuggyReward, "KeyError"),
        (BuggyStep, "AttributeError"),
    ],
    ids=["non_ascii_observation", "reward_function_bug", "env_step_bug"],
)
async def test_an_episode_that_raises_ends_alone_with_a_recorded_status(
    tool_user, env, error, tmp_path
):
    """Before: the exception killed the whole group silently. Now: that episode ends with
    status env_error and the error recorded; the rest of the group is scored."""
    env.made = itertools.count()
    metrics = MetricsRecorder(tmp_path)
    orch = make_orch(tool_user, env, metrics=metrics, group_size=3)
    try:
        group = await orch.run_group(TASK)
    finally:
        await orch.runner.engine.close()
    assert len(group.trajectories) == 2 and group.lost == 1
    (failed,) = group.dropped
    assert failed.status == "env_error" and error in failed.error
    assert [t.status for t in group.trajectories] == ["ok", "ok"]
    assert all(t.reward == 1.0 for t in group.trajectories)
    row = metrics.write_step(1)
    assert row["count/rollout/status/env_error_total"] == 1.0
    assert row["count/rollout/status/ok_total"] == 2.0
    metrics.close()


def test_episode_seeds_are_apart_per_stream_and_stay_within_63_bits():
    seeds = {
        episode_seed(run, stream, index, member, 0)
        for run in (0, 2**32 - 1)
        for stream in (0, 1)
        for index in range(50)
        for member in range(8)
    }
    assert len(seeds) == 2 * 2 * 50 * 8
    assert all(0 <= s < 2**63 for s in seeds)


async def test_evaluation_does_not_shift_the_training_episodes_seeds(tool_user):
    """Training groups take their index from the task stream alone: an evaluation before
    them (which a resumed run skips) changes no training episode's seed."""
    AgentConfig_sampled = AgentConfig(max_turns=3, max_new_tokens=40, temperature=1.0)
    outs = []
    for evaluate_first in (False, True):
        orch = make_orch(tool_user, ArithmeticEnv)
        orch.agent_config = AgentConfig_sampled
        try:
            if evaluate_first:
                await orch.run_tasks([TASK] * 3, group_size=2)
            orch.start()
            (group,) = await orch.get_batch()
            outs.append([t.token_ids for t in group.trajectories])
        finally:
            await orch.stop()
            await orch.runner.engine.close()
    assert outs[0] == outs[1]


# ---------------------------------------------------------- a restarting env server
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _WatchedRemoteEnv(RemoteEnv):
    """A RemoteEnv that tells the test when its health probe first found the server down."""

    down_seen: asyncio.Event

    async def backend_health(self) -> bool:
        up = await super().backend_health()
        if not up:
            type(self).down_seen.set()
        return up


async def test_a_restarting_env_server_is_waited_for_and_its_failures_do_not_count(
    tool_user, tmp_path
):
    """Before: the first failed episode (max_infra_failures_in_a_row=1) stopped the run while
    the server was being restarted. Now: the orchestrator finds it down through
    RemoteEnv.backend_health (GET /health), waits, and the retries succeed."""
    _WatchedRemoteEnv.down_seen = asyncio.Event()
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    metrics = MetricsRecorder(tmp_path)
    orch = make_orch(
        tool_user,
        lambda: _WatchedRemoteEnv(url, env_name="arithmetic", timeout_s=10),
        metrics=metrics,
        infra_retries=1,
        max_infra_failures_in_a_row=1,
        infra_backoff_s=0.05,
    )
    runner = None
    orch.start()  # the server is down: being restarted
    batch = asyncio.ensure_future(orch.get_batch())
    try:
        down = asyncio.ensure_future(_WatchedRemoteEnv.down_seen.wait())
        await asyncio.wait({batch, down}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        down.cancel()
        if batch.done():
            batch.result()  # an InfraFailureError here is the bug
        assert _WatchedRemoteEnv.down_seen.is_set()
        runner, _ = await start_env_server(EnvServerConfig("arithmetic"), port=port)  # it is back
        (group,) = await asyncio.wait_for(batch, timeout=120)
    finally:
        batch.cancel()
        await orch.stop()
        await orch.runner.engine.close()
        if runner is not None:
            await runner.cleanup()
    assert [t.status for t in group.trajectories] == ["ok", "ok"]
    assert group.dropped and all("unreachable" in t.error for t in group.dropped)
    row = metrics.write_step(1)
    assert row["count/rollout/backend_down_total"] == 1.0  # one watch, shared by every member
    # Other groups' too.
    assert row["count/rollout/infra_failures_excused_total"] >= len(group.dropped)
    metrics.close()


async def test_a_restart_no_request_saw_is_told_by_the_episodes_it_lost(tool_user):
    """The server restarted between two requests of an episode (nothing found it down):
    its 404 for the episode is the restart's sign. Before: the failure counted, and with
    max_infra_failures_in_a_row=1 the run stopped; now the retry runs and the run goes on."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    runner, _ = await start_env_server(EnvServerConfig("arithmetic"), port=port)
    env = RemoteEnv(url, env_name="arithmetic", timeout_s=10)
    prompt = await env.reset(TASK)  # the episode lives on the first server...
    await runner.cleanup()
    runner, _ = await start_env_server(EnvServerConfig("arithmetic"), port=port)  # ...not here
    orch = make_orch(
        tool_user,
        lambda: RemoteEnv(url, env_name="arithmetic", timeout_s=10),
        infra_retries=1,
        max_infra_failures_in_a_row=1,
        infra_backoff_s=0.05,
    )
    try:
        group = await orch.run_group(TASK, prepared=[InitResult(env, TEMPLATE.prompt_ids(prompt))])
        orch.offer(group)
        (batch,) = await asyncio.wait_for(orch.get_batch(), timeout=60)  # no InfraFailureError
    finally:
        await orch.runner.engine.close()
        await env.close()
        await runner.cleanup()
    (lost,) = batch.dropped
    assert "HTTP 404" in lost.error and "unknown episode" in lost.error
    assert [(t.status, t.reward) for t in batch.trajectories] == [("ok", 1.0)]


async def test_a_server_down_past_backend_wait_s_stops_the_run(tool_user):
    """The wait is bounded: a server that never comes back stops the run as before."""
    url = f"http://127.0.0.1:{_free_port()}"
    orch = make_orch(
        tool_user,
        lambda: RemoteEnv(url, env_name="arithmetic", timeout_s=10),
        infra_retries=1,
        max_infra_failures_in_a_row=3,
        infra_backoff_s=0.05,
        backend_wait_s=0.3,
    )
    orch.start()
    try:
        with pytest.raises(InfraFailureError, match="3 episodes in a row.*unreachable"):
            await asyncio.wait_for(orch.get_batch(), timeout=60)
    finally:
        await orch.stop()
        await orch.runner.engine.close()


@pytest.mark.parametrize(
    "field,value",
    [
        ("infra_backoff_s", -1.0),
        ("infra_backoff_max_s", float("inf")),
        ("backend_wait_s", float("nan")),
        ("infra_backoff_max_s", 0.5),  # below infra_backoff_s (1.0)
    ],
    ids=["negative_backoff", "infinite_cap", "nan_wait", "cap_below_base"],
)
def test_backoff_settings_are_checked_naming_the_field(field, value):
    with pytest.raises(ValueError, match=rf"rollout\.{field}"):
        RolloutConfig(**{field: value})


def test_backoff_delays_are_jittered_exponential_and_bounded():
    rng = random.Random(0)
    for retry, ceiling in ((1, 0.5), (2, 1.0), (3, 2.0), (10, 3.0), (10_000, 3.0)):
        delays = [backoff_delay(retry, 0.5, 3.0, rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert len(set(delays)) == 200  # jittered: no two retries come back together


def _logged_rl_step(run: Path) -> int:
    log = run / "tensorboard" / "metrics.jsonl"
    steps = [0]
    for line in log.read_text().splitlines() if log.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "learner/loss" in row:
            steps.append(row["step"])
    return max(steps)


def _episodes_open(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=5) as resp:
            return json.loads(resp.read())["episodes"]
    except OSError:
        return 0


@pytest.mark.slow
def test_a_training_run_goes_on_through_a_sigkilled_and_restarted_env_server(tmp_path):
    """The issue's case, scaled down: serve-env is SIGKILLed while episodes are open on it
    and started again on its port; with max_infra_failures_in_a_row=4 the immediate retries
    of before stopped the run, now it waits for /health and finishes."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    run = tmp_path / "run"
    servers = [spawn_serve_env("--env", "arithmetic", port=port, log=tmp_path / "serve-env.log")[0]]
    killed: list[int] = []

    def kill_and_restart() -> None:
        deadline = time.monotonic() + 300
        while _logged_rl_step(run) < 1 or _episodes_open(url) == 0:  # mid-RL, episodes open
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)
        servers[0].kill()
        servers[0].wait()
        killed.append(_logged_rl_step(run))
        servers.append(
            spawn_serve_env("--env", "arithmetic", port=port, log=tmp_path / "serve-env.log")[0]
        )

    source = (
        "tasks=[{name: arithmetic, env: remote, tasks_from: arithmetic, env_kwargs: "
        f"{{url: '{url}', env: arithmetic, timeout_s: 10}}}}]"
    )
    overrides = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "sft.steps=0", "rl.eval_tasks=0"]
    overrides += ["rl.steps=4", "rl.checkpoint_every=0", source, f"run_dir={run}"]
    overrides += ["rollout.max_infra_failures_in_a_row=4", "rollout.infra_backoff_s=0.2"]
    killer = threading.Thread(target=kill_and_restart, daemon=True)
    killer.start()
    try:
        result = train(str(REPO / "configs" / "calculator_tiny.yaml"), overrides, progress=False)
    finally:
        killer.join(timeout=120)
        for proc in servers:
            proc.kill()
            proc.wait()
    assert killed and killed[0] < 4, "the server was never killed mid-run"
    assert len(result.history) == 4
    last = result.history[-1]
    assert last["count/rollout/infra_failures_total"] >= 1  # the kill hit open episodes
    assert last["count/rollout/backend_down_total"] >= 1
    assert last["count/rollout/infra_failures_excused_total"] >= 1
