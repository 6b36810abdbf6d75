"""Sampling parameters and the pure, batched sampling step used inside jit.

Each row of a batch carries its own temperature, top-k and top-p as array
values, so one compiled decode step serves every mix of requests.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature 0 means greedy. ``top_k`` 0 and ``top_p`` 1.0 switch those
    filters off. Generation stops after a token in ``stop_token_ids`` (which is
    kept in the output) or after ``max_new_tokens``. ``seed`` makes a request
    reproducible on its own, whatever else is batched beside it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 128
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


def sample(
    logits: jax.Array,  # [B, V] float32
    keys: jax.Array,  # [B, 2] uint32 raw PRNG keys
    temperature: jax.Array,  # [B]
    top_k: jax.Array,  # [B] int32, 0 = off
    top_p: jax.Array,  # [B]
) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row; returns ``(tokens [B], logprobs [B])``.

    The logprob is that of the chosen token under the temperature-scaled,
    *unfiltered* distribution (temperature 1 for greedy rows): the learner
    recomputes exactly this from the same logits, so ratios start at 1.
    """
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature)[:, None]
    scaled = logits / t
    logp = jax.nn.log_softmax(scaled, axis=-1)

    sorted_logits = jnp.sort(scaled, axis=-1)[:, ::-1]  # descending
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab)
    kth = jnp.take_along_axis(sorted_logits, (k - 1)[:, None], axis=-1)
    # top-p over the top-k survivors: keep the smallest prefix whose mass reaches p.
    sorted_masked = jnp.where(jnp.arange(vocab)[None] < k[:, None], sorted_logits, -jnp.inf)
    probs = jax.nn.softmax(sorted_masked, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    keep_sorted = (mass_before < top_p[:, None]) & (jnp.arange(vocab)[None] < k[:, None])
    cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    threshold = jnp.maximum(kth, cutoff)
    filtered = jnp.where(scaled >= threshold, scaled, -jnp.inf)

    sampled = jax.vmap(lambda key, row: jax.random.categorical(key, row))(keys, filtered)
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    logprobs = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs


def split_keys(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advance each row's raw key: returns ``(next_keys, use_keys)``, both [B, 2]."""
    pairs = jax.vmap(lambda k: jax.random.split(k, 2))(keys)
    return pairs[:, 0], pairs[:, 1]
