"""The semantics that differ between our GRPO and TRL's, pinned on literal arrays: Dr. GRPO's
normaliser, the std of GRPO's advantages, and the ratio-corrected k3 KL."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.learners.advantages import get_advantage_fn, grpo, grpo_bessel
from tunix_agentic.learners.grpo import GRPOConfig
from tunix_agentic.learners.losses import aggregate, grpo_loss

MASK = np.array([[1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]], np.float32)  # 3 + 1 tokens


def test_dr_grpo_normaliser_is_a_constant_when_given():
    ones = np.ones_like(MASK)
    # default: (rows with tokens) x padded width = 2 x 8
    assert float(aggregate(ones, MASK, "seq_mean_token_sum_norm")) == pytest.approx(4 / 16)
    # the same batch padded to 16: the default scale halves, the constant's does not
    wide = np.pad(MASK, ((0, 0), (0, 8)))
    assert float(aggregate(np.ones_like(wide), wide, "seq_mean_token_sum_norm")) == pytest.approx(
        4 / 32
    )
    for m in (MASK, wide):
        value = aggregate(np.ones_like(m), m, "seq_mean_token_sum_norm", norm_length=4)
        assert float(value) == pytest.approx(4 / (2 * 4))


def test_grpo_std_population_by_default_bessel_as_trl():
    rewards = np.array([1.0, 0.0, 0.0, 0.0])
    # mean 0.25; population std sqrt(3)/4 = 0.4330; Bessel std 0.5
    expected = np.array([0.75, -0.25, -0.25, -0.25]) / (0.4330127 + 1e-6)
    np.testing.assert_allclose(grpo(rewards), expected, rtol=1e-5)
    np.testing.assert_allclose(grpo_bessel(rewards), [1.4997, -0.4999, -0.4999, -0.4999], atol=1e-4)
    ratio = grpo_bessel(rewards) / grpo(rewards)
    np.testing.assert_allclose(ratio, math.sqrt(3 / 4), rtol=1e-3)  # sqrt((G-1)/G) at G=4
    assert grpo_bessel(np.array([1.0])).tolist() == [0.0]
    assert get_advantage_fn("grpo_bessel") is grpo_bessel and GRPOConfig().advantage == "grpo"


def test_k3_kl_ratio_corrected_as_trl():
    lp = np.array([[-1.0, -2.0]], np.float32)
    old = np.array([[-1.2, -1.5]], np.float32)
    ref = np.array([[-0.5, -2.5]], np.float32)
    mask = np.ones_like(lp)
    zero = np.zeros(1, np.float32)  # no policy term: the loss is the KL alone
    d = ref - lp
    k3 = np.exp(d) - d - 1.0  # [[0.14872, 0.10653]]
    np.testing.assert_allclose(k3, [[0.1487213, 0.1065307]], rtol=1e-5)
    plain, aux = grpo_loss(lp, old, zero, mask, ref_logprobs=ref, kl_coef=0.5)
    assert float(plain) == pytest.approx(0.5 * k3.mean(), rel=1e-5)
    corrected, _ = grpo_loss(
        lp, old, zero, mask, ref_logprobs=ref, kl_coef=0.5, kl_ratio_corrected=True
    )
    weighted = k3 * np.exp(lp - old)  # ratios 1.2214, 0.6065
    assert float(corrected) == pytest.approx(0.5 * weighted.mean(), rel=1e-5)
    assert float(aux["ref_kl_nats"]) == pytest.approx(k3.mean(), rel=1e-5)


def test_the_learner_config_validates_the_new_knobs():
    with pytest.raises(ValueError, match="norm_length"):
        GRPOConfig(norm_length=-1)
    assert jnp.isfinite(aggregate(np.zeros_like(MASK), MASK, "seq_mean_token_sum_norm", 64))


def test_a_learner_step_with_trl_semantics():
    from tunix_agentic.learners.grpo import GRPOLearner
    from tunix_agentic.testing import on_policy_batch, tiny_model

    model = tiny_model(seed=3)
    batch = on_policy_batch(model)
    config = GRPOConfig(
        advantage="grpo_bessel",
        aggregation="seq_mean_token_sum_norm",
        norm_length=64,
        kl_coef=0.1,
        kl_ratio_corrected=True,
    )
    out = GRPOLearner(model, config, seed=0).train_step(batch)
    assert np.isfinite(out["loss"]) and out["ref_kl_nats"] == pytest.approx(0.0, abs=1e-6)
