"""bfloat16 compute with a float32 master copy of the weights (optimizer.master_dtype)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.cli.main import main
from tunix_agentic.config import load_config
from tunix_agentic.export import load_run_policy
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.state import OptimizerConfig
from tunix_agentic.models.hf import load_hf_model
from tunix_agentic.models.transformer import sequence_logprobs
from tunix_agentic.testing import TINY_RUN_OVERRIDES, on_policy_batch, tiny_model

REPO = Path(__file__).resolve().parents[1]


def _learner(model, master: str, lr: float = 1e-5) -> GRPOLearner:
    opt = OptimizerConfig(learning_rate=lr, master_dtype=master)
    return GRPOLearner(model, GRPOConfig(optimizer=opt))


def _moved(before, after) -> float:
    """Fraction of matrix entries that changed."""
    pairs = zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
    changed = total = 0
    for a, b in pairs:
        if np.ndim(a) == 2:
            changed += int(np.sum(np.asarray(a, np.float32) != np.asarray(b, np.float32)))
            total += np.size(a)
    return changed / total


def test_small_steps_round_away_in_bfloat16_and_count_with_a_float32_master():
    model = tiny_model(seed=7, dtype="bfloat16")
    batch = on_policy_batch(model)
    # One model each: a learner takes ownership of its model's buffers (its step donates).
    plain = _learner(model, "")
    master = _learner(tiny_model(seed=7, dtype="bfloat16"), "float32")
    start = plain.params_for_engine()
    for learner in (plain, master):
        learner.train_step(batch)
    assert master.state.params["embed"]["embedding"].dtype == jnp.float32
    out = master.params_for_engine()
    assert out["embed"]["embedding"].dtype == jnp.bfloat16  # the engine keeps its dtype
    # Adam's first step moves every weight by about the learning rate: 1e-5 is below half
    # a bf16 ulp of weights ~0.02-0.2, so in bf16 nearly nothing changes...
    assert _moved(start, plain.params_for_engine()) < 0.05
    # ...while the float32 master moved them all (what reaches bf16 accumulates over steps).
    assert _moved(jax.tree.map(lambda x: x.astype(jnp.float32), start), master.state.params) > 0.9


def test_a_bf16_run_with_a_float32_master_checkpoints_and_exports(tmp_path):
    run = tmp_path / "run"
    overrides = [
        *TINY_RUN_OVERRIDES,
        "engine.max_seq_len=128",
        "rl.steps=1",
        "model.dtype=bfloat16",
        "learner.optimizer.master_dtype=float32",
        "sft.optimizer.master_dtype=float32",
        f"run_dir={run}",
    ]
    config = str(REPO / "configs" / "calculator_tiny.yaml")
    assert main(["train", "--config", config, "--quiet", *overrides]) == 0
    policy, version = load_run_policy(run, load_config(run / "config.yaml"))
    assert version == 1 and policy.embed.embedding.dtype == jnp.bfloat16
    assert main(["export", str(run), "--to", str(tmp_path / "hf")]) == 0
    exported = load_hf_model(tmp_path / "hf")
    ids = jnp.asarray([[2, 30, 40, 50, 60]])
    # The HF layout stores the norm scales in the model dtype too (bf16 here; ours are
    # float32), so the exported model differs by that rounding only.
    np.testing.assert_allclose(
        np.asarray(sequence_logprobs(exported, ids)),
        np.asarray(sequence_logprobs(policy, ids)),
        atol=1e-2,
    )
    with pytest.raises(ValueError, match="master_dtype"):
        dataclasses.replace(OptimizerConfig(), master_dtype="bfloat16")
