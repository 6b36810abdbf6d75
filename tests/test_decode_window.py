"""Decode windows: a decode chunk attends only over the cache positions its live slots use
(the smallest window bucket holding them), and outputs equal attending over all of
``max_seq_len``, in both KV layouts and both attention implementations."""

import asyncio
import dataclasses
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.inference import EngineConfig, SamplingParams
from tunix_agentic.inference.config import bucket, window_buckets
from tunix_agentic.inference.params import SamplingParams as Params
from tunix_agentic.inference.scheduler import Request, chunk_window
from tunix_agentic.models.transformer import cache_chunks, init_cache
from tunix_agentic.testing import tiny_model

# max_seq_len 256: windows 64, 96, 128, 192, 256 (dense: the cache's pieces are cut there).
BASE = dict(max_slots=4, max_seq_len=256, decode_steps=4)
LAYOUTS = {"dense": {}, "paged": dict(kv_layout="paged", kv_block_size=16)}


# ------------------------------------------------------------ the buckets
def test_window_buckets_double_with_midpoints_and_end_at_max_seq_len():
    assert window_buckets(576) == [64, 96, 128, 192, 256, 384, 512, 576]
    assert window_buckets(512) == [64, 96, 128, 192, 256, 384, 512]  # the cap, not twice
    assert window_buckets(64) == [64] and window_buckets(40) == [40]  # short caches: one
    assert window_buckets(100, multiple=64) == [64, 100]
    assert window_buckets(300, multiple=40) == [80, 120, 160, 200, 280, 300]
    assert window_buckets(100, base=8) == [8, 12, 16, 24, 32, 48, 64, 96, 100]
    with pytest.raises(ValueError, match="positive"):
        window_buckets(0)


def test_engine_config_window_buckets():
    assert EngineConfig(max_seq_len=576).window_buckets() == window_buckets(576)
    assert EngineConfig(max_seq_len=256).window_buckets() == [64, 96, 128, 192, 256]
    assert EngineConfig(max_seq_len=96).window_buckets() == [64, 96]
    assert EngineConfig(max_seq_len=96, kv_layout="paged").window_buckets() == [64, 96]
    assert EngineConfig(max_seq_len=576, decode_window="full").window_buckets() == [576]
    paged = EngineConfig(max_seq_len=320, kv_layout="paged", kv_block_size=64)
    assert paged.window_buckets() == [64, 128, 192, 256, 320]  # whole blocks only
    with pytest.raises(ValueError, match="decode_window"):
        EngineConfig(decode_window="auto")


def _request(prompt: int, generated: int, pending: int, max_new: int) -> Request:
    return Request(
        rid="r",
        prompt=[1] * prompt,
        sampling=Params(),
        session_id=None,
        future=None,
        loop=None,
        submitted=0.0,
        key=np.zeros(2, np.uint32),
        max_new=max_new,
        tokens=[7] * generated,
        pending=pending,
    )


def test_chunk_window_holds_every_live_position_to_the_chunk_end():
    cfg = EngineConfig(**BASE)  # decode_steps 4
    window = lambda *reqs: chunk_window(dict(enumerate(reqs)), cfg)  # noqa: E731
    # Prefill dispatched (pending 1): the chunk feeds positions 60..63, window 64.
    assert window(_request(60, 0, 1, 100)) == 64
    assert window(_request(61, 0, 1, 100)) == 96  # feeds 61..64: crosses the bucket
    # A chunk queued ahead counts: 50 + 10 generated + 5 pending - 1 = 64 fed first.
    assert window(_request(50, 10, 5, 100)) == 96
    assert window(_request(50, 6, 5, 100)) == 64
    # Never past prompt + max_new: the device budget stops the slot there.
    assert window(_request(62, 0, 1, 2)) == 64
    # The longest live slot decides; the cap is max_seq_len.
    assert window(_request(3, 0, 1, 10), _request(100, 0, 1, 40)) == 128
    assert window(_request(3, 0, 1, 10), _request(150, 0, 1, 40)) == 192
    assert window(_request(3, 0, 1, 10), _request(190, 0, 1, 40)) == 256
    assert window(_request(250, 0, 1, 6)) == 256
    assert chunk_window({}, cfg) == 64
    assert bucket(65, cfg.window_buckets()) == 96 and bucket(256, cfg.window_buckets()) == 256


def test_cache_chunks_cut_at_the_windows_and_every_key_span():
    assert cache_chunks(576, window_buckets(576)) == (64, 32, 32, 64, 64, 128, 128, 64)
    assert cache_chunks(576, [576]) == (512, 64)  # decode_window full: the key span only
    assert cache_chunks(1200, [64, 700, 1200, 5000]) == (64, 448, 188, 324, 176)
    assert cache_chunks(40) == (40,)
    with pytest.raises(ValueError, match="sum to 32"):
        init_cache(tiny_model().cfg, 1, 32, chunks=(16, 8))


