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


def _reference_keep(row: np.ndarray, top_k: int, top_p: float) -> set[int]:
    """The nucleus by the textbook recipe: sort, cut to k, keep the smallest prefix reaching p."""
    order = np.argsort(-row, kind="stable")
    k = top_k if 0 < top_k < row.size else row.size
    kth = row[order[k - 1]]
    survivors = order[row[order] >= kth]
    probs = np.exp(row[survivors] - row[survivors].max())
    probs /= probs.sum()
    before = np.cumsum(probs) - probs
    kept = survivors[before < top_p] if top_p < 1 else survivors
    return {int(i) for i in np.flatnonzero(row >= row[kept].min()) if i in set(survivors)}


@pytest.mark.parametrize(
    "top_k,top_p",
    [(0, 0.9), (5, 1.0), (17, 0.6), (0, 0.3), (1, 1.0)],
    ids=["p0.9", "k5", "k17_p0.6", "p0.3", "greedy_k1"],
)
def test_filter_without_sorting_matches_the_sorted_reference(top_k, top_p):
    from tunix_agentic.inference.sampling import _filter

    rng = np.random.default_rng(top_k)
    logits = rng.normal(0, 3, (8, 300)).astype(np.float32)
    logits[0, :50] = 0.0  # ties
    logits[1] = -logits[1]  # negative-heavy row
    out = np.asarray(
        _filter(jnp.asarray(logits), jnp.full(8, top_k, jnp.int32), jnp.full(8, top_p, jnp.float32))
    )
    for i in range(8):
        assert set(np.flatnonzero(np.isfinite(out[i])).tolist()) == _reference_keep(
            logits[i], top_k, top_p
        ), i


def test_mixed_batch_keeps_greedy_rows_greedy_and_filters_only_its_own_rows():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 2000, jnp.float32))
    keys = jax.vmap(lambda i: jax.random.key_data(jax.random.key(i)))(jnp.arange(2000)).astype(
        jnp.uint32
    )
    temp = jnp.where(jnp.arange(2000) % 2 == 0, 0.0, 1.0)
    top_k = jnp.where(jnp.arange(2000) % 4 == 1, 2, 0).astype(jnp.int32)
    tokens, _ = sample(logits, keys, temp, top_k, jnp.ones(2000))
    tokens = np.asarray(tokens)
    assert set(tokens[0::2].tolist()) == {0}  # greedy rows
    assert set(tokens[1::4].tolist()) == {0, 1}  # top-k 2 rows
    assert set(tokens[3::4].tolist()) == {0, 1, 2, 3}  # unfiltered rows see the whole vocabulary
