"""Policy-gradient losses on padded, masked token arrays (pure jax.numpy).

Shapes: ``logprobs``, ``old_logprobs``, ``mask`` are ``[B, T]`` (per target
token); ``advantages`` is ``[B]`` (one per sequence, broadcast over tokens).

Micro-batching contract. :func:`policy_loss` returns ``sum(per_token * loss_weights)``
and metrics ``sum(x * metric_weights)``, where every per-token term depends on its own
row only. The weights come from :func:`aggregation_weights` (loss) and
:func:`metric_weights` (metrics), computed once over the WHOLE batch and then sliced by
rows, so summing a micro-batch's loss, gradient and metrics over micro-batches gives the
whole batch's values exactly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from tunix_agentic.learners.configs import (  # noqa: F401  (re-exported)
    AGGREGATIONS,
    KL_ESTIMATORS,
    KL_PENALTIES,
    OFF_POLICY_MASKS,
    POLICY_LOSS_TYPES,
    PolicyLossConfig,
)


def aggregate(
    per_token: jnp.ndarray, mask: jnp.ndarray, how: str, norm_length: int = 0
) -> jnp.ndarray:
    """Reduce ``[B, T]`` to a scalar.

    - token_mean: every generated token weighs the same (DAPO, Yu et al. 2025).
    - seq_mean_token_mean: mean per sequence, then over sequences (original GRPO).
    - seq_mean_token_sum_norm: token sum over (rows with tokens) x L (Dr. GRPO, Liu et al.
      2025), L a constant: ``norm_length`` (e.g. the maximum completion length), or, when
      0, the padded width T, which moves with the batch's length bucket (the scale halves
      when the longest sequence crosses a bucket edge).
    """
    return jnp.sum(per_token * aggregation_weights(mask, how, norm_length))


def aggregation_weights(mask: jnp.ndarray, how: str, norm_length: int = 0) -> jnp.ndarray:
    """Per-token weights ``[B, T]`` with ``sum(per_token * w) == aggregate(per_token, mask,
    how, norm_length)``.

    Compute them once over the whole batch, then slice rows into micro-batches: the
    normalisers (token count, live rows, L) are the whole batch's, so the micro-batch
    losses add up to the whole batch's loss. Padding rows weigh 0.
    """
    mask = jnp.asarray(mask, jnp.float32)
    if how == "token_mean":
        return mask / jnp.maximum(jnp.sum(mask), 1.0)
    if how == "seq_mean_token_mean":
        rows = jnp.sum(mask, axis=-1, keepdims=True)
        live = jnp.maximum(jnp.sum(rows > 0), 1.0)
        return mask / (jnp.maximum(rows, 1.0) * live)
    if how == "seq_mean_token_sum_norm":
        live = jnp.maximum(jnp.sum(jnp.any(mask > 0, axis=-1)), 1.0)
        return mask / (live * (norm_length or mask.shape[-1]))
    raise ValueError(f"unknown loss aggregation {how!r}; known: {AGGREGATIONS}")


def metric_weights(mask: jnp.ndarray) -> jnp.ndarray:
    """Weights ``[B, T]`` for the metrics of :func:`policy_loss`: ``mask / (tokens in the
    whole batch)``, so every metric is a token mean (a row metric weighs each row by its
    token count). Compute over the whole batch, then slice by rows."""
    return aggregation_weights(mask, "token_mean")


def kl_estimate(logprobs: jnp.ndarray, ref_logprobs: jnp.ndarray, estimator: str) -> jnp.ndarray:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020,
    "Approximating KL divergence"), with ``d = log pi - log pi_ref``:

    - k1 = d: unbiased, high variance, negative on some tokens;
    - k2 = d^2 / 2: biased, low variance, always >= 0;
    - k3 = exp(-d) + d - 1: unbiased, low variance, always >= 0 (GRPO's, eq. 4).
    """
    d = logprobs - ref_logprobs
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d**2
    if estimator == "k3":
        return jnp.exp(-d) + d - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {KL_ESTIMATORS}")


def sequence_kl(
    logprobs: jnp.ndarray, ref_logprobs: jnp.ndarray, mask: jnp.ndarray, estimator: str = "k1"
) -> jnp.ndarray:
    """Per-row KL to the reference ``[B]``: the estimator summed over the row's masked
    tokens, without gradient (the input of :func:`kl_penalized_advantages`)."""
    kl = kl_estimate(logprobs, ref_logprobs, estimator)
    return jax.lax.stop_gradient(jnp.sum(kl * mask, axis=-1))


