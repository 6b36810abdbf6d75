import asyncio
import dataclasses

import numpy as np
import pytest
from flax import nnx

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.base import Environment, StepResult, run_tool_calls
from tunix_agentic.envs.calculator import ArithmeticEnv, CalculatorTool, make_arithmetic_task
from tunix_agentic.envs.tools import Tool, ToolUnavailable, call_tool
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.inference.base import TokenOutput
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.rollout.stats import rollout_stats
from tunix_agentic.testing import arithmetic_demonstration as demonstration
from tunix_agentic.testing import memorize, tiny_model
from tunix_agentic.trajectory import POLICY_STATUSES

TOK = CharTokenizer(128)
TEMPLATE = ChatTemplate(TOK)
AGENT = AgentConfig(max_turns=3, max_new_tokens=40, temperature=1.0)
TASKS = [make_arithmetic_task(i, seed=0, split="train") for i in range(4)]


@pytest.fixture(scope="module")
def random_model():
    return tiny_model(seed=5)


@pytest.fixture(scope="module")
def tool_user():
    """A real policy that has memorized one correct two-turn tool-use episode."""
    demo = demonstration(TASKS[0], TEMPLATE, use_tool=True, rng=np.random.default_rng(0))
    model = memorize(tiny_model(seed=1), [(demo["input_ids"], demo["loss_mask"])], steps=150)
    return model, demo


def make_orch(model, **cfg):
    engine = JaxEngine(model, EngineConfig(max_slots=16, max_seq_len=128, decode_steps=8))
    config = RolloutConfig(
        **{"group_size": 3, "groups_per_batch": 2, "filter_uniform_groups": False, **cfg}
    )
    return RolloutOrchestrator.in_process(engine, ArithmeticEnv, TEMPLATE, AGENT, config)


async def test_groups_hold_g_episodes_of_their_task(random_model):
    orch = make_orch(random_model)
    groups = await orch.run_tasks(TASKS, group_size=3)
    assert [g.task.task_id for g in groups] == [t.task_id for t in TASKS]
    for g in groups:
        assert len(g.trajectories) == 3 and not g.dropped
        assert {t.task_id for t in g.trajectories} == {g.task.task_id}
        assert len({t.episode_id for t in g.trajectories}) == 3
        for t in g.trajectories:
            assert t.status in POLICY_STATUSES
            assert t.token_ids[: t.prompt_len] == TEMPLATE.prompt_ids(g.task.prompt)
            # Token-in/token-out: the history is the prompt plus exactly what the engine returned.
            generated = [i for s in t.steps for i in s.action_ids + s.observation_ids]
            assert t.token_ids[t.prompt_len :] == generated
    await orch.runner.engine.close()


async def test_multi_turn_tool_use_keeps_exact_ids_and_mask(tool_user):
    model, demo = tool_user
    orch = make_orch(model)
    agent = dataclasses.replace(AGENT, temperature=0.0)
    (group,) = await orch.run_tasks([TASKS[0]], agent_config=agent)
    traj = group.trajectories[0]
    assert traj.status == "ok" and traj.reward == 1.0
    assert len(traj.steps) == 2 and traj.steps[0].tool_calls[0]["name"] == "calculator"
    arrays = traj.learner_arrays()
    # What the learner trains on is, token for token, the demonstration the policy learned.
    np.testing.assert_array_equal(arrays["input_ids"], demo["input_ids"])
    np.testing.assert_array_equal(arrays["loss_mask"], demo["loss_mask"])
    assert np.all(arrays["old_logprobs"][arrays["loss_mask"] == 0] == 0)
    assert np.all(arrays["old_logprobs"][arrays["loss_mask"] == 1] < 0)
    await orch.runner.engine.close()


async def test_uniform_groups_are_filtered(tool_user):
    model, _ = tool_user
    orch = make_orch(model, filter_uniform_groups=True)
    agent = dataclasses.replace(AGENT, temperature=0.0)
    group = await orch.run_group(TASKS[0], agent_config=agent)
    assert group.rewards.tolist() == [1.0, 1.0, 1.0]
    assert orch.judge(group) == "filtered" and orch.stats["groups_filtered"] == 1
    await orch.runner.engine.close()


class FlakyEnv(ArithmeticEnv):
    """Every second instance fails to start, like a sandbox that will not come up."""

    created = 0
    closed = 0

    def __init__(self):
        super().__init__()
        type(self).created += 1
        self.fail = type(self).created % 2 == 0

    async def reset(self, task):
        if self.fail:
            raise RuntimeError("sandbox failed to start")
        return await super().reset(task)

    async def close(self):
        type(self).closed += 1


