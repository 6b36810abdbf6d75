"""The GRPO train step as pure functions: static spec, parameters, optimizer state,
reference and batch in; new parameters, optimizer state and metrics out.

:class:`~tunix_agentic.learners.grpo.GRPOLearner` jits :func:`train_step` once with its
:class:`StepSpec` bound (``functools.partial``), donating parameters and optimizer state;
nothing here holds state or counts anything while tracing. The step optionally splits the
rows into micro-batches and accumulates their gradients: every loss term is row-local and
weighed by whole-batch normalisers (:func:`~tunix_agentic.learners.losses.aggregation_weights`),
so the update equals the whole batch's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import NamedSharding

from tunix_agentic.learners.batching import GRPOBatch, SFTBatch
from tunix_agentic.learners.grpo_config import GRPOConfig
from tunix_agentic.learners.lora import LoRAConfig
from tunix_agentic.learners.lora import attach as lora_attach
from tunix_agentic.learners.lora import merge as lora_merge
from tunix_agentic.learners.losses import (
    aggregation_weights,
    kl_penalized_advantages,
    masked_cross_entropy,
    metric_weights,
    mismatch_metrics,
    policy_loss,
    sequence_kl,
)
from tunix_agentic.learners.state import apply_gradients
from tunix_agentic.models.attention import ROWS_AXIS, _mesh_of
from tunix_agentic.models.transformer import sequence_logprobs
from tunix_agentic.sharding import DEFAULT_RULES, logical_axes, spec_for

Params = Any  # a pytree of arrays


@dataclasses.dataclass(frozen=True)
class StepSpec:
    """What the step is compiled for: the model's graph, the learner's config and the
    optimizer (bound statically; only arrays vary between calls)."""

    graphdef: nnx.GraphDef
    config: GRPOConfig
    optimizer: optax.GradientTransformation


def full_params(params: Params, base: Params | None, lora: LoRAConfig) -> Params:
    """The policy's full parameter tree: ``params`` itself, or base + merged adapters
    (what the engine receives)."""
    if base is None:
        return params
    return lora_merge(base, params, lora.scale)


def policy_params(params: Params, base: Params | None, lora: LoRAConfig) -> Params:
    """The policy as the loss runs it: ``params`` itself, or the base with each adapter
    beside its kernel (:func:`~tunix_agentic.learners.lora.attach`; the same policy as
    :func:`full_params` without a merged copy of the weights)."""
    if base is None:
        return params
    return lora_attach(base, params, lora.scale)


def forward(
    graphdef: nnx.GraphDef,
    params: Params,
    input_ids: jax.Array,  # [B, T]
    temperature: float,
    *,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Per-token logprobs of ``input_ids[:, 1:]`` ``[B, T-1]`` and the full log-softmax
    ``[B, T-1, V]`` they come from (one pass over the vocabulary serves logprobs and
    entropy)."""
    model = nnx.merge(graphdef, head_gathered(params, input_ids))
    b, t = input_ids.shape
    positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits, _ = model(input_ids, positions, remat=remat)
    logp = jax.nn.log_softmax(logits[:, :-1] / temperature, axis=-1)
    return jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0], logp


