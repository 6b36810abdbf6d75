"""The pure, batched sampling step used inside jit.

Each row of a batch carries its own temperature, top-k and top-p as array
values, so one compiled decode step serves every mix of requests (the host-side
:class:`~tunix_agentic.inference.params.SamplingParams` become those rows).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _ordered_bits(x: jax.Array) -> jax.Array:
    """Map float32 values to uint32 so that unsigned order equals float order."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32)
    key = jnp.where(bits < 0, bits ^ jnp.int32(0x7FFFFFFF), bits)
    return jax.lax.bitcast_convert_type(key, jnp.uint32) ^ jnp.uint32(0x80000000)


def _largest_threshold(u: jax.Array, weight: jax.Array, need: jax.Array) -> jax.Array:
    """Per row, the largest ``t`` with ``sum(weight[u >= t]) >= need``, built bit by bit.

    ``u`` [B, V] uint32 ordered bits, ``weight`` [B, V], ``need`` [B]. Exact in 32
    fixed steps of one masked sum each: no sort of the vocabulary.
    """

    def step(i, t):
        cand = t | (jnp.uint32(1) << (31 - i).astype(jnp.uint32))
        mass = jnp.sum(jnp.where(u >= cand[:, None], weight, 0), axis=-1)
        return jnp.where(mass >= need, cand, t)

    return jax.lax.fori_loop(0, 32, step, jnp.zeros(u.shape[0], jnp.uint32))


def _filter(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Mask (to -inf) everything outside each row's top-k, then outside its top-p nucleus.

    Top-k keeps every value >= the k-th largest (ties with it included). Top-p
    then keeps, among those, the largest values down to the first one at which
    the renormalised mass reaches ``top_p``: the smallest such prefix.
    """
    vocab = scaled.shape[-1]
    u = _ordered_bits(scaled)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab), vocab).astype(jnp.float32)
    kth = _largest_threshold(u, jnp.ones_like(scaled), k)
    survivors = u >= kth[:, None]
    probs = jax.nn.softmax(jnp.where(survivors, scaled, -jnp.inf), axis=-1)
    nucleus = _largest_threshold(u, probs, top_p)
    nucleus = jnp.where(top_p >= 1, jnp.uint32(0), nucleus)  # p = 1: no rounding-off of the tail
    keep = survivors & (u >= nucleus[:, None])
    return jnp.where(keep, scaled, -jnp.inf)


def _inverse_cdf(keys: jax.Array, logits: jax.Array) -> jax.Array:
    """One draw per row from softmax(logits) with a single uniform per row.

    Inverse-CDF sampling: the token is the first index whose cumulative
    probability exceeds ``u * total``. Exact like the Gumbel-max trick, but it
    draws one random number per row instead of one per vocabulary entry.
    Masked (-inf) entries have zero mass and can never be picked.
    """
    u = jax.vmap(jax.random.uniform)(keys)
    cdf = jnp.cumsum(jax.nn.softmax(logits, axis=-1), axis=-1)
    index = jnp.sum(cdf < (u * cdf[:, -1])[:, None], axis=-1)
    return jnp.minimum(index, logits.shape[-1] - 1).astype(jnp.int32)


def allowed_tokens(bitmask: jax.Array, vocab: int) -> jax.Array:
    """[B, V] bool from an int32 bitmask [B, ceil(V / 32)] (bit j of word w: token 32w + j)."""
    ids = jnp.arange(vocab)
    words = jnp.take(bitmask, ids // 32, axis=1)
    return ((words >> (ids % 32)) & 1).astype(bool)


def sample(
    logits: jax.Array,  # [B, V] float32
    keys: jax.Array,  # [B, 2] uint32 raw PRNG keys
    temperature: jax.Array,  # [B]
    top_k: jax.Array,  # [B] int32, 0 = off
    top_p: jax.Array,  # [B]
    allowed: jax.Array | None = None,  # [B, ceil(V / 32)] int32 bitmask; None: all
) -> tuple[jax.Array, jax.Array]:
    """Sample one token per row; returns ``(tokens [B], logprobs [B])``.

    The logprob is that of the chosen token under the temperature-scaled,
    *unfiltered* distribution (temperature 1 for greedy rows): the learner
    recomputes exactly this from the same logits, so ratios start at 1.

    Work that no row needs is skipped at run time (``lax.cond``): an all-greedy
    batch draws no random numbers, and a batch without top-k/top-p rows does
    not filter. Filtering never sorts the vocabulary (see ``_filter``).

    ``allowed`` (constrained decoding, :mod:`~tunix_agentic.inference.constraint`): the
    other tokens' logits are -inf before anything else, so the token and its logprob are
    those of the masked distribution. Without it the program is the one it always was.
    """
    vocab = logits.shape[-1]
    if allowed is not None:
        logits = jnp.where(allowed_tokens(allowed, vocab), logits, -jnp.inf)
    greedy = temperature <= 0
    t = jnp.where(greedy, 1.0, temperature)[:, None]
    scaled = logits / t
    logp = jax.nn.log_softmax(scaled, axis=-1)
    filtering = ~greedy & (((top_k > 0) & (top_k < vocab)) | (top_p < 1))

    def draw(scaled):
        filtered = jax.lax.cond(
            jnp.any(filtering), _filter, lambda s, k, p: s, scaled, top_k, top_p
        )
        return _inverse_cdf(keys, filtered)

    sampled = jax.lax.cond(
        jnp.any(~greedy), draw, lambda s: jnp.zeros(s.shape[0], jnp.int32), scaled
    )
    tokens = jnp.where(greedy, jnp.argmax(logits, axis=-1), sampled).astype(jnp.int32)
    logprobs = jnp.take_along_axis(logp, tokens[:, None], axis=-1)[:, 0]
    return tokens, logprobs


def split_keys(keys: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Advance each row's raw key: returns ``(next_keys, use_keys)``, both [B, 2]."""
    pairs = jax.vmap(lambda k: jax.random.split(k, 2))(keys)
    return pairs[:, 0], pairs[:, 1]
