"""Rollout queue depth per stage: ``gauge/queue/<stage>_waiting`` and ``..._running``."""

import asyncio

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.metrics.recorder import MetricsRecorder
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.rollout.episode import StageSlots
from tunix_agentic.testing import tiny_model

TEMPLATE = ChatTemplate(CharTokenizer(128))
AGENT = AgentConfig(max_turns=1, max_new_tokens=8, temperature=1.0)
STAGES = ("init", "run", "eval")


async def test_slots_count_waiters_only_while_every_slot_is_taken():
    metrics = MetricsRecorder(None)
    slots = StageSlots(2, "run", metrics)
    release = asyncio.Event()

    async def hold():
        async with slots:
            await release.wait()

    first = metrics.write_step(0)  # reported from the start
    assert (
        first["gauge/queue/run_waiting_episodes"] == first["gauge/queue/run_running_episodes"] == 0
    )
    holders = [asyncio.create_task(hold()) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert (slots.in_flight, slots.waiting) == (2, 3)
    release.set()
    await asyncio.gather(*holders)
    out = metrics.write_step(1)
    assert (
        out["gauge/queue/run_waiting_episodes_max"] == 3
        and out["gauge/queue/run_waiting_episodes"] == 0
    )
    assert (
        out["gauge/queue/run_running_episodes_max"] == 2
        and out["gauge/queue/run_running_episodes"] == 0
    )
    # Episodes that find a free slot never count as waiting.
    for _ in range(2):
        async with slots:
            pass
    again = metrics.write_step(2)
    assert (
        again["gauge/queue/run_waiting_episodes_max"] == 0
        and again["gauge/queue/run_running_episodes_max"] == 1
    )


async def test_a_cancelled_waiter_leaves_the_queue():
    metrics = MetricsRecorder(None)
    slots = StageSlots(1, "init", metrics)
    async with slots:
        waiter = asyncio.create_task(slots.__aenter__())
        await asyncio.sleep(0)
        assert slots.waiting == 1
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    assert (slots.waiting, slots.in_flight) == (0, 0)
    assert metrics.write_step(1)["gauge/queue/init_waiting_episodes"] == 0


class SlowStartEnv(ArithmeticEnv):
    """An arithmetic environment whose reset takes a while, like a sandbox starting."""

    async def reset(self, task):
        await asyncio.sleep(0.05)
        return await super().reset(task)


async def _episode_gauges(engine: JaxEngine, workers: int) -> dict[str, float]:
    """One group of 4 episodes through stage pools of ``workers`` slots each; the gauges."""
    metrics = MetricsRecorder(None)
    config = RolloutConfig(
        group_size=4,
        groups_per_batch=1,
        filter_uniform_groups=False,
        init_workers=workers,
        run_workers=workers,
        eval_workers=workers,
    )
    orch = RolloutOrchestrator.in_process(
        engine, SlowStartEnv, TEMPLATE, AGENT, config, metrics=metrics
    )
    (group,) = await orch.run_tasks([make_arithmetic_task(0, seed=0, split="train")], group_size=4)
    assert len(group.trajectories) == 4
    return {k: v for k, v in metrics.write_step(1).items() if k.startswith("gauge/queue/")}


async def test_a_stage_pool_smaller_than_the_episodes_shows_them_waiting(make_engine):
    engine = make_engine(
        tiny_model(seed=3), EngineConfig(max_slots=4, max_seq_len=128, decode_steps=4)
    )
    narrow = await _episode_gauges(engine, workers=1)
    # Four episodes start together and INIT takes a while: three wait for its one slot.
    assert narrow["gauge/queue/init_waiting_episodes_max"] == 3
    for stage in STAGES:
        assert narrow[f"gauge/queue/{stage}_running_episodes_max"] == 1, (
            stage
        )  # bounded by the pool
        assert narrow[f"gauge/queue/{stage}_waiting_episodes"] == 0, stage  # all done: nobody waits
        assert narrow[f"gauge/queue/{stage}_running_episodes"] == 0, stage

    wide = await _episode_gauges(engine, workers=4)
    for stage in STAGES:
        assert wide[f"gauge/queue/{stage}_waiting_episodes_max"] == 0, stage  # a slot for everyone
    assert wide["gauge/queue/init_running_episodes_max"] == 4
