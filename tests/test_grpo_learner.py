"""The GRPO learner's step, with and without truncated importance sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.models.transformer import sequence_logprobs
from tunix_agentic.testing import tiny_model


def _batch(model, behaviour_shift: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, model.cfg.vocab_size, (4, 12)).astype(np.int32)
    mask = np.zeros((4, 12), np.float32)
    mask[:, 5:] = 1.0  # the last 7 tokens were generated
    old = np.zeros((4, 12), np.float32)
    old[:, 1:] = np.asarray(sequence_logprobs(model, ids)) + behaviour_shift
    return {
        "input_ids": ids,
        "loss_mask": mask,
        "old_logprobs": old,
        "advantages": np.array([1.0, 0.5, 2.0, 1.0], np.float32),  # token mean: -1.125 at ratio 1
    }


def test_tis_on_fresh_on_policy_data_changes_nothing():
    batch = _batch(tiny_model(seed=3))
    plain = GRPOLearner(tiny_model(seed=3), GRPOConfig()).train_step(batch)
    tis = GRPOLearner(tiny_model(seed=3), GRPOConfig(tis_cap=2.0)).train_step(batch)
    assert tis["tis_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    assert tis["tis_capped_fraction"] == 0.0
    assert tis["loss"] == pytest.approx(plain["loss"], abs=1e-5)
    assert tis["grad_norm"] == pytest.approx(plain["grad_norm"], rel=1e-3)


def test_tis_weighs_tokens_the_sampler_underrated_up_to_the_cap():
    model = tiny_model(seed=3)
    # The sampler gave every generated token a quarter of the learner's probability.
    batch = _batch(model, behaviour_shift=-math.log(4.0))
    plain = GRPOLearner(tiny_model(seed=3), GRPOConfig()).train_step(_batch(model))
    tis = GRPOLearner(tiny_model(seed=3), GRPOConfig(tis_cap=2.0)).train_step(batch)
    assert tis["tis_weight_mean"] == pytest.approx(2.0, rel=1e-4)
    assert tis["tis_capped_fraction"] == 1.0
    # Ratio 1 to the proximal policy in both runs; the weight doubles the surrogate.
    assert plain["loss"] == pytest.approx(-1.125, rel=1e-4)
    assert tis["loss"] == pytest.approx(2 * plain["loss"], rel=1e-4)


@pytest.mark.parametrize("cap", [-1.0, 0.5])
def test_tis_cap_below_one_is_rejected(cap):
    with pytest.raises(ValueError, match="learner.tis_cap"):
        GRPOConfig(tis_cap=cap)