def kl_penalized_advantages(
    advantages: jnp.ndarray, seq_kl: jnp.ndarray, kl_coef: float
) -> jnp.ndarray:
    """KL as a reward penalty: ``A_i - kl_coef * KL_i`` (``[B]``, no gradient).

    PPO-RLHF (Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences";
    Ouyang et al. 2022) subtracts ``beta * KL`` from the sequence's reward; here the penalty
    is folded into the (already group-normalised) advantage, so it is neither centred nor
    scaled by the group statistics. ``seq_kl`` is :func:`sequence_kl` (sum of k1 over the
    row's tokens); rows are independent, so this is exact under micro-batching.
    """
    return jax.lax.stop_gradient(advantages - kl_coef * seq_kl)


def ppo_surrogate(
    ratio: jnp.ndarray,
    advantages: jnp.ndarray,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Per-token clipped surrogate loss ``-min(r A, clip(r) A)`` (PPO, Schulman et al. 2017).

    ``dual_clip = c > 1``: for A < 0 the loss is also capped at ``-c A`` (dual-clip PPO, Ye
    et al. 2020, "Mastering Complex Control in MOBA Games with Deep Reinforcement
    Learning"), so a huge ratio on a bad action cannot blow the update up. Returns the
    loss, whether the trust-region clip bound, and whether the dual clip bound (``[B, T]``).
    """
    adv = advantages[:, None]
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    objective = jnp.minimum(unclipped, clipped)
    dual = jnp.zeros_like(objective, bool)
    if dual_clip > 0:
        dual = (adv < 0) & (objective < dual_clip * adv)
        objective = jnp.where(adv < 0, jnp.maximum(objective, dual_clip * adv), objective)
    return -objective, clipped < unclipped, dual


def gspo_log_ratio(
    logprobs: jnp.ndarray, old_logprobs: jnp.ndarray, mask: jnp.ndarray
) -> jnp.ndarray:
    """GSPO-token's per-token log-ratio ``[B, T]`` (Zheng et al. 2025, "Group Sequence Policy
    Optimization", eq. 12).

    Its value is the row's sequence log-ratio ``log s_i = mean_t(logp - old)`` over the
    row's masked tokens, the same for every token; its gradient is each token's own
    ``d logp``: ``log s_i`` (no gradient) ``+ logp - stopgrad(logp)``. With
    ``seq_mean_token_mean`` aggregation the gradient equals sequence-level GSPO's.
    """
    n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
    log_s = jnp.sum((logprobs - old_logprobs) * mask, axis=-1, keepdims=True) / n
    return jax.lax.stop_gradient(log_s) + logprobs - jax.lax.stop_gradient(logprobs)


def off_policy_keep(
    proximal_logprobs: jnp.ndarray,
    behaviour_logprobs: jnp.ndarray,
    mask: jnp.ndarray,
    how: str,
    low: float,
    high: float,
) -> jnp.ndarray:
    """Which tokens keep their gradient ``[B, T]`` (1.0 / 0.0, no gradient).

    - "sequence": a row is dropped when its sequence-level importance ratio, the geometric
      mean over its tokens ``exp(mean_t(prox - behaviour))``, leaves ``[low, high]``
      (sequence-level masking against training/inference mismatch, as in GSPO's sequence
      ratios and Yao et al. 2025's masked importance sampling).
    - "token": IcePop (Ling Team 2025, "Every Step Evolves: Scaling Reinforcement Learning
      for Trillion-Scale Thinking Model", Ring-1T): a token whose ratio p_train / p_infer
      leaves ``[low, high]`` (they use [0.5, 2]) gets no gradient.
    """
    log_ratio = proximal_logprobs - behaviour_logprobs
    if how == "none":
        return jnp.ones_like(mask)
    if how == "sequence":
        n = jnp.maximum(jnp.sum(mask, axis=-1, keepdims=True), 1.0)
        log_r = jnp.sum(log_ratio * mask, axis=-1, keepdims=True) / n
        inside = (log_r >= jnp.log(low)) & (log_r <= jnp.log(high))
        return jax.lax.stop_gradient(jnp.broadcast_to(inside, mask.shape).astype(mask.dtype))
    if how == "token":
        inside = (log_ratio >= jnp.log(low)) & (log_ratio <= jnp.log(high))
        return jax.lax.stop_gradient(inside.astype(mask.dtype))
    raise ValueError(f"unknown off-policy mask {how!r}; known: {OFF_POLICY_MASKS}")


def policy_loss(
    logprobs: jnp.ndarray,
    old_logprobs: jnp.ndarray,
    advantages: jnp.ndarray,
    mask: jnp.ndarray,
    loss_weights: jnp.ndarray,
    metric_weights: jnp.ndarray,
    cfg: PolicyLossConfig,
    *,
    ref_logprobs: jnp.ndarray | None = None,
    behaviour_logprobs: jnp.ndarray | None = None,
    entropy: jnp.ndarray | None = None,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """The policy loss ``sum(per_token * loss_weights)`` and metrics ``sum(x * metric_weights)``.

    Every per-token term depends on its own row only, so with whole-batch weights
    (:func:`aggregation_weights`, :func:`metric_weights`) sliced by rows the loss, its
    gradient and every metric add up exactly over micro-batches. Per token:

    1. ratio: ``exp(logp - old)`` ("ppo", PPO / GRPO, Shao et al. 2024) or GSPO-token's
       sequence ratio (:func:`gspo_log_ratio`), clipped to ``[1 - clip_low, 1 +
       clip_high]`` (``clip_high > clip_low`` is DAPO's clip-higher; GSPO uses ~3e-4/4e-4);
       dual clip on negative advantages (:func:`ppo_surrogate`).
    2. off-policy: with ``behaviour_logprobs`` (the sampler's), ``old_logprobs`` is the
       proximal policy (decoupled PPO; AReaL, Fu et al. 2025); ``tis_cap > 0`` weighs each
       token by ``min(exp(old - behaviour), tis_cap)`` (truncated IS, Yao et al. 2025);
       ``off_policy_mask`` drops rows or tokens (:func:`off_policy_keep`). IcePop exactly
       (weight ``k`` inside ``[low, high]``, 0 outside) is "token" with ``tis_cap =
       off_policy_high``.
    3. KL to ``ref_logprobs`` when ``kl_coef > 0``: added as ``kl_coef * k`` under
       ``kl_penalty="loss"`` (times the gradient-free ratio with ``kl_ratio_corrected``, as
       TRL does; the token ratio, under GSPO too); under "reward" only reported (the
       caller folds it into the advantages with :func:`kl_penalized_advantages`).
    4. entropy bonus: ``- entropy_coef * entropy``. ``entropy`` ``[B, T]`` comes from the
       caller; it must carry gradient when ``entropy_coef > 0``, otherwise it is a metric.

    Metrics (all token means): clip_fraction, approx_kl_nats (to ``old``), ratio_mean; and when
    on: dual_clip_fraction, tis_weight_mean, tis_capped_fraction, off_policy_kept_fraction,
    ref_kl_nats, entropy_nats.
    """
    if cfg.off_policy_mask != "none" and behaviour_logprobs is None:
        raise ValueError(
            f"learner.off_policy_mask={cfg.off_policy_mask!r} needs behaviour_logprobs"
        )
    if cfg.entropy_coef > 0 and entropy is None:
        raise ValueError("learner.entropy_coef > 0 needs the per-token entropy (with gradient)")
    token_log_ratio = logprobs - old_logprobs
    if cfg.loss_type == "gspo":
        log_ratio = gspo_log_ratio(logprobs, old_logprobs, mask)
    elif cfg.loss_type == "ppo":
        log_ratio = token_log_ratio
    else:
        raise ValueError(f"unknown policy loss type {cfg.loss_type!r}; known: {POLICY_LOSS_TYPES}")
    ratio = jnp.exp(log_ratio)
    per_token, clipped, dual = ppo_surrogate(
        ratio, advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip
    )

    def mean(x):
        return jnp.sum(x * metric_weights)

    aux = {
        "clip_fraction": mean(clipped),
        "approx_kl_nats": mean(0.5 * token_log_ratio**2),
        "ratio_mean": mean(ratio),
    }
    if cfg.dual_clip > 0:
        aux["dual_clip_fraction"] = mean(dual)
    if behaviour_logprobs is not None and cfg.tis_cap > 0:
        weight = jax.lax.stop_gradient(
            jnp.minimum(jnp.exp(old_logprobs - behaviour_logprobs), cfg.tis_cap)
        )
        per_token = per_token * weight
        aux["tis_weight_mean"] = mean(weight)
        aux["tis_capped_fraction"] = mean(weight >= cfg.tis_cap)
    if cfg.off_policy_mask != "none":
        keep = off_policy_keep(
            old_logprobs,
            behaviour_logprobs,
            mask,
            cfg.off_policy_mask,
            cfg.off_policy_low,
            cfg.off_policy_high,
        )
        per_token = per_token * keep
        aux["off_policy_kept_fraction"] = mean(keep)
    if ref_logprobs is not None and cfg.kl_coef > 0:
        kl = kl_estimate(logprobs, ref_logprobs, cfg.kl_estimator)
        if cfg.kl_ratio_corrected:
            kl = kl * jax.lax.stop_gradient(jnp.exp(token_log_ratio))
        if cfg.kl_penalty == "loss":
            per_token = per_token + cfg.kl_coef * kl
        aux["ref_kl_nats"] = mean(jax.lax.stop_gradient(kl))
    if entropy is not None:
        if cfg.entropy_coef > 0:
            per_token = per_token - cfg.entropy_coef * entropy
        aux["entropy_nats"] = mean(jax.lax.stop_gradient(entropy))
    return jnp.sum(per_token * loss_weights), aux


def grpo_loss(
    logprobs: jnp.ndarray,
    old_logprobs: jnp.ndarray,
    advantages: jnp.ndarray,
    mask: jnp.ndarray,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: str = "token_mean",
    ref_logprobs: jnp.ndarray | None = None,
    kl_coef: float = 0.0,
    behaviour_logprobs: jnp.ndarray | None = None,
    tis_cap: float = 0.0,
    norm_length: int = 0,
    kl_ratio_corrected: bool = False,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """Clipped-ratio surrogate (PPO, Schulman et al. 2017; GRPO, Shao et al. 2024).

    ``clip_high > clip_low`` is DAPO's clip-higher. With ``ref_logprobs`` and
    ``kl_coef > 0`` adds the k3 KL estimator to a reference policy (GRPO eq. 4).
    Returns the scalar loss and diagnostics (clip fraction, approximate KL to
    the sampling policy, mean ratio, KL to the reference).

    Off-policy correction (decoupled PPO with truncated importance sampling,
    as in AReaL and Yao et al. 2025): pass ``behaviour_logprobs`` (what the
    engine that sampled the tokens reported) and ``tis_cap > 0``; then
    ``old_logprobs`` is the proximal policy (the learner's current parameters
    before the update), the ratio is clipped around it, and each token's term
    is weighted by ``min(exp(old - behaviour), tis_cap)`` without gradient.
    That corrects both a stale sampler and a sampler whose numerics differ.

    ``kl_ratio_corrected`` multiplies each token's k3 KL by the (gradient-free) ratio
    ``pi / pi_old``, the importance correction TRL applies by default for samples drawn
    from the old policy. ``norm_length`` is Dr. GRPO's constant (see :func:`aggregate`).

    The whole batch in one call: :func:`policy_loss` with the batch's own weights.
    """
    cfg = PolicyLossConfig(
        clip_low=clip_low,
        clip_high=clip_high,
        kl_coef=kl_coef,
        kl_ratio_corrected=kl_ratio_corrected,
        tis_cap=tis_cap,
    )
    return policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        aggregation_weights(mask, aggregation, norm_length),
        metric_weights(mask),
        cfg,
        ref_logprobs=ref_logprobs,
        behaviour_logprobs=behaviour_logprobs,
    )


def mismatch_metrics(
    logprobs: jnp.ndarray, other_logprobs: jnp.ndarray, mask: jnp.ndarray
) -> dict[str, jnp.ndarray]:
    """How far two engines' logprobs of the same tokens disagree (training/inference
    mismatch; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy
    RL Training"), over the masked tokens of the WHOLE batch (quantiles do not add up over
    micro-batches: call this once, outside the gradient).

    ``logprobs`` is the trainer's (proximal), ``other_logprobs`` the sampler's; the ratio
    is ``p_train / p_infer``. Returns mismatch_abs_logp_nats (mean ``|Δ logp|``), mismatch_k3_nats
    (mean k3 KL(infer || train) estimate) and ratio quantiles mismatch_ratio_p05 / p50 /
    p95 (NaN when the mask is empty).
    """
    mask = jnp.asarray(mask, jnp.float32)
    d = jax.lax.stop_gradient(logprobs - other_logprobs)
    n = jnp.maximum(jnp.sum(mask), 1.0)
    ratio = jnp.where(mask > 0, jnp.exp(d), jnp.nan)
    p05, p50, p95 = jnp.nanquantile(ratio, jnp.asarray([0.05, 0.5, 0.95]))
    return {
        "mismatch_abs_logp_nats": jnp.sum(jnp.abs(d) * mask) / n,
        "mismatch_k3_nats": jnp.sum((jnp.exp(d) - d - 1.0) * mask) / n,
        "mismatch_ratio_p05": p05,
        "mismatch_ratio_p50": p50,
        "mismatch_ratio_p95": p95,
    }


def masked_cross_entropy(logprobs: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Negative log-likelihood averaged over masked tokens (SFT)."""
    return -jnp.sum(logprobs * mask) / jnp.maximum(jnp.sum(mask), 1.0)
