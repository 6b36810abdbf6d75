import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.models.transformer import (
    ModelConfig,
    count_params,
    init_cache,
    sequence_logprobs,
)
from tunix_agentic.testing import TINY, tiny_model


def _positions(b, t):
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))


@pytest.mark.parametrize("qk_norm", [False, True], ids=["plain", "qk_norm"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_forward_shapes(qk_norm, tied):
    model = tiny_model(qk_norm=qk_norm, tie_embeddings=tied)
    ids = jnp.ones((3, 11), jnp.int32)
    logits, cache = model(ids, _positions(3, 11))
    assert logits.shape == (3, 11, TINY.vocab_size)
    assert cache is None
    assert np.all(np.isfinite(np.asarray(logits)))


def test_kv_cache_prefill_and_decode_match_full_forward():
    model = tiny_model(qk_norm=True)
    ids = jax.random.randint(jax.random.key(1), (2, 13), 0, TINY.vocab_size)
    full, _ = model(ids, _positions(2, 13))
    cache = init_cache(TINY, slots=4, max_len=24)
    rows = jnp.array([3, 1])
    # Prefill 7 tokens padded to 9; padding carries position max_len so it is dropped.
    pad = jnp.zeros((2, 2), jnp.int32)
    p_ids = jnp.concatenate([ids[:, :7], pad], axis=1)
    p_pos = jnp.concatenate([_positions(2, 7), jnp.full((2, 2), 24)], axis=1)
    logits, cache = model(p_ids, p_pos, cache, rows, logits_at=jnp.array([6, 6]))
    np.testing.assert_allclose(logits, full[:, 6], atol=1e-5)
    for t in range(7, 13):
        step_logits, cache = model(ids[:, t : t + 1], _positions(2, 13)[:, t : t + 1], cache, rows)
        np.testing.assert_allclose(step_logits[:, 0], full[:, t], atol=1e-5)
    # Slots not in ``rows`` were never written.
    assert float(jnp.abs(cache[0][0][0]).max()) == 0.0
    assert float(jnp.abs(cache[0][0][2]).max()) == 0.0


def test_right_padding_does_not_change_real_positions():
    model = tiny_model()
    ids = jax.random.randint(jax.random.key(2), (1, 9), 1, TINY.vocab_size)
    padded = jnp.concatenate([ids, jnp.zeros((1, 5), jnp.int32)], axis=1)
    a, _ = model(ids, _positions(1, 9))
    b, _ = model(padded, _positions(1, 14))
    np.testing.assert_allclose(a, b[:, :9], atol=1e-5)


def test_sequence_logprobs_shape_and_sign():
    model = tiny_model()
    ids = jax.random.randint(jax.random.key(3), (2, 8), 0, TINY.vocab_size)
    lp = sequence_logprobs(model, ids)
    assert lp.shape == (2, 7)
    assert float(lp.max()) <= 0.0


def test_param_count_matches_formula():
    c = TINY
    attn = c.d_model * c.head_dim * (2 * c.num_heads + 2 * c.num_kv_heads)
    mlp = 3 * c.d_model * c.ffn_dim
    per_layer = attn + mlp + 2 * c.d_model
    expected = c.vocab_size * c.d_model + c.num_layers * per_layer + c.d_model
    assert count_params(tiny_model()) == expected


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(num_heads=3, num_kv_heads=2), "num_heads"),
        (dict(head_dim=7), "head_dim"),
        (dict(d_model=0), "d_model"),
        (dict(dtype="int8"), "dtype"),
    ],
    ids=["gqa", "odd_head_dim", "zero_width", "dtype"],
)
def test_bad_model_config_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ModelConfig(**kwargs)