def head_gathered(params: Params, input_ids: jax.Array) -> Params:
    """``params`` with the output layer's weight whole along its model dimension when the
    rows of ``input_ids`` are sharded over a mesh's ``fsdp`` axis, as FSDP gathers a
    weight before its use (its ``tp`` split kept). Left to itself, XLA's partitioner
    multiplied each chip's slice of the model dimension by every row and moved the
    vocabulary-wide partial logits over the chips instead, forward and backward: for
    Qwen3-1.7B's recipe on a v5e-8 (learner fsdp 4) ~310 GB a chip a train step, where
    the weight is 0.6 GB (``tunix-agentic aot``'s ICI count, 2026-12-07)."""
    mesh = _mesh_of(input_ids)
    if mesh is None or dict(mesh.shape).get(ROWS_AXIS, 1) == 1:
        return params
    whole = {**DEFAULT_RULES, "embed": None}

    def one(path, leaf):
        if not isinstance(leaf, jax.Array):
            return leaf
        axes = logical_axes(path, leaf.ndim)
        if "vocab" not in axes:  # the embedding (tied) or lm_head: the output layer
            return leaf
        spec = spec_for(axes, leaf.shape, mesh, whole)
        return jax.lax.with_sharding_constraint(leaf, NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(one, params)


def logprobs(spec: StepSpec, params: Params, input_ids: jax.Array) -> jax.Array:
    """``[B, T-1]`` logprobs of ``input_ids`` under full parameters ``params``."""
    return forward(spec.graphdef, params, input_ids, spec.config.temperature)[0]


def loss_fn(
    spec: StepSpec,
    params: Params,
    base: Params | None,
    mb: dict[str, jax.Array],
    old: jax.Array | None,
    adv: jax.Array,
    ref: jax.Array | None,
    behaviour: jax.Array | None,
) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]:
    """The policy loss of one micro-batch ``mb`` (ids, mask, whole-batch weights) and its
    metrics, with the learner's logprobs (no gradient) as the last output.

    ``old`` None: the ratio's denominator is the learner's own pre-update policy (the
    decoupled objective, ``GRPOConfig.uses_proximal``), which is this very forward's
    logprobs, stopped: one update per batch leaves no other policy to recompute. With
    ``kl_penalty: reward`` the advantages are penalised here, where those logprobs are."""
    cfg = spec.config
    full = policy_params(params, base, cfg.lora)
    lp, logp = forward(spec.graphdef, full, mb["ids"], cfg.temperature, remat=cfg.remat)
    if old is None:
        old = jax.lax.stop_gradient(lp)
    extra = {}
    if ref is not None and cfg.kl_penalty == "reward":
        seq_kl = sequence_kl(old, ref, mb["mask"], cfg.kl_estimator)
        adv = kl_penalized_advantages(adv, seq_kl, cfg.kl_coef)
        # The advantage subtracted, averaged over the batch's rows with tokens.
        extra["kl_penalty_reward_mean"] = jnp.sum(cfg.kl_coef * seq_kl * mb["row_w"])
    entropy = -jnp.sum(jnp.exp(logp) * logp, axis=-1)
    if not cfg.entropy_coef:
        entropy = jax.lax.stop_gradient(entropy)
    loss, aux = policy_loss(
        lp,
        old,
        adv,
        mb["mask"],
        mb["loss_w"],
        mb["metric_w"],
        cfg.policy_loss,
        ref_logprobs=ref,
        behaviour_logprobs=behaviour,
        entropy=entropy,
    )
    aux.setdefault("entropy_nats", jnp.sum(jax.lax.stop_gradient(entropy) * mb["metric_w"]))
    return loss, ({**aux, **extra}, jax.lax.stop_gradient(lp))


def micro_step(
    spec: StepSpec,
    params: Params,
    ref_params: Params | None,
    base: Params | None,
    grads_acc: Params,
    mb: dict[str, jax.Array],
) -> tuple[Params, tuple[dict[str, jax.Array], jax.Array]]:
    """Add one micro-batch's gradients to ``grads_acc``; its summed metrics and logprobs."""
    cfg = spec.config
    ref = None
    if ref_params is not None:
        ref = jax.lax.stop_gradient(logprobs(spec, ref_params, mb["ids"]))
    old, behaviour = mb["sampler"], None
    if cfg.uses_proximal:  # the sampler's logprobs weigh; the ratio is to our own (loss_fn)
        behaviour, old = old, None
    grad_fn = jax.value_and_grad(
        lambda p: loss_fn(spec, p, base, mb, old, mb["adv"], ref, behaviour), has_aux=True
    )
    (loss, (aux, lp)), grads = grad_fn(params)
    grads_acc = jax.tree.map(lambda a, g: a + g.astype(a.dtype), grads_acc, grads)
    return grads_acc, ({"loss": loss, **aux}, lp)


