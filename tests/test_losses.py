"""Tests for tunix_agentic.learners.losses: the clipped GRPO surrogate, aggregations, KL and cross-entropy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.learners import losses
from tunix_agentic.learners.losses import AGGREGATIONS, aggregate, masked_cross_entropy

# Tested under jit, as the learner calls it (one compile per shape instead of per op).
grpo_loss = jax.jit(
    losses.grpo_loss, static_argnames=("clip_low", "clip_high", "aggregation", "kl_coef")
)


def _lp(ratios, old):
    """logprobs giving the wanted ratio exp(logprobs - old)."""
    return np.asarray(old, np.float32) + np.log(np.asarray(ratios, np.float32))


def _np_grpo_loss(lp, old, adv, mask, clip_low, clip_high, aggregation, ref=None, kl_coef=0.0):
    """Independent NumPy reference of the same objective."""
    ratio = np.exp(lp - old)
    a = adv[:, None]
    per = -np.minimum(ratio * a, np.clip(ratio, 1 - clip_low, 1 + clip_high) * a)
    if ref is not None and kl_coef > 0:
        per = per + kl_coef * (np.exp(ref - lp) - (ref - lp) - 1)
    if aggregation == "token_mean":
        return (per * mask).sum() / max(mask.sum(), 1)
    live = mask.sum(-1) > 0
    if aggregation == "seq_mean_token_mean":
        return np.mean([(per[i] * mask[i]).sum() / mask[i].sum() for i in np.flatnonzero(live)])
    return (per * mask).sum() / (live.sum() * mask.shape[-1])


# Ratio 1 everywhere: per-token loss is -A. Row 2 is a padding row (zero mask, huge advantage).
OLD = np.array([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5], [-1.0, -1.0, -1.0]], np.float32)
ADV = np.array([2.0, -1.0, 5.0], np.float32)
MASK = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], np.float32)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token_mean", (-2 - 2 + 1 + 1 + 1) / 5),  # -0.2
        ("seq_mean_token_mean", (-2 + 1) / 2),  # -0.5: padding row not counted
        ("seq_mean_token_sum_norm", (-4 + 3) / (2 * 3)),  # -1/6: 2 live rows x T=3
    ],
    ids=["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
)
def test_ratio_one_aggregations(aggregation, expected):
    loss, aux = grpo_loss(
        jnp.asarray(OLD),
        jnp.asarray(OLD),
        jnp.asarray(ADV),
        jnp.asarray(MASK),
        aggregation=aggregation,
    )
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)
    np.testing.assert_allclose(float(aux["clip_fraction"]), 0.0, atol=0)
    np.testing.assert_allclose(float(aux["approx_kl_nats"]), 0.0, atol=0)
    np.testing.assert_allclose(float(aux["ratio_mean"]), 1.0, rtol=1e-6)
    assert "ref_kl_nats" not in aux


@pytest.mark.parametrize(
    ("ratio", "adv", "expected"),
    [
        (1.5, 1.0, -1.28),  # positive A, ratio above 1 + clip_high: clipped
        (0.5, -1.0, 0.8),  # negative A, ratio below 1 - clip_low: clipped
        (0.5, 1.0, -0.5),  # positive A, low ratio: unclipped (pessimistic min)
        (1.5, -1.0, 1.5),  # negative A, high ratio: unclipped
        (1.1, 2.0, -2.2),  # inside the trust region
    ],
    ids=[
        "pos_adv_high_ratio",
        "neg_adv_low_ratio",
        "pos_adv_low_ratio",
        "neg_adv_high_ratio",
        "inside",
    ],
)
def test_single_token_clipping(ratio, adv, expected):
    # One live token; the masked-out neighbours have extreme ratios that must not matter.
    old = np.array([[-1.0, -1.0, -1.0]], np.float32)
    lp = _lp([[100.0, ratio, 0.001]], old)
    mask = np.array([[0, 1, 0]], np.float32)
    loss, aux = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(old),
        jnp.asarray([adv]),
        jnp.asarray(mask),
        clip_low=0.2,
        clip_high=0.28,
    )
    np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
    clipped = expected in (-1.28, 0.8)
    np.testing.assert_allclose(float(aux["clip_fraction"]), 1.0 if clipped else 0.0, atol=0)
    np.testing.assert_allclose(float(aux["ratio_mean"]), ratio, rtol=1e-5)


def test_clipping_batch_literal():
    old = np.array([[-1.0, -2.0, -0.5], [-0.3, -1.2, -2.0]], np.float32)
    lp = _lp([[1.5, 0.5, 1.1], [0.5, 1.5, 0.9]], old)
    adv = np.array([1.0, -1.0], np.float32)
    mask = np.ones((2, 3), np.float32)
    loss, aux = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(old),
        jnp.asarray(adv),
        jnp.asarray(mask),
        clip_low=0.2,
        clip_high=0.28,
    )
    # per-token: [-1.28, -0.5, -1.1], [0.8, 1.5, 0.9]
    np.testing.assert_allclose(float(loss), 0.32 / 6, rtol=1e-5)
    np.testing.assert_allclose(float(aux["clip_fraction"]), 2 / 6, rtol=1e-6)
    np.testing.assert_allclose(float(aux["ratio_mean"]), 1.0, rtol=1e-5)
    half_sq = 0.5 * np.log([1.5, 0.5, 1.1, 0.5, 1.5, 0.9]) ** 2
    np.testing.assert_allclose(float(aux["approx_kl_nats"]), half_sq.mean(), rtol=1e-5)


def test_clip_high_above_clip_low():
    old = np.zeros((1, 2), np.float32)
    lp = _lp([[1.5, 0.5]], old)
    mask = np.ones((1, 2), np.float32)
    loss, _ = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(old),
        jnp.asarray([1.0]),
        jnp.asarray(mask),
        clip_low=0.1,
        clip_high=0.4,
    )
    np.testing.assert_allclose(float(loss), -(1.4 + 0.5) / 2, rtol=1e-5)


def test_mask_zeros_ignored():
    old = np.array([[-1.0, -1.0, -1.0, -1.0]], np.float32)
    mask = np.array([[1, 0, 1, 0]], np.float32)
    base = _lp([[1.0, 1.0, 1.0, 1.0]], old)
    wild = _lp([[1.0, 50.0, 1.0, 1e-4]], old)
    args = (jnp.asarray(old), jnp.asarray([3.0]), jnp.asarray(mask))
    for aggregation in AGGREGATIONS:
        a, _ = grpo_loss(jnp.asarray(base), *args, aggregation=aggregation)
        b, aux = grpo_loss(jnp.asarray(wild), *args, aggregation=aggregation)
        np.testing.assert_allclose(float(a), float(b), rtol=1e-6)
        np.testing.assert_allclose(float(aux["clip_fraction"]), 0.0, atol=0)
    np.testing.assert_allclose(float(a), -3.0 * 2 / 4, rtol=1e-6)  # sum_norm: 2 tokens over T=4


def test_kl_k3_term():
    lp = np.array([[-1.0, -2.0, -3.0, -4.0]], np.float32)
    ref = lp + np.array([[math.log(2.0), 0.0, -math.log(2.0), 5.0]], np.float32)
    mask = np.array([[1, 1, 1, 0]], np.float32)
    # k3 = exp(d) - d - 1: (1 - ln2) + 0 + (0.5 + ln2 - 1) = 0.5 over 3 live tokens
    loss, aux = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(lp),
        jnp.asarray([0.0]),
        jnp.asarray(mask),
        ref_logprobs=jnp.asarray(ref),
        kl_coef=0.1,
    )
    np.testing.assert_allclose(float(aux["ref_kl_nats"]), 0.5 / 3, rtol=1e-5)
    np.testing.assert_allclose(float(loss), 0.1 * 0.5 / 3, rtol=1e-5)


def test_kl_coef_zero_ignores_reference():
    lp = np.array([[-1.0, -2.0]], np.float32)
    mask = np.ones((1, 2), np.float32)
    loss, aux = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(lp),
        jnp.asarray([1.0]),
        jnp.asarray(mask),
        ref_logprobs=jnp.asarray(lp + 1.0),
        kl_coef=0.0,
    )
    np.testing.assert_allclose(float(loss), -1.0, rtol=1e-6)
    assert "ref_kl_nats" not in aux


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=str)
def test_matches_numpy_reference(aggregation):
    rng = np.random.default_rng(0)
    old = rng.normal(-2.0, 0.5, (5, 7)).astype(np.float32)
    lp = (old + rng.normal(0.0, 0.3, (5, 7))).astype(np.float32)
    ref = (old + rng.normal(0.0, 0.3, (5, 7))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, 5).astype(np.float32)
    mask = (rng.random((5, 7)) < 0.6).astype(np.float32)
    mask[3] = 0.0  # a padding row
    got, _ = grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(old),
        jnp.asarray(adv),
        jnp.asarray(mask),
        clip_low=0.2,
        clip_high=0.28,
        aggregation=aggregation,
        ref_logprobs=jnp.asarray(ref),
        kl_coef=0.05,
    )
    want = _np_grpo_loss(lp, old, adv, mask, 0.2, 0.28, aggregation, ref=ref, kl_coef=0.05)
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("token_mean", 10 / 4),
        ("seq_mean_token_mean", (3 / 2 + 7 / 2) / 2),
        ("seq_mean_token_sum_norm", 10 / (2 * 2)),
    ],
    ids=["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"],
)
def test_aggregate_literal(aggregation, expected):
    per_token = jnp.asarray([[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]])
    mask = jnp.asarray([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_allclose(float(aggregate(per_token, mask, aggregation)), expected, rtol=1e-6)


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=str)
def test_aggregate_all_masked_is_zero(aggregation):
    out = aggregate(jnp.ones((2, 3)), jnp.zeros((2, 3)), aggregation)
    np.testing.assert_allclose(float(out), 0.0, atol=0)


def test_unknown_aggregation_raises():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="unknown loss aggregation 'seq_sum'"):
        aggregate(x, x, "seq_sum")
    with pytest.raises(ValueError, match="unknown loss aggregation 'mean'"):
        losses.grpo_loss(x, x, jnp.zeros(1), x, aggregation="mean")


@pytest.mark.parametrize(
    ("logprobs", "mask", "expected"),
    [
        ([[-1.0, -2.0], [-3.0, -4.0]], [[1, 0], [1, 1]], 8 / 3),
        ([[-0.5, -1.5]], [[1, 1]], 1.0),
        ([[-1.0, -2.0]], [[0, 0]], 0.0),
    ],
    ids=["partial_mask", "full_mask", "empty_mask"],
)
def test_masked_cross_entropy(logprobs, mask, expected):
    out = masked_cross_entropy(jnp.asarray(logprobs, jnp.float32), jnp.asarray(mask, jnp.float32))
    np.testing.assert_allclose(float(out), expected, rtol=1e-6, atol=0)


def test_truncated_importance_weights_scale_each_token_and_stop_at_the_cap():
    old = np.array([[-1.0, -1.0, -1.0]], np.float32)
    lp = old.copy()  # ratio 1 to the proximal policy: the surrogate is -advantage per token
    # The sampler saw p/2, p, 4p: weights 2, 1, and 1/4.
    behaviour = old + np.log(np.array([[0.5, 1.0, 4.0]], np.float32))
    mask = np.ones((1, 3), np.float32)
    loss, aux = losses.grpo_loss(
        jnp.asarray(lp),
        jnp.asarray(old),
        jnp.asarray([1.0]),
        jnp.asarray(mask),
        behaviour_logprobs=jnp.asarray(behaviour),
        tis_cap=1.5,
    )
    # min(2, 1.5) + 1 + 0.25 over 3 tokens
    np.testing.assert_allclose(float(loss), -(1.5 + 1.0 + 0.25) / 3, rtol=1e-5)
    np.testing.assert_allclose(float(aux["tis_weight_mean"]), 2.75 / 3, rtol=1e-5)
    np.testing.assert_allclose(float(aux["tis_capped_fraction"]), 1 / 3, rtol=1e-5)
    plain, plain_aux = losses.grpo_loss(
        jnp.asarray(lp), jnp.asarray(old), jnp.asarray([1.0]), jnp.asarray(mask)
    )
    np.testing.assert_allclose(float(plain), -1.0, rtol=1e-6)
    assert "tis_weight_mean" not in plain_aux