async def test_infra_failures_stay_out_of_group_statistics(random_model):
    orch = make_orch(random_model, group_size=4, infra_retries=0)
    orch.env_factory = FlakyEnv
    group = await orch.run_group(TASKS[1])
    assert len(group.dropped) == 2 and len(group.trajectories) == 2
    assert all(t.status == "env_error" and "sandbox failed" in t.error for t in group.dropped)
    assert group.rewards.shape == (2,) and group.lost == 2
    assert orch.stats["infra_failures"] == 2
    assert FlakyEnv.closed == FlakyEnv.created  # every environment was closed, failed or not
    await orch.runner.engine.close()


class FailsFirstEnv(ArithmeticEnv):
    """The first two sandboxes ever created crash; later ones work."""

    created = 0

    async def reset(self, task):
        type(self).created += 1
        if type(self).created <= 2:
            raise RuntimeError("sandbox crashed")
        return await super().reset(task)


async def test_infra_failures_are_retried_with_a_fresh_env(random_model):
    orch = make_orch(random_model, group_size=4, infra_retries=1)
    orch.env_factory = FailsFirstEnv
    group = await orch.run_group(TASKS[1])
    assert len(group.trajectories) == 4 and group.lost == 0
    assert len(group.dropped) == 2 and orch.stats["infra_retries"] == 2
    assert sorted(t.episode_id for t in group.dropped) == sorted(
        t.episode_id.replace("-retry1", "") for t in group.trajectories if "retry1" in t.episode_id
    )
    await orch.runner.engine.close()


def test_max_turns_schedule_follows_policy_version():
    cfg = RolloutConfig(max_turns_schedule=((0, 8), (100, 12), (200, 15)))
    assert [cfg.max_turns_at(v, default=4) for v in (0, 99, 100, 199, 250)] == [8, 8, 12, 12, 15]
    assert RolloutConfig().max_turns_at(7, default=4) == 4
    with pytest.raises(ValueError, match="max_turns_schedule"):
        RolloutConfig(max_turns_schedule=((10, 8), (5, 12)))
    with pytest.raises(ValueError, match="max_turns_schedule"):
        RolloutConfig(max_turns_schedule=((0, 0),))


class NeverDoneEnv(ArithmeticEnv):
    """Answers every turn with an observation and never ends the episode."""

    async def step(self, action):
        return StepResult("<tool_response>ok</tool_response>", 0.0, False)


async def test_schedule_sets_the_turn_budget_of_new_episodes(tool_user):
    model, _ = tool_user
    orch = make_orch(model, group_size=2, max_turns_schedule=((0, 1), (1, 3)))
    orch.env_factory = NeverDoneEnv
    orch.agent_config = dataclasses.replace(AGENT, temperature=0.0)
    g0 = await orch.run_group(TASKS[0])
    assert [len(t.steps) for t in g0.trajectories] == [1, 1]
    orch.set_version(1)
    g1 = await orch.run_group(TASKS[0])
    assert [len(t.steps) for t in g1.trajectories] == [3, 3]
    assert all(t.status == "max_turns" for t in g0.trajectories + g1.trajectories)
    await orch.runner.engine.close()


class SlowEnv(Environment):
    closed = 0

    async def reset(self, task):
        await asyncio.sleep(30)
        return "never"

    async def step(self, action):
        return StepResult("", 0.0, True)

    async def close(self):
        type(self).closed += 1


async def test_episode_timeout_is_recorded_and_env_closed(random_model):
    orch = make_orch(random_model, episode_timeout_s=0.2, group_size=2, infra_retries=0)
    orch.env_factory = SlowEnv
    group = await orch.run_group(TASKS[2])
    assert [t.status for t in group.dropped] == ["timeout", "timeout"]
    assert SlowEnv.closed == 2
    await orch.runner.engine.close()


async def test_stop_cancels_in_flight_episodes_and_closes_envs(random_model):
    SlowEnv.closed = 0
    orch = make_orch(random_model, group_size=2)
    orch.env_factory = SlowEnv
    orch.tasks = iter(TASKS * 10)
    orch.start()
    await asyncio.sleep(0.2)
    in_flight = orch.running_groups
    assert in_flight > 0
    await orch.stop()
    assert orch.pending_work == 0 and orch.running_groups == 0
    assert SlowEnv.closed == 2 * in_flight  # each started sandbox closed on cancellation
    await orch.runner.engine.close()


