"""The RL algorithm family on literal arrays: batch-level advantages, dual clip, GSPO, KL
estimators and KL-in-reward, entropy bonus, overlong handling, off-policy masks, mismatch
metrics, the collapse diagnostic, and the micro-batching contract of ``policy_loss``."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.learners import losses
from tunix_agentic.learners.advantages import (
    BatchAdvantage,
    erpo,
    get_advantage_fn,
    overlong_penalty,
    reinforce,
    reinforce_pp,
)
from tunix_agentic.learners.batching import grpo_batch, is_truncated
from tunix_agentic.learners.diagnostics import cross_pairs, mi_from_scores
from tunix_agentic.learners.losses import (
    AGGREGATIONS,
    PolicyLossConfig,
    aggregate,
    aggregation_weights,
    kl_estimate,
    kl_penalized_advantages,
    metric_weights,
    mismatch_metrics,
    sequence_kl,
)
from tunix_agentic.rollout.episode import Group
from tunix_agentic.trajectory import Step, Trajectory

LN2 = math.log(2.0)

# One compile per (shape, config): cfg is a frozen, hashable dataclass.
policy_loss = jax.jit(losses.policy_loss, static_argnums=(6,))


def _loss_and_grads(cfg, lp, old, adv, mask, lw, mw, *, entropy=None, **kw):
    """Loss, metrics and (d loss / d logprobs, d loss / d entropy or None)."""

    def f(lp, entropy):
        return policy_loss(lp, old, adv, mask, lw, mw, cfg, entropy=entropy, **kw)

    (loss, aux), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        jnp.asarray(lp), entropy
    )
    return float(loss), {k: float(v) for k, v in aux.items()}, grads


def _whole(cfg, lp, old, adv, mask, aggregation="token_mean", **kw):
    return _loss_and_grads(
        cfg, lp, old, adv, mask, aggregation_weights(mask, aggregation), metric_weights(mask), **kw
    )


# --------------------------------------------------------------------------- aggregation
PER_TOKEN = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
AGG_MASK = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], np.float32)  # row 2: padding


@pytest.mark.parametrize(
    ("how", "norm_length", "weights", "value"),
    [
        ("token_mean", 0, [[1 / 3, 1 / 3, 0], [1 / 3, 0, 0], [0, 0, 0]], 7 / 3),
        ("seq_mean_token_mean", 0, [[1 / 4, 1 / 4, 0], [1 / 2, 0, 0], [0, 0, 0]], 2.75),
        ("seq_mean_token_sum_norm", 0, [[1 / 6, 1 / 6, 0], [1 / 6, 0, 0], [0, 0, 0]], 7 / 6),
        ("seq_mean_token_sum_norm", 4, [[1 / 8, 1 / 8, 0], [1 / 8, 0, 0], [0, 0, 0]], 7 / 8),
    ],
    ids=["token_mean", "seq_mean_token_mean", "sum_norm_width", "sum_norm_constant"],
)
def test_aggregation_weights_reproduce_aggregate(how, norm_length, weights, value):
    w = aggregation_weights(jnp.asarray(AGG_MASK), how, norm_length)
    np.testing.assert_allclose(w, weights, rtol=1e-6)
    got = float(jnp.sum(PER_TOKEN * w))
    np.testing.assert_allclose(got, value, rtol=1e-6)
    want = float(aggregate(PER_TOKEN, AGG_MASK, how, norm_length))
    np.testing.assert_allclose(got, want, rtol=1e-6)  # equal up to float32 rounding
    # sliced by rows, the pieces add up to the whole
    pieces = sum(float(jnp.sum(PER_TOKEN[s] * w[s])) for s in (slice(0, 1), slice(1, 3)))
    np.testing.assert_allclose(pieces, value, rtol=1e-6)


def test_aggregation_weights_unknown_raises():
    with pytest.raises(ValueError, match="unknown loss aggregation 'sum'.*token_mean"):
        aggregation_weights(jnp.ones((1, 2)), "sum")


# ------------------------------------------------------------------------------ config
@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"loss_type": "trpo"}, "learner.loss_type"),
        ({"kl_estimator": "k4"}, "learner.kl_estimator"),
        ({"kl_penalty": "value"}, "learner.kl_penalty"),
        ({"off_policy_mask": "row"}, "learner.off_policy_mask"),
        ({"clip_low": 1.0}, "learner.clip_low"),
        ({"clip_high": -0.1}, "learner.clip_high"),
        ({"dual_clip": 0.5}, "learner.dual_clip"),
        ({"kl_coef": -1.0}, "learner.kl_coef"),
        ({"entropy_coef": -0.1}, "learner.entropy_coef"),
        ({"tis_cap": 0.5}, "learner.tis_cap"),
        ({"off_policy_low": 1.5}, "learner.off_policy_low"),
        ({"off_policy_high": 0.9}, "learner.off_policy_high"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_policy_loss_config_names_the_bad_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PolicyLossConfig(**kwargs)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match=r"\('ppo', 'gspo'\)"):
        PolicyLossConfig(loss_type="trpo")
    with pytest.raises(ValueError, match=r"\('k1', 'k2', 'k3'\)"):
        kl_estimate(jnp.zeros(1), jnp.zeros(1), "k4")
    with pytest.raises(ValueError, match=r"known: .*batch-level: \['erpo', 'reinforce'"):
        get_advantage_fn("ppo")


# --------------------------------------------------------------------------- dual clip
def test_dual_clip_caps_negative_advantage_loss():
    # One token per row; ratios 5, 2, 5 with advantages -1, -1, +1; clip 0.2, c = 3.
    old = np.zeros((3, 1), np.float32)
    lp = np.log(np.array([[5.0], [2.0], [5.0]], np.float32))
    adv = np.array([-1.0, -1.0, 1.0], np.float32)
    mask = np.ones((3, 1), np.float32)
    cfg = PolicyLossConfig(dual_clip=3.0)
    loss, aux, (g, _) = _whole(cfg, lp, old, adv, mask)
    # row 0: plain PPO 5, capped at -c A = 3; row 1: 2 < 3 stays; row 2: clipped -1.2
    np.testing.assert_allclose(loss, (3.0 + 2.0 - 1.2) / 3, rtol=1e-5)
    np.testing.assert_allclose(aux["dual_clip_fraction"], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(aux["clip_fraction"], 1 / 3, rtol=1e-6)
    # capped and clipped tokens get no gradient; row 1's loss is r: d/dlogp = r / 3
    np.testing.assert_allclose(g, [[0.0], [2 / 3], [0.0]], rtol=1e-5, atol=1e-7)
    plain, plain_aux, _ = _whole(PolicyLossConfig(), lp, old, adv, mask)
    np.testing.assert_allclose(plain, (5.0 + 2.0 - 1.2) / 3, rtol=1e-5)
    assert "dual_clip_fraction" not in plain_aux


# -------------------------------------------------------------------------------- GSPO
def test_gspo_uses_one_clipped_sequence_ratio_per_row():
    old = np.zeros((2, 3), np.float32)
    # row 0: masked log-ratios 0.2, -0.1 -> s = exp(0.05), far outside [1 - 3e-4, 1 + 4e-4]
    # row 1: 1e-4, -1e-4, 3e-4 -> s = exp(1e-4) inside
    lp = np.array([[0.2, -0.1, 5.0], [1e-4, -1e-4, 3e-4]], np.float32)
    mask = np.array([[1, 1, 0], [1, 1, 1]], np.float32)
    adv = np.array([1.0, -1.0], np.float32)
    cfg = PolicyLossConfig(loss_type="gspo", clip_low=3e-4, clip_high=4e-4)
    loss, aux, (g, _) = _whole(cfg, lp, old, adv, mask)
    s1 = math.exp(1e-4)
    np.testing.assert_allclose(loss, (2 * -1.0004 + 3 * s1) / 5, rtol=1e-6)
    np.testing.assert_allclose(aux["clip_fraction"], 2 / 5, rtol=1e-6)
    np.testing.assert_allclose(aux["ratio_mean"], (2 * math.exp(0.05) + 3 * s1) / 5, rtol=1e-5)
    # row 0 clipped: no gradient; row 1 (A = -1): each token's gradient is s * w = s / 5
    np.testing.assert_allclose(g, [[0, 0, 0], [s1 / 5] * 3], rtol=1e-5, atol=1e-8)


def test_gspo_token_gradient_equals_sequence_level_gspo():
    rng = np.random.default_rng(1)
    old = rng.normal(-1.0, 0.3, (3, 4)).astype(np.float32)
    lp = (old + rng.normal(0.0, 0.05, (3, 4))).astype(np.float32)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    adv = np.array([1.0, -0.5, 2.0], np.float32)
    cfg = PolicyLossConfig(loss_type="gspo", clip_low=0.02, clip_high=0.03)

    def sequence_gspo(lp):  # Zheng et al. 2025 eq. 5: -mean_i min(s_i A_i, clip(s_i) A_i)
        s = jnp.exp(jnp.sum((lp - old) * mask, -1) / jnp.sum(mask, -1))
        return -jnp.mean(jnp.minimum(s * adv, jnp.clip(s, 1 - 0.02, 1 + 0.03) * adv))

    loss, _, (g, _) = _whole(cfg, lp, old, adv, mask, "seq_mean_token_mean")
    np.testing.assert_allclose(loss, float(sequence_gspo(jnp.asarray(lp))), rtol=1e-5)
    np.testing.assert_allclose(g, jax.grad(sequence_gspo)(jnp.asarray(lp)), rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------------- KL
# d = logp - ref = [ln2, 0, -ln2] on the live tokens; the last token is padding.
KL_LP = np.array([[-1.0, -2.0, -3.0, -4.0]], np.float32)
KL_REF = KL_LP - np.array([[LN2, 0.0, -LN2, 9.0]], np.float32)
KL_MASK = np.array([[1, 1, 1, 0]], np.float32)


@pytest.mark.parametrize(
    ("estimator", "per_token"),
    [
        ("k1", [LN2, 0.0, -LN2]),
        ("k2", [0.5 * LN2**2, 0.0, 0.5 * LN2**2]),
        ("k3", [LN2 - 0.5, 0.0, 1.0 - LN2]),  # exp(-d) + d - 1
    ],
    ids=["k1", "k2", "k3"],
)
def test_kl_estimators(estimator, per_token):
    got = kl_estimate(jnp.asarray(KL_LP), jnp.asarray(KL_REF), estimator)
    np.testing.assert_allclose(got[0, :3], per_token, rtol=1e-5, atol=1e-7)
    cfg = PolicyLossConfig(kl_coef=0.1, kl_estimator=estimator)
    zero = np.zeros(1, np.float32)  # no policy term: the loss is the KL alone
    loss, aux, _ = _whole(cfg, KL_LP, KL_LP, zero, KL_MASK, ref_logprobs=jnp.asarray(KL_REF))
    np.testing.assert_allclose(aux["ref_kl_nats"], sum(per_token) / 3, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(loss, 0.1 * sum(per_token) / 3, rtol=1e-5, atol=1e-7)
    # as a reward penalty the loss has no KL term; the metric stays
    reward = PolicyLossConfig(kl_coef=0.1, kl_estimator=estimator, kl_penalty="reward")
    loss, aux, _ = _whole(reward, KL_LP, KL_LP, zero, KL_MASK, ref_logprobs=jnp.asarray(KL_REF))
    assert loss == 0.0
    np.testing.assert_allclose(aux["ref_kl_nats"], sum(per_token) / 3, rtol=1e-5, atol=1e-7)


def test_kl_as_a_reward_penalty():
    lp = np.array([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]], np.float32)
    ref = np.array([[-1.5, -1.0, -9.0], [-2.0, -1.0, -1.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    # k1 summed over each row's tokens: 0.5 - 1.0 = -0.5; 1.0
    seq = sequence_kl(jnp.asarray(lp), jnp.asarray(ref), jnp.asarray(mask))
    np.testing.assert_allclose(seq, [-0.5, 1.0], rtol=1e-6)
    adv = kl_penalized_advantages(jnp.asarray([1.0, -1.0]), seq, 0.1)
    np.testing.assert_allclose(adv, [1.05, -1.1], rtol=1e-6)
    # no gradient flows back into the policy through the penalty
    g = jax.grad(lambda x: jnp.sum(kl_penalized_advantages(adv, sequence_kl(x, ref, mask), 0.1)))
    np.testing.assert_array_equal(g(jnp.asarray(lp)), np.zeros_like(lp))


# ---------------------------------------------------------------------------- entropy
def test_entropy_bonus_lowers_the_loss_and_carries_gradient():
    lp = np.zeros((2, 2), np.float32)
    entropy = jnp.asarray([[1.0, 2.0], [3.0, 50.0]])  # the 50 is padding
    mask = np.array([[1, 1], [1, 0]], np.float32)
    zero = np.zeros(2, np.float32)
    cfg = PolicyLossConfig(entropy_coef=0.1)
    loss, aux, (_, g_ent) = _whole(cfg, lp, lp, zero, mask, entropy=entropy)
    np.testing.assert_allclose(loss, -0.1 * 6 / 3, rtol=1e-6)
    np.testing.assert_allclose(aux["entropy_nats"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(g_ent, [[-0.1 / 3, -0.1 / 3], [-0.1 / 3, 0.0]], rtol=1e-6)
    # off: entropy is a metric only
    loss, aux, (_, g_ent) = _whole(PolicyLossConfig(), lp, lp, zero, mask, entropy=entropy)
    assert loss == 0.0 and aux["entropy_nats"] == pytest.approx(2.0)
    np.testing.assert_array_equal(g_ent, np.zeros((2, 2)))


# ------------------------------------------------------------------ off-policy masking
def test_sequence_mask_drops_rows_by_geometric_mean_ratio():
    behaviour = np.zeros((2, 2), np.float32)
    old = np.array([[0.1, 0.1], [1.0, 0.0]], np.float32)  # geometric means e^0.1, e^0.5
    mask = np.ones((2, 2), np.float32)
    cfg = PolicyLossConfig(off_policy_mask="sequence", off_policy_high=1.5)
    loss, aux, (g, _) = _whole(
        cfg, old, old, np.ones(2, np.float32), mask, behaviour_logprobs=jnp.asarray(behaviour)
    )
    np.testing.assert_allclose(loss, -2 / 4, rtol=1e-6)  # row 1 (e^0.5 > 1.5) dropped
    np.testing.assert_allclose(aux["off_policy_kept_fraction"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(g, [[-0.25, -0.25], [0.0, 0.0]], rtol=1e-6)


def test_icepop_token_mask():
    old = np.zeros((1, 4), np.float32)
    # p_train / p_infer = 2.5, 1, 0.4, 1.9: outside [0.5, 2] for the first and third
    behaviour = -np.log(np.array([[2.5, 1.0, 0.4, 1.9]], np.float32))
    mask = np.ones((1, 4), np.float32)
    kw = {"behaviour_logprobs": jnp.asarray(behaviour)}
    cfg = PolicyLossConfig(off_policy_mask="token")
    loss, aux, (g, _) = _whole(cfg, old, old, np.ones(1, np.float32), mask, **kw)
    np.testing.assert_allclose(loss, -2 / 4, rtol=1e-6)
    np.testing.assert_allclose(aux["off_policy_kept_fraction"], 0.5, rtol=1e-6)
    np.testing.assert_allclose(g, [[0.0, -0.25, 0.0, -0.25]], rtol=1e-6)
    # IcePop's M(k) exactly: weight k inside the band (tis_cap = the upper bound)
    exact = PolicyLossConfig(off_policy_mask="token", tis_cap=2.0)
    loss, _, _ = _whole(exact, old, old, np.ones(1, np.float32), mask, **kw)
    np.testing.assert_allclose(loss, -(1.0 + 1.9) / 4, rtol=1e-5)


def test_off_policy_mask_needs_behaviour_logprobs():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="needs behaviour_logprobs"):
        losses.policy_loss(x, x, jnp.zeros(1), x, x, x, PolicyLossConfig(off_policy_mask="token"))


def test_entropy_bonus_needs_entropy():
    x = jnp.zeros((1, 2))
    with pytest.raises(ValueError, match="learner.entropy_coef"):
        losses.policy_loss(x, x, jnp.zeros(1), x, x, x, PolicyLossConfig(entropy_coef=0.1))


def test_mismatch_metrics_literal():
    b = np.zeros((2, 2), np.float32)
    a = np.array([[LN2, -LN2], [0.0, 7.0]], np.float32)  # ratios 2, 0.5, 1 (7 is padding)
    mask = np.array([[1, 1], [1, 0]], np.float32)
    m = {k: float(v) for k, v in mismatch_metrics(a, b, mask).items()}
    np.testing.assert_allclose(m["mismatch_abs_logp_nats"], 2 * LN2 / 3, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_k3_nats"], 0.5 / 3, rtol=1e-5)  # (1-ln2)+(ln2-0.5)+0
    # linear-interpolation quantiles of [0.5, 1, 2]
    np.testing.assert_allclose(m["mismatch_ratio_p05"], 0.55, rtol=1e-5)
    np.testing.assert_allclose(m["mismatch_ratio_p50"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(m["mismatch_ratio_p95"], 1.9, rtol=1e-5)


# ------------------------------------------------------------ micro-batching contract
CONFIGS = {
    "default": PolicyLossConfig(),
    "dapo_dual": PolicyLossConfig(clip_high=0.28, dual_clip=3.0),
    "gspo": PolicyLossConfig(loss_type="gspo", clip_low=0.05, clip_high=0.06),
    "kl_k2_corrected": PolicyLossConfig(kl_coef=0.1, kl_estimator="k2", kl_ratio_corrected=True),
    "entropy": PolicyLossConfig(entropy_coef=0.01),
    "tis_icepop": PolicyLossConfig(tis_cap=2.0, off_policy_mask="token", off_policy_low=0.8),
    "tis_sequence": PolicyLossConfig(tis_cap=1.5, off_policy_mask="sequence", off_policy_high=1.1),
}


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=str)
@pytest.mark.parametrize("name", list(CONFIGS), ids=str)
def test_micro_batches_add_up_to_the_whole_batch(name, aggregation):
    cfg = CONFIGS[name]
    rng = np.random.default_rng(7)
    b, t = 6, 5
    old = rng.normal(-1.5, 0.4, (b, t)).astype(np.float32)
    lp = (old + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)
    ref = (old + rng.normal(0.0, 0.3, (b, t))).astype(np.float32)
    behaviour = (old + rng.normal(0.0, 0.15, (b, t))).astype(np.float32)
    entropy = jnp.asarray(rng.uniform(0.0, 2.0, (b, t)).astype(np.float32))
    adv = rng.normal(0.0, 1.0, b).astype(np.float32)
    mask = (rng.random((b, t)) < 0.7).astype(np.float32)
    mask[4] = 0.0  # a padding row
    lw = aggregation_weights(mask, aggregation)
    mw = metric_weights(mask)
    kw = {"ref_logprobs": ref, "behaviour_logprobs": behaviour, "entropy": entropy}

    whole_loss, whole_aux, (whole_g, whole_ge) = _loss_and_grads(
        cfg, lp, old, adv, mask, lw, mw, **kw
    )
    loss, aux, grads, grads_e = 0.0, dict.fromkeys(whole_aux, 0.0), [], []
    for s in (slice(0, 2), slice(2, 4), slice(4, 6)):
        part = {k: v[s] for k, v in kw.items()}
        l_, a_, (g_, ge_) = _loss_and_grads(
            cfg, lp[s], old[s], adv[s], mask[s], lw[s], mw[s], **part
        )
        loss += l_
        aux = {k: aux[k] + a_[k] for k in aux}
        grads.append(g_)
        grads_e.append(ge_)
    np.testing.assert_allclose(loss, whole_loss, rtol=1e-5, atol=1e-7)
    for k in whole_aux:
        np.testing.assert_allclose(aux[k], whole_aux[k], rtol=1e-5, atol=1e-7, err_msg=k)
    np.testing.assert_allclose(np.concatenate(grads), whole_g, rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(np.concatenate(grads_e), whole_ge, rtol=1e-5, atol=1e-8)


def test_default_config_is_grpo_loss():
    rng = np.random.default_rng(3)
    old = rng.normal(-1.0, 0.5, (4, 6)).astype(np.float32)
    lp = (old + rng.normal(0.0, 0.3, (4, 6))).astype(np.float32)
    adv = rng.normal(0.0, 1.0, 4).astype(np.float32)
    mask = (rng.random((4, 6)) < 0.6).astype(np.float32)
    for aggregation in AGGREGATIONS:
        want, want_aux = losses.grpo_loss(lp, old, adv, mask, aggregation=aggregation)
        got, got_aux, _ = _whole(PolicyLossConfig(), lp, old, adv, mask, aggregation)
        np.testing.assert_allclose(got, float(want), rtol=1e-5, atol=1e-7)
        assert sorted(got_aux) == sorted(want_aux)


# ---------------------------------------------------------------------- advantages
# g0 (task a): [1, 0]; g1 (task a): [1, 1, 1, 0]; g2 (task b): [3, 1]
REWARDS = np.array([1, 0, 1, 1, 1, 0, 3, 1], np.float32)
GROUP_IDS = np.array([0, 0, 1, 1, 1, 1, 2, 2])
TASKS = ["a"] * 6 + ["b"] * 2


def test_reinforce_batch_baseline():
    # batch mean 1
    np.testing.assert_allclose(
        reinforce(REWARDS, GROUP_IDS, TASKS), [0, -1, 0, 0, 0, -1, 2, 0], atol=1e-7
    )


def test_reinforce_pp_batch_normalisation():
    # mean 1, population std sqrt(6/8)
    std = math.sqrt(0.75)
    np.testing.assert_allclose(
        reinforce_pp(REWARDS, GROUP_IDS, TASKS),
        np.array([0, -1, 0, 0, 0, -1, 2, 0]) / std,
        rtol=1e-5,
    )


def test_erpo_group_mean_environment_std():
    # task a rewards [1,0,1,1,1,0]: std sqrt(2)/3; group-centred [.5,-.5 | .25,.25,.25,-.75]
    # task b rewards [3, 1]: std 1; centred [1, -1]
    sa = math.sqrt(2) / 3
    want = [0.5 / sa, -0.5 / sa, 0.25 / sa, 0.25 / sa, 0.25 / sa, -0.75 / sa, 1.0, -1.0]
    np.testing.assert_allclose(erpo(REWARDS, GROUP_IDS, TASKS), want, rtol=1e-5)


@pytest.mark.parametrize("name", ["reinforce", "reinforce_pp", "erpo"], ids=str)
def test_batch_estimators_come_wrapped(name):
    fn = get_advantage_fn(name)
    assert isinstance(fn, BatchAdvantage)
    assert fn(REWARDS, GROUP_IDS, TASKS).dtype == np.float32


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [([0, 6, 7, 8, 10, 12], [0.0, 0.0, -0.25, -0.5, -1.0, -1.0])],
    ids=["dapo_max10_cache4"],
)
def test_overlong_penalty_literal(lengths, expected):
    np.testing.assert_allclose(overlong_penalty(lengths, 10, 4), expected, rtol=1e-6)


def test_overlong_penalty_rejects_bad_lengths():
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty([1], 4, 8)


# ---------------------------------------------------------------------- batching
def _traj(action, reward, task="a", status="ok", finish="stop"):
    traj = Trajectory(task_id="t", episode_id="e", task_name=task, reward=reward, status=status)
    traj.append_prompt([7, 8])
    traj.append_action(
        Step(
            context_len=2,
            action_ids=action,
            logprobs=[-0.5] * len(action),
            versions=[0] * len(action),
            finish_reason=finish,
        )
    )
    return traj


def _group(index, trajs):
    return Group(
        group_id=f"g{index}", index=index, task=None, admitted_version=0, trajectories=trajs
    )


def test_grpo_batch_with_a_batch_level_estimator():
    groups = [
        _group(0, [_traj([20], 1.0), _traj([21], 0.0)]),
        _group(1, [_traj([22], 2.0), _traj([23], 2.0), _traj([24], 5.0)]),
    ]
    batch = grpo_batch(groups, get_advantage_fn("reinforce"), pad_id=0, num_rows=6)
    # batch mean 2 over all five trajectories (not per group); one padding row
    np.testing.assert_allclose(batch.advantages, [-1, -2, 0, 0, 3, 0], atol=1e-6)
    erpo_batch = grpo_batch(groups, get_advantage_fn("erpo"), pad_id=0)
    std = float(np.std([1.0, 0.0, 2.0, 2.0, 5.0]))  # one task name: one pooled std
    np.testing.assert_allclose(
        erpo_batch.advantages, np.array([0.5, -0.5, -1, -1, 2]) / std, rtol=1e-5
    )
    np.testing.assert_array_equal(batch.truncated, [0] * 6)  # none cut off; flags kept anyway


def test_overlong_mask_zeroes_truncated_rows():
    trajs = [
        _traj([20, 21], 1.0),
        _traj([22, 23], 0.0, status="max_tokens"),
        _traj([24, 25], 1.0, finish="length"),
    ]
    assert [is_truncated(t) for t in trajs] == [False, True, True]
    batch = grpo_batch(
        [_group(0, trajs)], get_advantage_fn("dr_grpo"), pad_id=0, num_rows=4, overlong="mask"
    )
    np.testing.assert_array_equal(batch.loss_mask.sum(axis=1), [2, 0, 0, 0])
    np.testing.assert_array_equal(batch.truncated, [0, 1, 1, 0])
    # their rewards still count in the group mean (2/3)
    np.testing.assert_allclose(batch.advantages, [1 / 3, -2 / 3, 1 / 3, 0], rtol=1e-5)


def test_overlong_penalty_shapes_the_rewards():
    # max_len 4, cache 2: 2 tokens -> 0, 3 tokens -> -0.5, 4 tokens -> -1
    trajs = [_traj([20, 21], 1.0), _traj([22, 23, 24], 1.0), _traj([25, 26, 27, 28], 1.0)]
    batch = grpo_batch(
        [_group(0, trajs)],
        get_advantage_fn("dr_grpo"),
        pad_id=0,
        overlong="penalty",
        overlong_max_len=4,
        overlong_cache_len=2,
    )
    # shaped rewards [1, 0.5, 0], mean 0.5
    np.testing.assert_allclose(batch.advantages, [0.5, 0.0, -0.5], atol=1e-6)
    np.testing.assert_array_equal(batch.loss_mask.sum(axis=1), [2, 3, 4])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"overlong": "drop"},
            r"unknown overlong mode 'drop'; known: \('none', 'mask', 'penalty'\)",
        ),
        ({"overlong": "penalty", "overlong_max_len": 4}, "overlong_cache_len"),
    ],
    ids=["unknown_mode", "penalty_without_lengths"],
)
def test_grpo_batch_validates_overlong(kwargs, match):
    with pytest.raises(ValueError, match=match):
        grpo_batch([_group(0, [_traj([20], 1.0)])], get_advantage_fn("grpo"), pad_id=0, **kwargs)


# ---------------------------------------------------------------------- diagnostics
def test_cross_pairs_literal():
    input_ids = np.array(
        [
            [5, 6, 10, 11, 0],
            [7, 20, 99, 22, 0],  # two turns: action 20, observation 99, action 22
            [0, 0, 0, 0, 0],  # padding row: skipped
            [8, 9, 30, 0, 0],
        ],
        np.int32,
    )
    loss_mask = np.array(
        [[0, 0, 1, 1, 0], [0, 1, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]], np.float32
    )
    ids, mask = cross_pairs(input_ids, loss_mask, k=2, pad_id=0)
    np.testing.assert_array_equal(
        ids,
        [
            [5, 6, 10, 11, 0],  # response 0 after prompt 0
            [7, 10, 11, 0, 0],  # response 0 after prompt 1
            [5, 6, 20, 99, 22],  # response 1 after prompt 0
            [7, 20, 99, 22, 0],  # response 1 after prompt 1
        ],
    )
    np.testing.assert_array_equal(
        mask, [[0, 0, 1, 1, 0], [0, 1, 1, 0, 0], [0, 0, 1, 0, 1], [0, 1, 0, 1, 0]]
    )
    assert ids.dtype == np.int32 and mask.dtype == np.float32
    # k larger than the rows with responses: k shrinks to 3 (rows 0, 1, 3); bucketed width
    ids3, mask3 = cross_pairs(input_ids, loss_mask, k=5, pad_id=-1, length_multiple=4)
    assert ids3.shape == (9, 8) and mask3.shape == (9, 8)
    np.testing.assert_array_equal(ids3[2], [8, 9, 10, 11, -1, -1, -1, -1])  # resp 0 / prompt 2
    np.testing.assert_array_equal(ids3[6], [5, 6, 30, -1, -1, -1, -1, -1])  # resp 2 / prompt 0


@pytest.mark.parametrize(
    ("scores", "accuracy", "mi"),
    [
        (np.full((3, 3), -50.0) + 50.0 * np.eye(3), 1.0, math.log(3)),  # identifies prompts
        (np.full((4, 4), -7.0), 0.0, 0.0),  # collapse: the prompt does not matter
        ([[math.log(3), 0.0], [0.0, 0.0]], 0.5, math.log(1.5) / 2),  # row 1 is a tie
    ],
    ids=["diagonal", "all_equal", "mixed"],
)
def test_mi_from_scores(scores, accuracy, mi):
    out = mi_from_scores(np.asarray(scores))
    assert out["retrieval_accuracy"] == pytest.approx(accuracy)
    assert out["mutual_information_nats"] == pytest.approx(mi, abs=1e-9)
    assert out["mutual_information_nats_max"] == pytest.approx(math.log(len(scores)))


def test_mi_from_scores_rejects_non_square():
    with pytest.raises(ValueError, match="square"):
        mi_from_scores(np.zeros((2, 3)))
