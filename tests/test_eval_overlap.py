"""Evaluation beside training (``rl.eval_every``) and ``tunix-agentic eval`` on a finished run."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.checkpoint import Checkpointer
from tunix_agentic.cli.main import main
from tunix_agentic.config import ConfigError, load_config
from tunix_agentic.envs.calculator import ArithmeticEnv, make_arithmetic_task
from tunix_agentic.evaluation import score
from tunix_agentic.inference import EngineConfig
from tunix_agentic.metrics import read_scalars
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rl_loop import PeriodicEval, StepReport, run_rl_steps
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.testing import TINY_RUN_OVERRIDES, tiny_model
from tunix_agentic.trainer import train

CONFIG = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
EVAL_TASKS = [make_arithmetic_task(i, seed=5, split="heldout") for i in range(3)]
GREEDY = AgentConfig(max_turns=2, max_new_tokens=16, temperature=0.0)


class FixedLearner:
    """Trains nothing; publishes the same parameters."""

    def __init__(self, params):
        self.params = params

    def train_on(self, groups):
        return {"loss": 0.0}

    def params_for_engine(self):
        return self.params


class TrackedEnv(ArithmeticEnv):
    """Counts environments opened and closed; ``hang`` makes reset wait forever."""

    opened = closed = 0

    def __init__(self, hang: bool = False):
        super().__init__()
        self.hang = hang
        TrackedEnv.opened += 1

    async def reset(self, task):
        if self.hang:
            await asyncio.Event().wait()
        return await super().reset(task)

    async def close(self):
        TrackedEnv.closed += 1
        await super().close()


def _orch(engine, *, hang_eval: bool = False):
    config = RolloutConfig(
        group_size=2, groups_per_batch=2, filter_uniform_groups=False, max_staleness=1
    )
    tasks = iter([make_arithmetic_task(i, seed=5, split="train") for i in range(100)])
    agent = AgentConfig(max_turns=2, max_new_tokens=16)

    def env_factory(task):
        return TrackedEnv(hang=hang_eval and task in EVAL_TASKS)

    return RolloutOrchestrator.in_process(
        engine, env_factory, ChatTemplate(CharTokenizer(128)), agent, config, tasks=tasks
    )


async def test_an_evaluation_measures_its_version_and_a_stop_cancels_it(make_engine):
    model = tiny_model(seed=6)
    engine = make_engine(model, EngineConfig(max_slots=8, max_seq_len=128))
    learner = FixedLearner(nnx.state(model, nnx.Param))
    orch = _orch(engine)
    step2_published = asyncio.Event()
    measured: dict[int, list[int]] = {}
    skipped: list[int] = []

    async def run(version):
        if version == 1:  # generate only once the learner has published version 2
            await asyncio.wait_for(step2_published.wait(), 120)
        with orch.admission_paused():
            return score(await orch.run_tasks(EVAL_TASKS, agent_config=GREEDY))

    def on_step(report: StepReport) -> None:
        if report.step == 2:
            step2_published.set()  # the learner went on while version 1 was measured

    periodic = PeriodicEval(
        1, run, lambda v, ev: measured.__setitem__(v, ev.versions), skipped.append
    )
    await run_rl_steps(
        orch, engine, learner, start_step=0, steps=3, on_step=on_step, periodic=periodic
    )
    # Version 2 was handed over mid-evaluation: the tokens say it reached the engine after.
    assert measured[1] == [1]
    assert sorted([*measured, *skipped]) == [1, 2]  # each due version: measured or skipped
    assert all(versions == [v] for v, versions in measured.items())
    assert engine.version == 3 and orch.version == 3  # the held weights went out after

    # Resumed at step 3 (due: evaluated at once), stopped at step 4 mid-evaluation.
    orch = _orch(engine, hang_eval=True)
    orch.set_version(3)
    started, done = [], []
    TrackedEnv.opened = TrackedEnv.closed = 0

    async def hanging(version):
        started.append(version)
        return await orch.run_tasks(EVAL_TASKS, agent_config=GREEDY)  # resets hang

    def stop_at_4(report: StepReport) -> None:
        if report.step == 4:
            raise RuntimeError("stop requested")

    with pytest.raises(RuntimeError, match="stop requested"):
        await asyncio.wait_for(
            run_rl_steps(
                orch,
                engine,
                learner,
                start_step=3,
                steps=6,
                on_step=stop_at_4,
                periodic=PeriodicEval(1, hanging, lambda v, r: done.append(v)),
            ),
            120,
        )
    assert started == [3] and done == []  # under way, cancelled, logged nothing
    assert TrackedEnv.opened == TrackedEnv.closed > len(EVAL_TASKS)
    assert orch.pending_work == 0
    async with asyncio.timeout(60):  # cancelled requests are aborted at the next chunk
        while engine.in_flight:
            await asyncio.sleep(0.05)


@pytest.mark.parametrize(
    "override, key",
    [
        ("rl.eval_every=-2", "rl.eval_every"),
        ("rl.eval_every=often", "rl.eval_every"),
        ("rl.eval_priority=urgent", "rl.eval_priority"),
    ],
    ids=["negative", "not-an-int", "unknown-priority"],
)
def test_a_bad_eval_setting_names_its_key(override, key):
    with pytest.raises(ConfigError, match=key):
        load_config(CONFIG, [override])


@pytest.mark.slow  # a whole tiny run (~25 s of CPU), then the eval command on it
def test_a_run_evaluates_beside_training_and_eval_reads_its_checkpoint(tmp_path, capsys):
    run_dir = tmp_path / "run"
    overrides = [*TINY_RUN_OVERRIDES, "sft.steps=10", "rl.steps=2", "rl.eval_tasks=2"]
    train(CONFIG, [*overrides, "rl.eval_every=1", f"run_dir={run_dir}"], progress=False)
    assert (run_dir / "summary.json").is_file()
    scalars = read_scalars(run_dir / "tensorboard")
    evaluated = [s for s, _ in scalars["eval/success_fraction"]]
    # Before RL, at version 1 beside training (nothing else was under way when it reached
    # the engine), and after RL (the last step: the trainer's own final evaluation).
    assert evaluated == [0, 1, 2] and "eval/skipped" not in scalars
    assert [s for s, _ in scalars["eval/wall_s"]] == [0, 1, 2]  # every one, timed
    for tag in ("eval/version_min", "eval/version_max"):  # each measured its own step's policy
        assert [(s, int(v)) for s, v in scalars[tag]] == [(0, 0), (1, 1), (2, 2)]

    assert main(["eval", str(run_dir), "--tasks", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["step"] == 2 and out["version"] == 2 and out["episodes"] == 2
    fields = {"success", "reward", "turns", "generated_tokens", "tool_use", "episodes"}
    assert fields <= set(out) and set(out["by_task"]) == {"arithmetic"}
    assert fields <= set(out["by_task"]["arithmetic"])
    assert out["turns"] >= 1 and out["generated_tokens"] >= 1

    assert main(["eval", str(run_dir), "--tasks", "3", "--show", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("3 held-out episodes of checkpoint 2")
    assert out.count("=== held-out step 2 | episode") == 3 and "model wrote" in out
    assert json.loads(out[out.index("\n{") :])["episodes"] == 3  # then the JSON figures

    assert main(["eval", str(run_dir), "--step", "7"]) == 2
    assert "--step 7: " in (err := capsys.readouterr().err) and "(it has: 0, 2)" in err


@pytest.mark.parametrize(
    "files, args, message",
    [
        ((), [], "no config.yaml there"),
        (("config.yaml",), [], "no checkpoint under"),
        (("config.yaml",), ["--tasks", "0"], "--tasks must be >= 1"),
        (("config.yaml", "checkpoints/0", "checkpoints/3"), ["--step", "2"], "(it has: 0, 3)"),
    ],
    ids=["not-a-run", "no-checkpoint", "no-tasks", "unknown-step"],
)
def test_eval_command_refuses_bad_input(tmp_path, capsys, files, args, message):
    for name in files:
        if name == "config.yaml":
            (tmp_path / name).write_text("seed: 0\n")
        else:  # a checkpoint of the smallest tree, as the trainer writes one
            step = int(name.split("/")[1])
            ckpt = Checkpointer(tmp_path / "checkpoints")
            ckpt.save(step, {"w": np.zeros(2, np.float32)}, {"m": np.zeros(1)}, {"version": step})
            ckpt.close()
    assert main(["eval", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