def train_step(
    spec: StepSpec,
    params: Params,
    opt_state: optax.OptState,
    ref_params: Params | None,
    base: Params | None,
    batch: GRPOBatch,
    micro: int | None = None,
) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
    """One GRPO update over ``batch``; metrics are whole-batch sums and quantiles.
    ``micro`` (static): rows per micro-batch, overriding ``learner.micro_batch_rows``
    (the learner picks a smaller one when the step would not fit its memory)."""
    cfg = spec.config
    mask = batch.loss_mask[:, 1:]
    # Whole-batch normalisers, sliced with the rows: micro-batches add up exactly.
    arrays = {
        "ids": batch.input_ids,
        "mask": mask,
        "sampler": batch.old_logprobs[:, 1:],
        "adv": batch.advantages,
        "loss_w": aggregation_weights(mask, cfg.aggregation, cfg.norm_length),
        "metric_w": metric_weights(mask),
        "row_w": jnp.any(mask > 0, axis=-1) / jnp.maximum(jnp.sum(jnp.any(mask > 0, -1)), 1),
    }
    rows = mask.shape[0]
    micro = micro or cfg.micro_batch_rows or rows
    if rows % micro:
        raise ValueError(
            f"learner.micro_batch_rows={micro} does not divide the batch's {rows} rows"
        )
    n_micro = rows // micro

    def step(grads_acc, mb):
        return micro_step(spec, params, ref_params, base, grads_acc, mb)

    if n_micro == 1:
        grads, (sums, lp) = step(jax.tree.map(jnp.zeros_like, params), arrays)
    else:
        # Summed in float32 whatever the parameters' dtype, then cast back: bf16 sums
        # over micro-batches would round away what the whole batch keeps.
        zeros = jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params)
        # Micro-batch j takes rows j, j + n_micro, ...: strided, so with rows sharded
        # over fsdp in blocks every micro-batch spans every device.
        stacked = jax.tree.map(
            lambda x: x.reshape(micro, n_micro, *x.shape[1:]).swapaxes(0, 1), arrays
        )
        grads, (per_micro, lp) = jax.lax.scan(step, zeros, stacked)
        sums = jax.tree.map(lambda x: jnp.sum(x, axis=0), per_micro)
        lp = lp.swapaxes(0, 1).reshape(rows, -1)
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)
    metrics = dict(sums)
    metrics["grad_norm"] = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
    # Learner vs sampler on the whole batch (quantiles do not add up over micro-batches),
    # on the tokens sampled from the policy itself: a grammar-sampled token's recorded
    # logprob is the masked distribution's, which the learner does not compute.
    sampled = mask if batch.constrained is None else mask * (1 - batch.constrained[:, 1:])
    metrics.update(mismatch_metrics(lp, arrays["sampler"], sampled))
    params, opt_state = apply_gradients(spec.optimizer, params, opt_state, grads)
    return params, opt_state, metrics


def pair_scores(
    spec: StepSpec,
    params: Params,
    base: Params | None,
    pair_ids: jax.Array,  # [P, T]
    pair_mask: jax.Array,  # [P, T]
) -> jax.Array:
    """``[P]`` summed logprobs of each pair's masked tokens (the collapse diagnostic)."""
    lp = logprobs(spec, policy_params(params, base, spec.config.lora), pair_ids)
    return jnp.sum(lp * pair_mask[:, 1:], axis=-1)


def sft_step(
    graphdef: nnx.GraphDef,
    optimizer: optax.GradientTransformation,
    params: Params,
    opt_state: optax.OptState,
    batch: SFTBatch,
) -> tuple[Params, optax.OptState, dict[str, jax.Array]]:
    """One supervised update: masked next-token cross-entropy on ``batch``'s targets."""
    ids, mask = batch.input_ids, batch.loss_mask[:, 1:]

    def loss(p):
        model = nnx.merge(graphdef, p)
        lp = sequence_logprobs(model, ids, batch.positions, batch.segments)
        return masked_cross_entropy(lp, mask), lp

    (value, lp), grads = jax.value_and_grad(loss, has_aux=True)(params)
    params, opt_state = apply_gradients(optimizer, params, opt_state, grads)
    # Accuracy proxy: target's probability above one half means it is the argmax.
    acc = jnp.sum((lp > jnp.log(0.5)) * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    return params, opt_state, {"loss": value, "token_accuracy": acc}
