"""The RL loop shared by the trainer and bench_rollout: steps, reports, weight sync."""

from __future__ import annotations

from flax import nnx

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.inference import EngineConfig, EngineError, JaxEngine, WeightUpdate
from tunix_agentic.metrics import MetricsRecorder
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rl_loop import StepReport, run_rl_steps
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.testing import tiny_model


class FixedLearner:
    """Trains nothing; publishes the same parameters (and counts its steps)."""

    def __init__(self, params):
        self.params, self.steps = params, 0

    def train_on(self, groups):
        self.steps += 1
        return {"loss": 0.0, "groups": float(len(groups))}

    def params_for_engine(self):
        return self.params


class NoWeightsEngine(JaxEngine):
    """Generates, but every weight update fails (a backend that cannot load them)."""

    def update_weights(self, params, version):
        return WeightUpdate.failed(version, EngineError("injected: load failed"))


def _orch(engine):
    config = RolloutConfig(group_size=2, groups_per_batch=2, filter_uniform_groups=False)
    tasks = iter([make_arithmetic_task(i, seed=5, split="train") for i in range(100)])
    agent = AgentConfig(max_turns=2, max_new_tokens=24)
    return RolloutOrchestrator.in_process(
        engine, ArithmeticEnv, ChatTemplate(CharTokenizer(128)), agent, config, tasks=tasks
    )


async def test_steps_report_batches_and_publish_versions(tmp_path, make_engine):
    model = tiny_model(seed=6)
    engine = make_engine(model, EngineConfig(max_slots=8, max_seq_len=128))
    orch = _orch(engine)
    learner = FixedLearner(nnx.state(model, nnx.Param))
    reports: list[StepReport] = []
    await run_rl_steps(orch, engine, learner, start_step=0, steps=3, on_step=reports.append)
    assert [r.step for r in reports] == [1, 2, 3] and learner.steps == 3
    assert all(len(r.groups) == 2 and r.out["groups"] == 2.0 for r in reports)
    assert all(r.wall_s >= r.wait_s + r.train_s for r in reports)
    assert engine.version == 3 and orch.version == 3  # awaited: applied before the next step
    assert orch.pending_work == 0  # production stopped when the loop ended


async def test_a_failed_weight_sync_is_counted_and_the_loop_goes_on(tmp_path):
    model = tiny_model(seed=6)
    engine = NoWeightsEngine(model, EngineConfig(max_slots=8, max_seq_len=128))
    metrics = MetricsRecorder(tmp_path)
    orch = _orch(engine)
    reports: list[StepReport] = []
    await run_rl_steps(
        orch,
        engine,
        FixedLearner(nnx.state(model, nnx.Param)),
        start_step=0,
        steps=2,
        on_step=reports.append,
        metrics=metrics,
    )
    assert [r.step for r in reports] == [1, 2] and orch.version == 2
    try:
        assert metrics.write_step(2)["count/weight_sync/failures_total"] == 2.0
    finally:
        metrics.close()
        await engine.close()
