import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.inference.sampling import sample, split_keys

LOGITS = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 4000, jnp.float32))


def _draw(temperature=1.0, top_k=0, top_p=1.0, seed=0):
    n = LOGITS.shape[0]
    keys = jax.vmap(lambda i: jax.random.key_data(jax.random.key(i)))(
        jnp.arange(n) + seed * n
    ).astype(jnp.uint32)
    tokens, logprobs = sample(
        LOGITS, keys, jnp.full(n, temperature), jnp.full(n, top_k, jnp.int32), jnp.full(n, top_p)
    )
    return np.asarray(tokens), np.asarray(logprobs)


def test_greedy_is_argmax_with_untempered_logprob():
    tokens, logprobs = _draw(temperature=0.0)
    assert set(tokens.tolist()) == {0}
    np.testing.assert_allclose(logprobs, np.log(0.5), rtol=1e-5)


def test_unfiltered_sampling_matches_the_distribution():
    tokens, logprobs = _draw()
    freq = np.bincount(tokens, minlength=4) / tokens.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)
    np.testing.assert_allclose(
        logprobs, np.log(np.array([0.5, 0.3, 0.15, 0.05]))[tokens], rtol=1e-5
    )


@pytest.mark.parametrize(
    "kwargs,allowed",
    [
        (dict(top_k=1), {0}),
        (dict(top_k=2), {0, 1}),
        (dict(top_p=0.5), {0}),
        (dict(top_p=0.75), {0, 1}),
        (dict(top_p=0.85), {0, 1, 2}),
        (dict(top_k=2, top_p=0.95), {0, 1}),
    ],
    ids=["k1", "k2", "p0.5", "p0.75", "p0.85", "k2_p0.95"],
)
def test_filters_keep_only_the_nucleus(kwargs, allowed):
    tokens, _ = _draw(**kwargs)
    assert set(tokens.tolist()) == allowed


def test_temperature_sharpens_and_reports_scaled_logprob():
    tokens, logprobs = _draw(temperature=0.5)
    p = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    p /= p.sum()
    np.testing.assert_allclose(np.bincount(tokens, minlength=4) / tokens.size, p, atol=0.03)
    np.testing.assert_allclose(logprobs, np.log(p)[tokens], rtol=1e-4)


def test_split_keys_advances_each_row():
    keys = jnp.stack([jax.random.key_data(jax.random.key(i)) for i in range(3)]).astype(jnp.uint32)
    nxt, use = split_keys(keys)
    assert nxt.shape == use.shape == (3, 2)
    assert not np.array_equal(np.asarray(nxt), np.asarray(keys))
    assert not np.array_equal(np.asarray(nxt), np.asarray(use))