async def test_production_batches_and_admission_pacing(random_model):
    orch = make_orch(random_model, max_staleness=0, groups_per_batch=2)
    orch.tasks = iter([make_arithmetic_task(i, seed=1, split="train") for i in range(100)])
    orch.start()
    batch = await asyncio.wait_for(orch.get_batch(), timeout=120)
    assert len(batch) == 2 and batch[0].index < batch[1].index
    # Staleness 0: nothing new may start until the learner publishes version 1.
    await asyncio.sleep(0.3)
    assert orch.running_groups == 0 and orch.pacer.ready == 0
    orch.runner.engine.update_weights(nnx.state(random_model, nnx.Param), version=1)
    orch.set_version(1)
    batch2 = await asyncio.wait_for(orch.get_batch(), timeout=120)
    assert all(g.admitted_version == 1 for g in batch2)
    assert min(t.min_version for g in batch2 for t in g.trajectories) == 1
    await orch.stop()
    await orch.runner.engine.close()


async def test_episode_with_two_tool_calls():
    """A policy that checks its work with a second call: every call is executed and masked right."""
    task = TASKS[3]
    segments = [
        (TEMPLATE.prompt_text(task.prompt), 0.0),
        (
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{task.expression}"}}}}</tool_call><|im_end|>',
            1.0,
        ),
        (TEMPLATE.observation_text(f"<tool_response>{task.answer}</tool_response>"), 0.0),
        (
            f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{task.answer}"}}}}</tool_call><|im_end|>',
            1.0,
        ),
        (TEMPLATE.observation_text(f"<tool_response>{task.answer}</tool_response>"), 0.0),
        (f"<answer>{task.answer}</answer><|im_end|>", 1.0),
    ]
    ids, mask = [], []
    for text, m in segments:
        seg = TOK.encode(text)
        ids += seg
        mask += [m] * len(seg)
    model = memorize(tiny_model(seed=2), [(ids, mask)], steps=200)
    orch = make_orch(model)
    (group,) = await orch.run_tasks(
        [task], agent_config=dataclasses.replace(AGENT, temperature=0.0)
    )
    traj = group.trajectories[0]
    assert traj.status == "ok" and traj.reward == 1.0
    assert [len(s.tool_calls) for s in traj.steps] == [1, 1, 0]
    assert traj.token_ids == ids
    np.testing.assert_array_equal(traj.learner_arrays()["loss_mask"], np.asarray(mask, np.float32))
    await orch.runner.engine.close()


class GatedEnv(ArithmeticEnv):
    """Holds every episode at reset until the test opens the gate for its task."""

    gates: dict = {}

    async def reset(self, task):
        await self.gates.setdefault(task.task_id, asyncio.Event()).wait()
        return await super().reset(task)


async def test_learner_waits_for_a_straggler_instead_of_discarding_it(random_model):
    tasks = [make_arithmetic_task(i, seed=2, split="train") for i in range(50)]
    GatedEnv.gates = {t.task_id: asyncio.Event() for t in tasks}
    orch = make_orch(random_model, group_size=2, groups_per_batch=1, max_staleness=1)
    orch.env_factory = GatedEnv
    orch.tasks = iter(tasks)
    orch.start()
    await asyncio.sleep(0.2)
    # Admission paces to (1 + max_staleness) batches: tasks 0 and 1 are running.
    assert orch.running_groups == 2
    GatedEnv.gates[tasks[0].task_id].set()
    (b0,) = await asyncio.wait_for(orch.get_batch(), timeout=60)
    assert b0.task.task_id == tasks[0].task_id
    orch.set_version(1)
    await asyncio.sleep(0.1)
    # Task 1 (admitted at version 0) is now urgent: a younger group finishing first must not take its slot.
    for t in tasks[2:]:
        GatedEnv.gates[t.task_id].set()
    await asyncio.sleep(0.5)
    batch_task = asyncio.create_task(orch.get_batch())
    await asyncio.sleep(0.5)
    assert not batch_task.done()  # waiting for the straggler, not taking a younger group
    GatedEnv.gates[tasks[1].task_id].set()
    (b1,) = await asyncio.wait_for(batch_task, timeout=60)
    assert b1.task.task_id == tasks[1].task_id and orch.stats["stale_dropped"] == 0
    await orch.stop()
    await orch.runner.engine.close()


