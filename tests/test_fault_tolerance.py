"""Nothing hangs silently, nothing is lost: the run-level guarantees of the orchestrator.

Each test drives the real orchestrator with a real JAX engine on a tiny model.
"""

import asyncio
import itertools

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.envs.tools import ToolUnavailable
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.rollout.orchestrator import InfraFailureError, episode_seed
from tunix_agentic.testing import arithmetic_demonstration as demonstration
from tunix_agentic.testing import memorize, tiny_model

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
    return RolloutOrchestrator(
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
        await orch.engine.close()


async def test_evaluation_also_stops_on_endless_infrastructure_failures(tool_user):
    orch = make_orch(tool_user, ResetFails, max_infra_failures_in_a_row=4)
    try:
        with pytest.raises(InfraFailureError, match="sandbox image missing"):
            await orch.run_tasks([TASK] * 3, group_size=2)
    finally:
        await orch.engine.close()


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
        await orch.engine.close()
    assert len(group.trajectories) == 2 and group.lost == 1
    (failed,) = group.dropped
    assert failed.status == "env_error" and error in failed.error
    assert [t.status for t in group.trajectories] == ["ok", "ok"]
    assert all(t.reward == 1.0 for t in group.trajectories)
    row = metrics.write_step(1)
    assert row["count/rollout/status/env_error"] == 1.0
    assert row["count/rollout/status/ok"] == 2.0
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
            await orch.engine.close()
    assert outs[0] == outs[1]
