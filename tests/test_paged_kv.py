"""The paged KV layout: block allocator and tables, and the engine's outputs against dense."""

import asyncio

import jax.numpy as jnp
import numpy as np
import pytest

from tunix_agentic.inference import EngineConfig, SamplingParams
from tunix_agentic.inference.paged import BlockCopy, PagedKV, keeps_kv
from tunix_agentic.models.transformer import init_cache
from tunix_agentic.testing import tiny_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=7)
SYSTEM = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19, 71]
DENSE = dict(max_slots=4, max_seq_len=64, decode_steps=4)
PAGED = dict(DENSE, kv_layout="paged", kv_block_size=8)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


# ------------------------------------------------------------ host side
def test_shared_prefix_shares_full_blocks_and_copies_the_partial_one():
    kv = PagedKV(num_slots=3, max_seq_len=32, block_size=4, num_blocks=12)
    assert kv.assign(0, 0, 0, prompt_len=10, total=14) is None  # 3 blocks now, 1 promised
    a = kv.held(0)
    assert len(a) == 3 and kv.reserved[0] == 1 and kv.available == 12 - 3 - 1
    copy = kv.assign(1, 0, cached=9, prompt_len=12, total=12)  # 2 full blocks + 1 of 4
    b = kv.held(1)
    assert b[:2] == a[:2] and copy == BlockCopy(a[2], b[2]) and len(b) == 3
    assert list(kv.blocks.refs[a[:2]]) == [2, 2]
    kv.grow(0, 14)
    assert len(kv.held(0)) == 4 and kv.reserved[0] == 0
    with pytest.raises(RuntimeError, match="reservation"):
        kv.grow(0, 17)
    kv.release(0)
    assert list(kv.blocks.refs[a[:2]]) == [1, 1]  # still b's
    kv.release(1)
    assert kv.blocks.used == 0 and not kv.blocks.refs.any() and kv.available == 12
    assert (kv.tables == 12).all()


def test_own_partial_block_is_written_in_place_unless_shared():
    kv = PagedKV(num_slots=2, max_seq_len=16, block_size=4, num_blocks=8)
    kv.assign(0, 0, 0, prompt_len=6, total=6)
    own = kv.held(0)
    # The session's next turn extends its 6 cached tokens: nothing copied, nothing freed.
    assert kv.assign(0, 0, cached=6, prompt_len=9, total=12) is None
    assert kv.held(0)[:2] == own and kv.blocks.used == 3
    kv.assign(1, 0, cached=4, prompt_len=5, total=5)  # shares block own[0]
    kv.trim(0, 5)  # parked with 5 tokens: keeps 2 blocks
    # Slot 0 diverges after 2 tokens: its first block is shared with slot 1, so it is copied.
    copy = kv.assign(0, 0, cached=2, prompt_len=3, total=3)
    assert copy is not None and copy.src == own[0] and kv.held(0) == [copy.dst]
    kv.release(0)
    kv.release(1)
    assert kv.blocks.used == 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(kv_layout="ring"), "kv_layout"),
        (dict(kv_block_size=12), "power of two"),
        (dict(kv_block_size=0), "power of two"),
        (dict(kv_layout="paged", kv_block_size=128), "multiple of engine.kv_block_size"),
        (dict(kv_layout="paged", kv_block_size=8, kv_blocks=7), "one max_seq_len sequence"),
        (dict(kv_blocks=-1), "kv_blocks"),
    ],
    ids=["layout", "not_pow2", "zero", "not_multiple", "pool_too_small", "negative"],
)
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**{**DENSE, **overrides})


def test_default_pool_is_half_of_dense():
    cfg = EngineConfig(**PAGED)
    assert cfg.num_kv_blocks * cfg.kv_block_size == cfg.max_slots * cfg.max_seq_len // 2


# ------------------------------------------------------------- engine
def _mix():
    """Different lengths, a shared prefix (full blocks and a partial one), a repeat, and
    sampled requests with their own seeds (the dense engine's are seed-deterministic)."""
    sampled = [SamplingParams(temperature=1.0, top_k=20, max_new_tokens=8, seed=s) for s in (1, 2)]
    return [
        (SYSTEM + [1, 2], sampled[0]),
        ([8, 8, 9], sampled[1]),
        ([5, 6, 7], GREEDY),
        (SYSTEM + [1, 2], GREEDY),
        (SYSTEM + [1, 2], GREEDY),
        (SYSTEM + [4], SamplingParams(temperature=0.0, max_new_tokens=12)),
        ([9] * 17, GREEDY),
        (SYSTEM[:9], GREEDY),
        ([30], SamplingParams(temperature=0.0, max_new_tokens=3)),
        (SYSTEM + [1, 2, 3, 4, 5, 6, 7, 8], GREEDY),
    ]


async def _run(engine, requests):
    return await asyncio.gather(*(engine.generate(p, s) for p, s in requests))


def _blocks_back(engine):
    """Every block not held by a cache the slot table keeps is free."""
    sched = engine._scheduler
    paged = sched.paged
    held = {b for slot in range(engine.config.max_slots) for b in paged.held(slot)}
    assert paged.blocks.used == len(held)
    assert not paged.reserved.any()
    for slot in range(engine.config.max_slots):
        if paged.count[slot]:
            assert keeps_kv(sched.slots, slot)