async def test_stragglers_older_than_the_bound_never_reach_the_learner(random_model):
    orch = make_orch(random_model, group_size=2, groups_per_batch=1, max_staleness=1)
    old = await orch.run_group(TASKS[0])  # sampled by version 0
    orch.runner.engine.update_weights(nnx.state(random_model, nnx.Param), version=2)
    orch.set_version(2)
    fresh = await orch.run_group(TASKS[1])  # sampled by version 2
    orch.offer(old)  # both finished, oldest first
    orch.offer(fresh)
    (batch,) = await orch.get_batch()
    assert batch is fresh and orch.stats["stale_dropped"] == 1
    assert 2 - batch.min_version <= 1
    await orch.runner.engine.close()


def test_resuming_at_a_version_paces_from_that_version(random_model):
    orch = make_orch(random_model, groups_per_batch=2, max_staleness=1)
    orch.set_version(5)  # a resumed run: five batches were consumed before
    assert orch.pacer.batches_taken == 5 and orch.pacer.may_admit()
    for _ in range(4):  # two batches ahead is the most staleness 1 allows
        orch.pacer.admitted(5)
    assert not orch.pacer.may_admit()


async def test_low_variance_groups_are_filtered_and_variable_batches_return_early(random_model):
    orch = make_orch(random_model, min_reward_std=0.3, groups_per_batch=4, min_groups_per_batch=2)
    low = await orch.run_group(TASKS[0])
    for t, r in zip(low.trajectories, [1.0, 1.0, 0.0], strict=True):
        t.reward = r  # std 0.47: kept
    assert orch.judge(low) == "keep"
    for t, r in zip(low.trajectories, [0.0, 0.0, 0.5], strict=True):
        t.reward = r  # std 0.24: too little signal
    assert orch.judge(low) == "filtered" and orch.stats["groups_filtered"] == 1
    g1, g2 = await orch.run_group(TASKS[1]), await orch.run_group(TASKS[2])
    orch.offer(g1)
    orch.offer(g2)
    batch = await asyncio.wait_for(orch.get_batch(), timeout=10)
    assert [g.index for g in batch] == [g1.index, g2.index]  # 2 of at most 4: returned early
    with pytest.raises(ValueError, match="min_groups_per_batch"):
        RolloutConfig(groups_per_batch=2, min_groups_per_batch=3)
    await orch.runner.engine.close()


class CountingEnv(ArithmeticEnv):
    """Counts every sandbox created, reset, stepped and closed (class-wide)."""

    created = reset_n = stepped = closed = 0
    fail_first = 0  # this many resets (the first ones) crash

    def __init__(self):
        super().__init__()
        type(self).created += 1
        self.was_stepped = False

    async def reset(self, task):
        type(self).reset_n += 1
        if type(self).reset_n <= type(self).fail_first:
            raise RuntimeError("sandbox crashed at start")
        return await super().reset(task)

    async def step(self, action):
        if not self.was_stepped:
            self.was_stepped = True
            type(self).stepped += 1
        return await super().step(action)

    async def close(self):
        type(self).closed += 1


def _counting_env(fail_first: int = 0) -> type[CountingEnv]:
    return type("Counted", (CountingEnv,), {"fail_first": fail_first})


