"""Context rules: the sliding window shows the prompt and the last k steps, and the learner
trains each step on exactly the context the model saw."""

from __future__ import annotations

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.context import append_only, get_context_rule, sliding_window
from tunix_agentic.agent.loop import AgentConfig, run_agent
from tunix_agentic.envs.base import Environment, StepResult
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.learners.batching import grpo_batch, sft_batch
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout.episode import Group
from tunix_agentic.testing import tiny_model
from tunix_agentic.trajectory import Step, Trajectory

TEMPLATE = ChatTemplate(CharTokenizer(128))


def history(turns: int) -> Trajectory:
    """A trajectory with prompt [1, 2] and steps whose action/observation ids are literal."""
    traj = Trajectory(task_id="t", episode_id="e")
    traj.append_prompt([1, 2])
    for k in range(turns):
        step = Step(len(traj.token_ids), [10 + k, 10 + k], [-0.5, -0.5], [0, 0], "stop")
        traj.append_action(step)
        traj.append_observation([20 + k])
    return traj


def test_sliding_window_keeps_the_prompt_and_the_last_steps():
    traj = history(3)
    assert traj.token_ids == [1, 2, 10, 10, 20, 11, 11, 21, 12, 12, 22]
    assert sliding_window(traj, 1) == [1, 2, 12, 12, 22]
    assert sliding_window(traj, 2) == [1, 2, 11, 11, 21, 12, 12, 22]
    assert sliding_window(traj, 3) == traj.token_ids == append_only(traj, 1)
    assert get_context_rule("sliding_window") is sliding_window
    with pytest.raises(ValueError, match="context_window >= 1"):
        sliding_window(traj, 0)
    with pytest.raises(ValueError, match="context_window"):
        AgentConfig(context_rule="sliding_window", context_window=0)


def test_learner_rows_are_one_per_step_when_a_step_saw_a_window():
    traj = history(2)
    assert len(traj.learner_rows()) == 1  # whole history: one row, as before
    context = sliding_window(traj, 1)  # [1, 2, 11, 11, 21]
    traj.append_action(Step(len(context), [13], [-0.25], [1], "stop", context_ids=list(context)))
    rows = traj.learner_rows()
    assert [r["input_ids"].tolist() for r in rows] == [
        [1, 2, 10, 10],
        [1, 2, 10, 10, 20, 11, 11],
        [1, 2, 11, 11, 21, 13],
    ]
    assert [r["loss_mask"].tolist() for r in rows] == [
        [0, 0, 1, 1],
        [0, 0, 0, 0, 0, 1, 1],
        [0, 0, 0, 0, 0, 1],
    ]
    assert rows[2]["old_logprobs"].tolist() == [0, 0, 0, 0, 0, -0.25]
    assert rows[2]["versions"].tolist() == [-1, -1, -1, -1, -1, 1]
    # The whole-history arrays still mark each action where it sits in the history.
    arrays = traj.learner_arrays()
    assert arrays["loss_mask"].tolist() == [0, 0, 1, 1, 0, 1, 1, 0, 1]
    with pytest.raises(ValueError, match="context_len"):
        traj.append_action(Step(3, [1], [0.0], [0], "stop", context_ids=[1, 2]))


def test_grpo_batch_gives_every_step_row_its_trajectory_advantage():
    a, b = history(2), history(1)
    context = sliding_window(a, 1)
    a.append_action(Step(len(context), [13], [-0.1], [0], "stop", context_ids=list(context)))
    a.reward, b.reward = 1.0, 0.0
    group = Group("g", 0, None, 0, [a, b], [], 0)
    batch = grpo_batch([group], lambda r: np.asarray(r) - np.mean(r), pad_id=0, num_rows=2)
    # a: 3 step rows, b: 1 row -> 4 rows, a multiple of num_rows (few compiled shapes)
    assert batch.input_ids.shape[0] == 4
    assert batch.advantages.tolist() == [0.5, 0.5, 0.5, -0.5]
    # Turn-level: step rewards (process rewards) shape each step's advantage.
    a.steps[1].reward = 1.0  # a's returns-to-go: [1, 1, 0]; b's: [0]
    turn = grpo_batch(
        [group], lambda r: np.asarray(r) - np.mean(r), pad_id=0, num_rows=2, turn_level=True
    )
    g = np.array([1.0, 1.0, 0.0, 0.0])
    shaped = (g - g.mean()) / (g.std() + 1e-6)
    np.testing.assert_allclose(turn.advantages, [0.5, 0.5, 0.5, -0.5] + shaped, rtol=1e-5)


