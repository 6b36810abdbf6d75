"""Policy-gradient losses on padded, masked token arrays (pure jax.numpy).

Shapes: ``logprobs``, ``old_logprobs``, ``mask`` are ``[B, T]`` (per target
token); ``advantages`` is ``[B]`` (one per sequence, broadcast over tokens).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


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
    if how == "token_mean":
        return jnp.sum(per_token * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    if how == "seq_mean_token_mean":
        rows = jnp.sum(mask, axis=-1)
        per_seq = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(rows, 1.0)
        return jnp.sum(per_seq) / jnp.maximum(jnp.sum(rows > 0), 1.0)
    if how == "seq_mean_token_sum_norm":
        rows = jnp.maximum(jnp.sum(jnp.any(mask > 0, axis=-1)), 1.0)
        return jnp.sum(per_token * mask) / (rows * (norm_length or mask.shape[-1]))
    raise ValueError(f"unknown loss aggregation {how!r}; known: {AGGREGATIONS}")


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
    """
    adv = advantages[:, None]
    log_ratio = logprobs - old_logprobs
    ratio = jnp.exp(log_ratio)
    unclipped = ratio * adv
    clipped = jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -jnp.minimum(unclipped, clipped)
    denom = jnp.maximum(jnp.sum(mask), 1.0)
    aux = {
        "clip_fraction": jnp.sum((clipped < unclipped) * mask) / denom,
        "approx_kl": jnp.sum(0.5 * log_ratio**2 * mask) / denom,
        "ratio_mean": jnp.sum(ratio * mask) / denom,
    }
    if behaviour_logprobs is not None and tis_cap > 0:
        weight = jax.lax.stop_gradient(
            jnp.minimum(jnp.exp(old_logprobs - behaviour_logprobs), tis_cap)
        )
        per_token = per_token * weight
        aux["tis_weight_mean"] = jnp.sum(weight * mask) / denom
        aux["tis_capped_fraction"] = jnp.sum((weight >= tis_cap) * mask) / denom
    if ref_logprobs is not None and kl_coef > 0:
        d = ref_logprobs - logprobs
        kl = jnp.exp(d) - d - 1.0
        if kl_ratio_corrected:
            kl = kl * jax.lax.stop_gradient(ratio)
        per_token = per_token + kl_coef * kl
        aux["ref_kl"] = jnp.sum(kl * mask) / denom
    return aggregate(per_token, mask, aggregation, norm_length), aux


def masked_cross_entropy(logprobs: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Negative log-likelihood averaged over masked tokens (SFT)."""
    return -jnp.sum(logprobs * mask) / jnp.maximum(jnp.sum(mask), 1.0)