@pytest.mark.parametrize("prefix_cache", [True, False], ids=["prefix", "no_prefix"])
async def test_outputs_equal_dense(model, make_engine, prefix_cache):
    dense = make_engine(model, EngineConfig(**DENSE, prefix_cache=prefix_cache))
    paged = make_engine(model, EngineConfig(**PAGED, prefix_cache=prefix_cache))
    want = await _run(dense, _mix())
    got = await _run(paged, _mix())
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-5, atol=1e-6)
    if prefix_cache:  # prefixes were shared, and in the same places
        assert [g.cached_tokens for g in got] == [w.cached_tokens for w in want]
        assert paged.stats["cached_tokens"] > 0
    _blocks_back(paged)
    stats = paged.stats
    assert stats["kv_blocks_total"] == 16 and stats["kv_tokens_reserved"] == 128
    assert 0 < stats["kv_blocks_peak"] <= 16
    if not prefix_cache:  # nothing stays cached once every request ended: every block free
        assert stats["kv_blocks_used"] == 0 == stats["kv_tokens_held"]
    else:  # free slots keep their prompts' blocks for later requests
        assert stats["kv_blocks_used"] > 0 and stats["kv_tokens_held"] > 0
    assert dense.stats["kv_tokens_reserved"] == 4 * 64
    # One decode compile for the whole mix, as dense.
    assert paged.compiles["decode"] == 1


async def test_a_small_pool_makes_admission_wait_and_gives_every_block_back(model, make_engine):
    """A pool of one max_seq_len sequence (8 blocks) for 4 slots: requests wait for blocks,
    every one is served, with the dense outputs, and the pool never runs over."""
    dense = make_engine(model, EngineConfig(**DENSE))
    small = make_engine(model, EngineConfig(**PAGED, kv_blocks=8))
    want = await _run(dense, _mix())
    got = await _run(small, _mix())
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert small.stats["kv_blocks_peak"] <= 8
    _blocks_back(small)
    # The longest request possible still fits alone.
    longest = SamplingParams(temperature=0.0, max_new_tokens=30)  # max_seq_len caps it: 24
    got = await small.generate([7] * 40, longest)
    assert got.token_ids == (await dense.generate([7] * 40, longest)).token_ids
    assert len(got.token_ids) == 24
    _blocks_back(small)


async def test_session_turns_reuse_kv_as_dense(model, make_engine):
    """Multi-turn sessions: each turn extends the last; one diverges. Same tokens and the
    same cached counts as dense (a pool as large as dense's: nothing is evicted for room),
    and parked sessions keep only their blocks."""

    async def sessions(engine):
        outs = []
        histories = {"a": SYSTEM + [1], "b": SYSTEM + [2], "c": [40, 41, 42]}
        for turn in range(3):
            batch = []
            for sid, ids in histories.items():
                batch.append(engine.generate(ids, GREEDY, session_id=sid))
            results = await asyncio.gather(*batch)
            for (sid, ids), out in zip(list(histories.items()), results, strict=True):
                histories[sid] = ids + out.token_ids + [turn + 50]
                outs.append((out.token_ids, out.cached_tokens))
            histories["c"] = histories["c"][:5] + [60 + turn]  # diverges from its cache
        return outs

    dense = make_engine(model, EngineConfig(**DENSE))
    paged = make_engine(model, EngineConfig(**PAGED, kv_blocks=32))
    assert await sessions(paged) == await sessions(dense)
    assert paged.stats["cached_tokens"] > 0
    _blocks_back(paged)


async def test_a_weight_update_frees_the_blocks_of_forgotten_caches(model, make_engine):
    engine = make_engine(model, EngineConfig(**PAGED))
    await _run(engine, _mix())
    await engine.generate(SYSTEM, GREEDY, session_id="s")
    assert engine.stats["kv_blocks_used"] > 0
    await engine.update_weights(engine.params, version=1)
    await engine.generate([1], SamplingParams(temperature=0.0, max_new_tokens=1))
    _blocks_back(engine)
    # Only the new request's prompt is cached (a free slot's prefix): one block.
    assert engine.stats["kv_blocks_used"] == 1 and engine.stats["kv_tokens_held"] == 1


async def test_warmup_compiles_every_paged_shape(model, make_engine):
    """warmup() compiles the paged prefill shapes and decode chunk the requests use: serving
    a mix afterwards compiles nothing more (one decode executable for any mix)."""
    cfg = EngineConfig(
        max_slots=2, max_seq_len=32, decode_steps=4, kv_layout="paged", kv_block_size=8
    )
    engine = make_engine(model, cfg)
    out = await asyncio.to_thread(engine.warmup)
    warmed = dict(engine.compiles)
    assert warmed == {"prefill": 4, "decode": 1} and out["shapes"] == 5
    short = SamplingParams(temperature=0.0, max_new_tokens=5)
    await _run(engine, [(p, short) for p in ([5, 6, 7], SYSTEM[:19], SYSTEM[:19] + [4], [9] * 20)])
    assert engine.compiles == warmed


def test_the_model_reads_and_writes_through_block_tables_as_dense(model):
    """Direct model check: two rows prefilled and decoded one step through scattered block
    tables (blocks out of order, an unallocated tail) give the dense cache's logits."""
    ids = jnp.array([SYSTEM[:12], [5, 6, 7, 8, 9, 10, 11, 12, 0, 0, 0, 0]], jnp.int32)
    lengths = jnp.array([12, 8])
    pos = jnp.where(jnp.arange(12)[None] < lengths[:, None], jnp.arange(12)[None], 32)
    tables = jnp.array([[7, 2, 9, 10], [0, 5, 10, 10]], jnp.int32)  # 10: no block
    dense, paged = init_cache(model.cfg, 2, 32), init_cache(model.cfg, 10, 8)
    want, dense = model(ids, pos, dense, jnp.arange(2), logits_at=lengths - 1)
    got, paged = model(ids, pos, paged, logits_at=lengths - 1, tables=tables)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    step = jnp.array([[3], [4]], jnp.int32)
    want, _ = model(step, lengths[:, None], dense)
    got, _ = model(step, lengths[:, None], paged, tables=tables)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