class Echo(Environment):
    """Never done: each step replies with a short fixed observation."""

    async def reset(self, task):
        return "Say something."

    async def step(self, action):
        return StepResult("ok", 0.0, False)


class OneTokenTurns(ChatTemplate):
    """The built-in template, but every token ends a turn: a random policy's turns are one
    token each, so an episode always reaches its later turns."""

    @property
    def stop_ids(self) -> tuple[int, ...]:
        return tuple(range(self.tokenizer.vocab_size))


async def test_the_agent_generates_from_the_window_and_records_it():
    template = OneTokenTurns(CharTokenizer(128))
    engine = JaxEngine(tiny_model(seed=2), EngineConfig(max_slots=4, max_seq_len=256))
    try:
        config = AgentConfig(
            max_turns=4, max_new_tokens=4, context_rule="sliding_window", context_window=1
        )
        traj = Trajectory(task_id="t", episode_id="e")
        traj.append_prompt(template.prompt_ids("Say something."))
        await run_agent(engine, Echo(), traj, template, config, seed=0)
    finally:
        await engine.close()
    assert traj.status == "max_turns" and len(traj.steps) == 4
    assert traj.steps[0].context_ids is None and traj.steps[1].context_ids is None
    starts = traj.action_starts()
    for k in (2, 3):  # the prompt and the one step before
        expected = traj.token_ids[: traj.prompt_len] + traj.token_ids[starts[k - 1] : starts[k]]
        assert traj.steps[k].context_ids == expected
        assert traj.steps[k].context_len == len(expected) < starts[k]
    rows = traj.learner_rows()
    assert len(rows) == 4
    assert rows[3]["input_ids"].tolist() == traj.steps[3].context_ids + traj.steps[3].action_ids


class CountsTurns(Echo):
    """Rewards an episode by what it sees of the whole trajectory: 1 / (number of turns)."""

    async def evaluate_trajectory(self, trajectory):
        assert all(s.action_ids for s in trajectory.steps)
        return 1.0 / len(trajectory.steps)


async def test_the_eval_stage_gives_the_reward_the_whole_trajectory():
    from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator

    template = OneTokenTurns(CharTokenizer(128))
    engine = JaxEngine(tiny_model(seed=2), EngineConfig(max_slots=4, max_seq_len=256))
    try:
        orch = RolloutOrchestrator.in_process(
            engine,
            CountsTurns,
            template,
            AgentConfig(max_turns=4, max_new_tokens=4),
            RolloutConfig(group_size=2, groups_per_batch=1, filter_uniform_groups=False),
        )
        (group,) = await orch.run_tasks(["task"], group_size=2)
    finally:
        await engine.close()
    assert [t.reward for t in group.trajectories] == [0.25, 0.25]


def test_windowed_demonstrations_train_each_step_on_its_window():
    from tunix_agentic.data.demos import DemoSource, demonstration_batches, demonstration_trajectory
    from tunix_agentic.envs.frozenlake import FrozenLakeEnv, FrozenLakeTasks

    source = FrozenLakeTasks()
    task = next(t for i in range(50) if (t := source.task(i, seed=0, split="train")).answer >= 3)
    messages = source.demonstration(task, rng=np.random.default_rng(0), use_tools=False)
    whole = demonstration_trajectory(task.prompt, messages, TEMPLATE)
    window = demonstration_trajectory(
        task.prompt, messages, TEMPLATE, context_rule="sliding_window", context_window=1
    )
    assert whole.token_ids == window.token_ids and len(whole.learner_rows()) == 1
    rows = window.learner_rows()
    assert len(rows) == len(window.steps) == task.answer
    starts = window.action_starts()
    prompt = window.token_ids[: window.prompt_len]
    for k in range(2, len(rows)):
        context = prompt + window.token_ids[starts[k - 1] : starts[k]]
        assert rows[k]["input_ids"].tolist() == context + window.steps[k].action_ids
        assert rows[k]["loss_mask"].sum() == len(window.steps[k].action_ids)
    demos = {"lake": DemoSource(source, FrozenLakeEnv().tool_schemas())}
    batches = demonstration_batches(
        demos,
        TEMPLATE,
        seed=0,
        batch_size=5,
        tool_fraction=0.0,
        context_rule="sliding_window",
        context_window=1,
    )
    for _ in range(3):  # rows carry over: every batch holds exactly batch_size real rows
        batch = sft_batch(next(batches), pad_id=TEMPLATE.tokenizer.pad_id)
        assert batch.input_ids.shape[0] == 5 and (batch.loss_mask.sum(1) > 0).all()
