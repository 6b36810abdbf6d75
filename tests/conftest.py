"""Fixtures shared by the test modules."""

from __future__ import annotations

import os

import pytest

# Ray clusters the tests start on this machine stay on loopback: without it Ray gives every
# node, driver and actor the machine's outward address (docs/ray.md, "One machine"). Set
# before any test imports Ray; processes the tests start inherit it.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from tunix_agentic.inference.engine import JaxEngine


@pytest.fixture
async def make_engine():
    """``make_engine(model, config, ...)``: a :class:`JaxEngine` closed when the test ends,
    passed or failed (an engine left open keeps its scheduler thread running)."""
    engines: list[JaxEngine] = []

    def make(*args, **kwargs) -> JaxEngine:
        engine = JaxEngine(*args, **kwargs)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        if not engine.closed:
            await engine.close()


@pytest.fixture(scope="session")
def observed_run(tmp_path_factory):
    """One short real run from the CLI, shared by the observability tests (percentiles,
    the TensorBoard layout, the trace, ``--profile-steps``, the report): its run dir.

    Two RL steps (the first compiles), rollouts wait for the new weights
    (``max_staleness=0``) and the learner trains one length bucket, so the report's
    figures are those of a rollout-bound step; RL step 1 is profiled; version 1 is
    evaluated beside training (``rl.eval_every=1``); every scalar is mirrored to an
    offline W&B run."""
    from pathlib import Path

    from tunix_agentic.cli.main import main
    from tunix_agentic.testing import TINY_RUN_OVERRIDES

    config = str(Path(__file__).parents[1] / "configs" / "calculator_tiny.yaml")
    run_dir = tmp_path_factory.mktemp("observed") / "run"
    overrides = [
        *TINY_RUN_OVERRIDES,
        "engine.max_seq_len=128",
        "sft.steps=4",
        "rl.steps=2",
        "rl.eval_tasks=2",
        "rl.eval_every=1",  # version 1 evaluated beside training, between the two steps
        "rl.checkpoint_every=0",
        "rollout.max_staleness=0",
        "learner.length_bucket=128",
        "agent.max_turns=2",
        "metrics.wandb.project=observed",  # mirrored offline into the run dir
    ]
    args = ["train", "--quiet", "--config", config, "--profile-steps", "1:1"]
    assert main([*args, *overrides, f"run_dir={run_dir}"]) == 0
    return run_dir