async def test_the_engine_stores_its_dense_cache_in_pieces(make_engine):
    engine = make_engine(tiny_model(seed=3), EngineConfig(**BASE))
    k, v = engine._scheduler.cache[0]
    assert [x.shape[2] for x in k] == [64, 32, 32, 64, 64] == [x.shape[2] for x in v]
    full = make_engine(tiny_model(seed=3), EngineConfig(**BASE, decode_window="full"))
    assert [x.shape[2] for x in full._scheduler.cache[0][0]] == [256]


# ------------------------------------------------------------ the model
@pytest.mark.parametrize("attention", ["einsum", "dot_product"], ids=["einsum", "dot"])
@pytest.mark.parametrize("layout", ["dense", "chunked", "paged"], ids=["dense", "chunked", "paged"])
def test_a_window_reads_the_same_logits_as_the_whole_cache(attention, layout):
    """One decode step through the model with a window equals one over the whole cache,
    and writes the same cache (a write is never limited by the window)."""
    model = tiny_model(seed=3, attention=attention)
    cfg = model.cfg
    rng = np.random.default_rng(0)
    b, length, bs = 3, 64, 8
    if layout != "paged":
        chunks = cache_chunks(length, [8, 16, 24, 32, 48]) if layout == "chunked" else None
        cache = init_cache(cfg, b, length, chunks)
        tables = None
    else:
        cache = init_cache(cfg, b * length // bs, bs)
        tables = jnp.asarray(rng.permutation(b * length // bs).reshape(b, -1), jnp.int32)
    cache = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), cache)
    tokens = jnp.asarray([[5], [9], [11]], jnp.int32)
    positions = jnp.asarray([[3], [20], [31]], jnp.int32)
    step = jax.jit(
        lambda c, window: model(tokens, positions, c, tables=tables, window=window),
        static_argnums=1,
    )
    full, full_cache = step(cache, None)
    got, got_cache = step(cache, 32)
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    for a, c in zip(jax.tree.leaves(got_cache), jax.tree.leaves(full_cache), strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)  # layer 2's input: layer 1's
    # Garbage past the window changes nothing (it is not read); inside it, it would.
    assert not np.allclose(step(cache, 8)[0], full, rtol=1e-3, atol=1e-3)


def _split(cache, chunks):
    """An unchunked cache's arrays cut into ``chunks`` along the position axis."""
    cuts = np.cumsum(chunks)[:-1]
    return jax.tree.map(lambda x: tuple(jnp.split(x, cuts, axis=2)), cache)


def _join(cache):
    return [jnp.concatenate(side, axis=2) for layer in cache for side in layer]


@pytest.mark.parametrize("attention", ["einsum", "dot_product"], ids=["einsum", "dot"])
def test_a_chunked_cache_prefills_copies_and_decodes_as_one_array(attention):
    """Prefill into chosen rows (a shared prefix copied first), then a decode step: the
    chunked cache gives the same logits and holds the same values as the one-array cache."""
    from tunix_agentic.inference.device_step import copy_prefixes

    model = tiny_model(seed=3, attention=attention)
    rng = np.random.default_rng(2)
    slots, length, chunks = 4, 48, (8, 8, 16, 16)
    whole = jax.tree.map(
        lambda x: jnp.asarray(rng.normal(size=x.shape), x.dtype), init_cache(model.cfg, slots, 48)
    )
    pieces = _split(whole, chunks)
    # Slot 2 takes slot 0's first 20 positions (crossing two pieces), slot 3 none.
    batch = SimpleNamespace(  # what copy_prefixes reads of a PrefillBatch
        copy_from=jnp.asarray([0, 0]), copy_len=jnp.asarray([20, 0]), slots=jnp.asarray([2, 3])
    )
    whole, pieces = copy_prefixes(whole, batch), copy_prefixes(pieces, batch)
    np.testing.assert_array_equal(_join(pieces)[0], whole[0][0])
    np.testing.assert_array_equal(whole[0][0][2, :, :20], whole[0][0][0, :, :20])
    tokens = jnp.asarray(rng.integers(1, 128, (2, 12)), jnp.int32)
    positions = jnp.asarray([np.arange(20, 32), np.arange(0, 12)], jnp.int32)
    rows = jnp.asarray([2, 3], jnp.int32)
    want, whole = model(tokens, positions, whole, rows)
    got, pieces = model(tokens, positions, pieces, rows)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The written K/V come from the same matmuls but XLA may fuse them differently for the
    # two cache shapes: float32 rounding (3e-6 relative seen on one CPU), not a misplaced row.
    for a, b in zip(_join(pieces), [x for layer in whole for x in layer], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    step = jnp.asarray([[5], [6], [7], [8]], jnp.int32), jnp.asarray([[3], [47], [32], [12]])
    want, _ = model(*step, whole)
    for window in (None, 40):  # 40: read pieces up to 48, the rest masked
        got, _ = model(*step, pieces, window=window)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert length == sum(chunks)


@pytest.mark.parametrize("cached", [True, False], ids=["cache", "training"])
def test_keys_contracted_in_pieces_give_the_same_logits(monkeypatch, cached):
    """The einsum path splits a long key axis (transformer.KEY_SPAN): same logits."""
    from tunix_agentic.models import transformer

    model = tiny_model(seed=3)
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(1, 128, (2, 40)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(40), (2, 40))
    cache = init_cache(model.cfg, 2, 48) if cached else None
    want = model(tokens, positions, cache)[0]
    monkeypatch.setattr(transformer, "KEY_SPAN", 16)  # 48 keys: 3 pieces; 40: 16 + 16 + 8
    assert transformer._key_spans(40) == [(0, 16), (16, 32), (32, 40)]
    got = model(tokens, positions, cache)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------ the engine
def _mix() -> list[tuple[list[int], SamplingParams]]:
    """Slots of very different lengths together, and sequences crossing bucket edges
    mid-generation (58 + 20 crosses 64; 90 + 12 crosses 96; 185 + 15 crosses 192, paged)."""
    rng = np.random.default_rng(5)
    return [
        (
            rng.integers(1, 128, n).tolist(),
            SamplingParams(temperature=t, max_new_tokens=new, seed=seed),
        )
        for n, new, t, seed in (
            (5, 12, 0.0, None),
            (58, 20, 0.0, None),
            (185, 15, 1.0, 1),
            (90, 12, 1.0, 2),
        )
    ]


async def _serve(engine, mix):
    together = await asyncio.gather(*(engine.generate(p, s) for p, s in mix))
    alone = [await engine.generate(p, s) for p, s in mix[1:3]]  # a crossing one alone
    return together + alone


# Each layout once and each attention once (the model-level test above runs all four).
@pytest.mark.parametrize(
    "layout,attention", [("dense", "einsum"), ("paged", "dot_product")], ids=["dense", "paged"]
)
async def test_bucketed_windows_give_the_full_windows_outputs(make_engine, layout, attention):
    """Greedy and seeded sampled outputs, token ids and logprobs, equal the full window's."""
    model = tiny_model(seed=3, attention=attention)
    mix = _mix()
    base = dict(BASE, **LAYOUTS[layout], min_prefill_len=64)
    full = make_engine(model, EngineConfig(**base, decode_window="full"))
    windowed = make_engine(model, EngineConfig(**base))
    want = await _serve(full, mix)
    got = await _serve(windowed, mix)
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-5, atol=1e-6)
    assert [len(o.token_ids) for o in got] == [12, 20, 15, 12, 20, 15]
    # The full engine compiled one decode shape; the windowed one read smaller windows.
    assert full.compiles["decode"] == 1
    assert 2 <= windowed.compiles["decode"] <= len(windowed.config.window_buckets())


async def test_warmup_compiles_every_window_and_serving_compiles_nothing(make_engine):
    cfg = EngineConfig(max_slots=1, max_seq_len=128, decode_steps=4, min_prefill_len=64)
    engine = make_engine(tiny_model(seed=3), cfg)
    out = await asyncio.to_thread(engine.warmup)
    assert cfg.window_buckets() == [64, 96, 128]
    assert engine.compiles == {"prefill": 2, "decode": 3}
    assert out["shapes"] == 5
    for prompt, new in ((5, 70), (100, 20)):  # crosses 64; then 128
        await engine.generate([3] * prompt, SamplingParams(temperature=0.0, max_new_tokens=new))
    assert engine.compiles == {"prefill": 2, "decode": 3}


def test_the_config_file_takes_decode_window():
    from tunix_agentic.config import ConfigError, load_config

    assert load_config(overrides=["engine.decode_window=full"]).engine.decode_window == "full"
    with pytest.raises((ConfigError, ValueError), match="decode_window"):
        load_config(overrides=["engine.decode_window=sometimes"])


def test_engine_config_is_still_a_frozen_dataclass():
    cfg = EngineConfig(**BASE)
    assert dataclasses.replace(cfg, decode_window="full").window_buckets() == [256]