async def _until(predicate, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_prefetch_initialises_groups_ahead_of_the_staleness_gate(random_model):
    env = _counting_env()
    orch = make_orch(
        random_model, max_staleness=0, groups_per_batch=1, group_size=2, prefetch_groups=2
    )
    orch.env_factory = env
    orch.tasks = iter([make_arithmetic_task(i, seed=2, split="train") for i in range(100)])
    orch.start()
    (first,) = await asyncio.wait_for(orch.get_batch(), timeout=120)
    # The gate is shut until version 1, yet the next two groups' sandboxes are up and reset.
    await _until(lambda: len(orch.prefetched()) == 2)
    assert orch.running_groups == 0
    assert env.reset_n == env.created == 2 + 2 * 2
    prefetched = [m for group in orch.prefetched() for m in group]
    assert len(prefetched) == 4 and all(m.prompt_ids and m.error is None for m in prefetched)
    assert not any(m.env.was_stepped for m in prefetched)  # reset, never run
    orch.runner.engine.update_weights(nnx.state(random_model, nnx.Param), version=1)
    orch.set_version(1)
    (second,) = await asyncio.wait_for(orch.get_batch(), timeout=120)
    # Prefetched groups run in task order and are stamped with the version that admitted them.
    assert second.task.task_id == make_arithmetic_task(1, seed=2, split="train").task_id
    assert second.admitted_version == 1 and second.min_version == 1
    await orch.stop()
    assert env.closed == env.created  # prefetched sandboxes never run are closed too
    await orch.runner.engine.close()


async def test_a_prefetched_sandbox_that_failed_to_start_is_retried_fresh(random_model):
    env = _counting_env(fail_first=1)
    orch = make_orch(
        random_model, groups_per_batch=1, group_size=3, prefetch_groups=1, max_staleness=0
    )
    orch.env_factory = env
    orch.tasks = iter([make_arithmetic_task(i, seed=3, split="train") for i in range(100)])
    orch.start()
    (group,) = await asyncio.wait_for(orch.get_batch(), timeout=120)
    await orch.stop()
    assert len(group.trajectories) == 3 and group.lost == 0
    assert [t.status for t in group.dropped] == ["env_error"]
    assert "sandbox crashed at start" in group.dropped[0].error
    assert orch.stats["infra_retries"] == 1
    assert env.closed == env.created
    await orch.runner.engine.close()


async def test_stop_closes_sandboxes_still_starting_in_the_prefetch(random_model):
    SlowEnv.closed = 0
    created = []

    def factory():
        created.append(SlowEnv())
        return created[-1]

    orch = make_orch(random_model, group_size=2, prefetch_groups=3, max_staleness=0)
    orch.env_factory = factory
    orch.tasks = iter(TASKS * 10)
    orch.start()
    await _until(lambda: len(created) >= 2 * 3)
    await orch.stop()
    assert orch.pending_work == 0
    assert SlowEnv.closed == len(created)
    await orch.runner.engine.close()


def test_prefetch_groups_must_not_be_negative():
    with pytest.raises(ValueError, match="rollout.prefetch_groups"):
        RolloutConfig(prefetch_groups=-1)


class DeadToolEnv(ArithmeticEnv):
    """The calculator's backing service is down for the first sandbox only."""

    created = 0

    def __init__(self):
        super().__init__()
        type(self).created += 1
        if type(self).created == 1:
            self.tools = {"calculator": _DeadCalculator()}


class _DeadCalculator(CalculatorTool):
    async def run(self, expression: str) -> str:  # type: ignore[override]
        raise ToolUnavailable("calculator service unreachable")


async def test_a_tool_whose_infrastructure_fails_ends_the_episode_as_tool_error(tool_user):
    model, _ = tool_user
    orch = make_orch(model, group_size=1, infra_retries=1)
    orch.env_factory = DeadToolEnv
    orch.agent_config = dataclasses.replace(AGENT, temperature=0.0)
    group = await orch.run_group(TASKS[0])
    (failed,) = group.dropped
    assert failed.status == "tool_error" and "unreachable" in failed.error
    assert failed.is_infra_failure
    # Retried with a fresh sandbox whose tool works: the memorised episode succeeds.
    (traj,) = group.trajectories
    assert traj.status == "ok" and traj.reward == 1.0
    await orch.runner.engine.close()


async def test_a_version_published_before_admitted_groups_start_does_not_strand_them(
    random_model,
):
    """Groups admitted under version 0 whose tasks first run after version 1 is published
    are still accounted to version 0 (once, they were released under 1 and the pacer
    kept waiting for a phantom straggler: get_batch hung)."""
    orch = make_orch(random_model, group_size=2, groups_per_batch=1, max_staleness=1)
    orch.tasks = iter([make_arithmetic_task(i, seed=4, split="train") for i in range(50)])
    orch.start()
    await asyncio.sleep(0)  # the producer admits; the groups' own tasks have not run yet
    assert orch.running_groups == 2
    orch.set_version(1)
    first = await asyncio.wait_for(orch.get_batch(), timeout=120)
    assert first[0].admitted_version == 0
    second = await asyncio.wait_for(orch.get_batch(), timeout=120)
    assert len(second) == 1
    await orch.stop()
    await orch.runner.engine.close()


# --- tool calls per turn and whose timeout it is ---------------------------------------------------


class ScriptedEngine(JaxEngine):
    """A real JaxEngine whose every turn is one scripted text (a policy that always makes
    the same tool calls); ``hang`` makes ``generate`` wait forever, as a stuck backend."""

    def __init__(self, model, script: str, *, hang: bool = False):
        super().__init__(model, EngineConfig(max_slots=4, max_seq_len=128, decode_steps=8))
        self.ids = TOK.encode(script) + [TOK.im_end_id]
        self.hang = hang

    async def generate(self, prompt_ids, sampling, *, session_id=None, request_id=None):
        if self.hang:
            await asyncio.Event().wait()
        n = len(self.ids)
        return TokenOutput(list(self.ids), [-1.0] * n, "stop", versions=[self.version] * n)


class SleepTool(Tool):
    name = "sleep"
    description = "Sleeps for the given seconds."
    parameters = {
        "type": "object",
        "properties": {"seconds": {"type": "number"}},
        "required": ["seconds"],
    }
    runs = 0

    async def run(self, seconds):
        type(self).runs += 1
        await asyncio.sleep(seconds)
        return "slept"


class SleepEnv(Environment):
    """Runs the agent's tool calls (each up to 60 s), never done."""

    tools = {"sleep": SleepTool()}

    async def reset(self, task):
        return "sleep"

    async def step(self, action):
        return await run_tool_calls(self.tools, action, timeout=60.0)


def _sleeps(n: int, seconds: float) -> str:
    call = f'<tool_call>{{"name": "sleep", "arguments": {{"seconds": {seconds}}}}}</tool_call>'
    return call * n


def _scripted_orch(model, script, *, hang=False, max_calls=8, timeout_s=300.0):
    agent = dataclasses.replace(AGENT, max_turns=2, max_tool_calls_per_turn=max_calls)
    config = RolloutConfig(
        group_size=2, filter_uniform_groups=False, infra_retries=0, episode_timeout_s=timeout_s
    )
    engine = ScriptedEngine(model, script, hang=hang)
    return RolloutOrchestrator.in_process(engine, SleepEnv, TEMPLATE, agent, config)


def test_agent_config_names_a_bad_tool_call_cap():
    with pytest.raises(ValueError, match="agent.max_tool_calls_per_turn must be >= 1"):
        AgentConfig(max_tool_calls_per_turn=0)


async def test_a_turn_runs_at_most_max_tool_calls_per_turn(random_model):
    SleepTool.runs = 0
    orch = _scripted_orch(random_model, _sleeps(15, 0), max_calls=3)
    group = await orch.run_group(TASKS[0])
    assert not group.dropped and [t.status for t in group.trajectories] == ["max_turns"] * 2
    for traj in group.trajectories:
        for step in traj.steps:
            assert len(step.tool_calls) == 3
            seen = TOK.decode(step.observation_ids)
            assert seen.count("slept") == 3
            assert "this turn made 15 tool calls; only the first 3 were run" in seen
    assert SleepTool.runs == 2 * 2 * 3  # 2 episodes of 2 turns of 3 calls
    await orch.runner.engine.close()


class DivideTool(Tool):
    name = "divide"
    description = "Divides 1 by d."
    parameters = {"type": "object", "properties": {"d": {"type": "number"}}, "required": ["d"]}

    async def run(self, d):
        return str(1 / d)  # ZeroDivisionError for 0: the tool failing, not the agent


class OwnCallsEnv(Environment):
    """A user environment on the lower-level API: it runs the agent's calls with
    ``call_tool`` and answers in its own words, reporting nothing in ``info``."""

    tools = {"sleep": SleepTool(), "divide": DivideTool()}

    async def reset(self, task):
        return "sleep"

    async def step(self, action):
        outputs = [(await call_tool(self.tools, call)).output for call in action.tool_calls]
        return StepResult(" ".join(outputs), reward=0.0, done=False)


async def test_tool_use_is_counted_from_the_agents_calls_when_the_env_reports_none(
    random_model,
):
    SleepTool.runs = 0
    recorder = MetricsRecorder(None)
    agent = dataclasses.replace(AGENT, max_turns=2)
    config = RolloutConfig(group_size=2, filter_uniform_groups=False, infra_retries=0)
    divide = '<tool_call>{"name": "divide", "arguments": {"d": 0}}</tool_call>'
    script = _sleeps(2, 0) + divide + _sleeps(1, 0).replace("sleep", "nap")
    engine = ScriptedEngine(random_model, script)
    orch = RolloutOrchestrator.in_process(
        engine, OwnCallsEnv, TEMPLATE, agent, config, metrics=recorder
    )
    group = await orch.run_group(TASKS[0])
    await orch.runner.engine.close()
    assert SleepTool.runs == 2 * 2 * 2  # 2 episodes of 2 turns of 2 calls, run by the env
    assert rollout_stats([group])["rollout/tool_use_fraction"] == 1.0
    out = recorder.write_step(1)
    assert out["count/tool/sleep/calls_total"] == SleepTool.runs  # the per-tool count
    assert out["count/tool_calls/unknown_tool_total"] == 2 * 2  # "nap": not one of its tools
    # What the env's call_tool calls found, though it reported nothing: the seconds, and
    # the tool that raised, counted by tool and exception.
    assert out["time/tool/sleep_count"] == SleepTool.runs
    assert out["count/tool/divide/error_total"] == out["count/tool/divide/raised_total"] == 2 * 2
    assert out["count/tool/divide/exception/ZeroDivisionError_total"] == 2 * 2
    assert "count/tool/sleep/error_total" not in out


async def test_tool_calls_past_the_episode_deadline_are_the_agents_failure(random_model):
    orch = _scripted_orch(random_model, _sleeps(2, 30), timeout_s=1.0)
    group = await orch.run_group(TASKS[0])
    assert not group.dropped and orch.stats["infra_failures"] == 0
    assert group.rewards.tolist() == [0.0, 0.0]  # scored: failures of the policy
    for traj in group.trajectories:
        assert traj.status == "agent_timeout" and not traj.is_infra_failure
        assert "exceeded 1.0s in run" in traj.error and "actions_s" in traj.timings
    await orch.runner.engine.close()


async def test_an_engine_hung_past_the_episode_deadline_stays_infra(random_model):
    orch = _scripted_orch(random_model, _sleeps(1, 0), hang=True, timeout_s=0.3)
    group = await orch.run_group(TASKS[0])
    assert not group.trajectories and [t.status for t in group.dropped] == ["timeout"] * 2
    assert all(t.is_infra_failure and "in run" in t.error for t in group.dropped)
    assert orch.stats["infra_failures"] == 2
    await orch.runner.engine.close()


class SlowRewardEnv(ArithmeticEnv):
    """A verifier that would take 30 s: past its 0.2 s deadline the EVAL stage gives up."""

    reward_timeout_s = 0.2

    async def evaluate(self):
        await asyncio.sleep(30)
        return 1.0


async def test_a_reward_past_its_deadline_is_a_clear_env_error_not_a_stall(random_model):
    orch = make_orch(random_model, group_size=2, infra_retries=0)
    orch.env_factory = SlowRewardEnv
    async with asyncio.timeout(20):  # bounds a hang; the deadline ends it far sooner
        group = await orch.run_group(TASKS[0])
    assert [t.status for t in group.dropped] == ["env_error", "env_error"]
    assert all("reward took over 0.2s" in t.error for t in group.dropped), group.dropped
    await orch.runner.engine.close()


class MetricsEnv(OwnCallsEnv):
    """Reports its own figure each turn: ``info["metrics"]`` (here, the calls it ran)."""

    bad: object = None

    async def step(self, action):
        result = await super().step(action)
        metrics = self.bad if self.bad is not None else {"calls_run": len(action.tool_calls)}
        return dataclasses.replace(result, info={"metrics": metrics})


async def test_an_environments_own_metrics_are_summed_per_episode_and_averaged(random_model):
    agent = dataclasses.replace(AGENT, max_turns=2)
    config = RolloutConfig(group_size=2, filter_uniform_groups=False, infra_retries=0)
    engine = ScriptedEngine(random_model, _sleeps(2, 0) + _sleeps(1, 0))
    orch = RolloutOrchestrator.in_process(engine, MetricsEnv, TEMPLATE, agent, config)
    group = await orch.run_group(TASKS[0])
    await orch.runner.engine.close()
    # Each turn's scripted reply holds 3 calls (the script is one turn's text): 2 turns.
    assert [t.info["metrics"] for t in group.trajectories] == [{"calls_run": 6.0}] * 2
    assert rollout_stats([group])["rollout/env/calls_run"] == 6.0


@pytest.mark.parametrize(
    "bad, named",
    [({"calls run": 1}, "'calls run'"), ({"x": float("nan")}, "'x'"), ([1], "list")],
    ids=["name", "nan", "not-a-mapping"],
)
async def test_a_bad_metric_from_the_environment_is_named(random_model, bad, named):
    class BadEnv(MetricsEnv):
        pass

    BadEnv.bad = bad
    config = RolloutConfig(group_size=1, filter_uniform_groups=False, infra_retries=0)
    engine = ScriptedEngine(random_model, _sleeps(1, 0))
    orch = RolloutOrchestrator.in_process(engine, BadEnv, TEMPLATE, AGENT, config)
    group = await orch.run_group(TASKS[0])
    await orch.runner.engine.close()
    assert not group.trajectories  # an environment's fault is never scored
    (traj,) = group.dropped
    assert traj.status == "env_error"
    assert "BadEnv.step" in traj.error and named in traj.error


# ---- one seam for both runners ---------------------------------------------------------


def test_both_runners_run_groups_with_the_protocols_signature():
    """The in-process and the rollout-node runner implement one GroupRunner: the same
    ``run_group`` parameters, and every method the orchestrator calls of every runner;
    what only one of them can do is an optional protocol the other does not claim."""
    from inspect import signature

    from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner
    from tunix_agentic.rollout.episode import EpisodeRunner
    from tunix_agentic.rollout.group_runner import (
        CheckpointingRunner,
        GroupRunner,
        PrefetchingRunner,
    )

    want = signature(GroupRunner.run_group)
    calls = [n for n, v in vars(GroupRunner).items() if callable(v) and not n.startswith("_")]
    assert set(calls) == {"bind", "run_group", "set_version", "close"}
    for runner in (EpisodeRunner, ServiceEpisodeRunner):
        assert signature(runner.run_group) == want, runner.__name__
        assert not [n for n in calls if not callable(getattr(runner, n, None))], runner.__name__
    config = RolloutConfig()
    here = EpisodeRunner(None, ArithmeticEnv, TEMPLATE, AGENT, config)
    nodes = ServiceEpisodeRunner(["http://127.0.0.1:9"], agent_config=AGENT, config=config)
    assert isinstance(here, PrefetchingRunner) and not isinstance(here, CheckpointingRunner)
    assert isinstance(nodes, CheckpointingRunner) and not isinstance(nodes, PrefetchingRunner)


def test_prefetching_needs_a_runner_that_makes_the_environments_here():
    """``rollout.prefetch_groups`` INITs groups ahead, here: an orchestrator over a runner
    that is no PrefetchingRunner refuses it when built, not at its first group."""
    from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner

    config = RolloutConfig(group_size=2, prefetch_groups=2)
    runner = ServiceEpisodeRunner(["http://127.0.0.1:9"], agent_config=AGENT, config=config)
    with pytest.raises(ValueError, match="rollout.prefetch_groups must be 0"):
        RolloutOrchestrator(runner, config)


async def test_a_runner_given_to_the_orchestrator_shares_its_bookkeeping():
    """``RolloutOrchestrator(runner, config)``: the runner takes the orchestrator's stats,
    hears each published version, and its state rides in the orchestrator's checkpoint and
    back; a runner whose environments are made on the nodes says so (None) and refuses one."""
    import json

    from tunix_agentic.data.tasks import task_iterator
    from tunix_agentic.envs.calculator import ArithmeticTasks
    from tunix_agentic.rollout.client.runner import ServiceEpisodeRunner

    config = RolloutConfig(group_size=2, groups_per_batch=1)
    nowhere = ["http://127.0.0.1:9"]  # never asked: nothing here talks to a node

    def orchestrator(runner):
        tasks = task_iterator(ArithmeticTasks(), seed=0)
        return RolloutOrchestrator(runner, config, tasks=tasks)

    runner = ServiceEpisodeRunner(nowhere, agent_config=AGENT, config=config, run_id="run-a")
    orch = orchestrator(runner)
    assert orch.runner is runner and runner.stats is orch.stats
    assert orch.env_factory is None
    with pytest.raises(ValueError, match="nodes make the environments"):
        orch.env_factory = ArithmeticEnv
    orch.set_version(3)
    assert runner.version == orch.version == 3
    drawn = [orch.stream.next() for _ in range(2)]  # two groups drawn, none trained on
    state = json.loads(json.dumps(orch.checkpoint_state()))
    assert [index for index, _ in state["pending"]] == [index for index, _ in drawn]
    assert state["service"] == {"run_id": "run-a", "id_key": runner.id_key, "finished": []}

    again = ServiceEpisodeRunner(nowhere, agent_config=AGENT, config=config)
    restored = orchestrator(again)
    restored.restore_state(state)
    assert again.run_id == "run-a" and again.id_key == runner.id_key  # the same group ids
    assert [restored.stream.next()[1].task_id for _ in drawn] == [t.task_id for _, t in drawn]
    await runner.close()
    await again.close()
