"""Shared prompt prefixes: KV reused across requests (slot table, engine, HTTP meta_info)."""

import asyncio

import aiohttp
import pytest
from flax import nnx

from tunix_agentic.inference import EngineConfig, SamplingParams
from tunix_agentic.inference.slots import Grant, Parked, SlotTable, common_prefix
from tunix_agentic.serving import start_server
from tunix_agentic.testing import tiny_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=6)
SYSTEM = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38, 46, 26, 43, 38, 32, 79, 50, 28, 84, 19]
CONFIG = dict(max_slots=4, max_seq_len=64, decode_steps=4)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


# ------------------------------------------------------------ slot table
@pytest.mark.parametrize(
    "a, b, n",
    [
        ([], [1], 0),
        ([1, 2, 3], [1, 2, 3], 3),
        ([1, 2, 3], [1, 2], 2),
        ([1, 2, 3], [1, 5, 3], 1),
        ([4], [1], 0),
        (list(range(100)) + [7], list(range(100)) + [8], 100),
    ],
    ids=["empty", "equal", "shorter", "middle", "first", "long"],
)
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n == common_prefix(b, a)


def test_grant_copies_the_longest_held_prefix_in_a_later_wave():
    table = SlotTable(4, prefix_cache=True)
    table.new_round()
    first = table.grant(None, SYSTEM + [1, 2])
    assert first == Grant(first.slot, 0, first.slot, wave=0)
    # Same round: the source is written by the first request's prefill, so this copies after it.
    second = table.grant(None, SYSTEM + [1, 2])
    assert second.copies and second.source == first.slot
    assert (second.cached, second.wave) == (len(SYSTEM) + 1, 1)
    table.new_round()
    third = table.grant(None, SYSTEM + [7])  # an older round's source: no ordering needed
    assert (third.cached, third.wave) == (len(SYSTEM), 0)


def test_a_copy_source_is_not_overwritten_in_its_round():
    table = SlotTable(2, prefix_cache=True)
    table.new_round()
    a = table.grant(None, SYSTEM)
    table.activate(a.slot, "a")
    table.release(a.slot)  # freed: its prompt's KV stays reusable
    table.new_round()
    b = table.grant(None, SYSTEM + [5])
    assert b.copies and b.source == a.slot and b.cached == len(SYSTEM)
    table.activate(b.slot, "b")
    assert table.grant(None, [9, 9]) is None  # the one free slot is read by b's copy
    table.new_round()
    assert table.grant(None, [9, 9]).slot == a.slot


def test_without_prefix_cache_only_a_session_extends_its_own_cache():
    table = SlotTable(2, prefix_cache=False)
    a = table.grant("s", SYSTEM)
    table.release(a.slot, Parked("s", SYSTEM, version=0))
    assert table.grant(None, SYSTEM + [5]).cached == 0
    assert table.grant("s", SYSTEM + [5]) == Grant(a.slot, len(SYSTEM), a.slot)


@pytest.mark.parametrize("new_version", [1, 0], ids=["new_version", "same_version"])
def test_a_weight_update_forgets_every_shared_prefix(new_version):
    table = SlotTable(2, prefix_cache=True)
    a = table.grant(None, SYSTEM, version=0)
    table.release(a.slot)
    table.drop_parked_except(new_version)  # new weights, even under the same version number
    assert table.grant(None, SYSTEM + [5], version=new_version).cached == 0


def test_a_cache_made_across_a_weight_update_serves_only_its_session():
    table = SlotTable(2, prefix_cache=True)
    a = table.grant("s", SYSTEM, version=0)
    table.activate(a.slot, "a")
    table.drop_parked_except(1)  # the update lands while the request runs
    table.release(a.slot, Parked("s", SYSTEM + [7], version=1))
    assert table.grant(None, SYSTEM + [5], version=1).cached == 0
    assert table.grant("s", SYSTEM + [7, 8], version=1).cached == len(SYSTEM) + 1


def test_an_evicted_parked_cache_still_serves_its_prefix():
    table = SlotTable(1, prefix_cache=True)
    a = table.grant("old", SYSTEM + [1])
    table.release(a.slot, Parked("old", SYSTEM + [1, 9], version=0))
    assert table.grant("new", SYSTEM + [2]) == Grant(a.slot, len(SYSTEM), a.slot)
    assert not table.parked


def test_prefix_cache_must_be_a_bool():
    with pytest.raises(ValueError, match="engine.prefix_cache must be true or false"):
        EngineConfig(prefix_cache="yes")


# ---------------------------------------------------------------- engine
@pytest.mark.slow  # two engines' compiles (~20 s on a quiet 2-core machine)
async def test_a_group_prefills_its_prompt_once_and_matches_no_reuse(model, make_engine):
    """G samples of one prompt and episodes sharing a system prompt: the same greedy tokens
    with and without the prefix cache, the prompt's KV computed once, cached_tokens reported
    on the wire as SGLang does."""
    prompts = [SYSTEM + [1, 2, 3]] * 4 + [SYSTEM + [4, 5], SYSTEM + [6]]
    outs, prefilled = {}, {}
    for on in (False, True):
        engine = make_engine(model, EngineConfig(prefix_cache=on, **CONFIG))
        runner, port = await start_server(engine)
        try:
            async with aiohttp.ClientSession() as http:
                body = {
                    "input_ids": prompts,
                    "sampling_params": {"temperature": 0.0, "max_new_tokens": 6},
                }
                async with http.post(f"http://127.0.0.1:{port}/generate", json=body) as resp:
                    assert resp.status == 200
                    answers = await resp.json()
        finally:
            await runner.cleanup()
        outs[on] = [a["output_ids"] for a in answers]
        cached = [a["meta_info"]["cached_tokens"] for a in answers]
        prefilled[on] = engine.stats["prefill_tokens"]
        if on:
            # Three of the group copy the first's prompt (all but its last token); the two
            # episodes start from the system prompt (4 slots: they come after the group).
            assert sorted(cached[:4]) == [0] + [len(prompts[0]) - 1] * 3
            assert cached[4:] == [len(SYSTEM)] * 2
            assert engine.stats["cached_tokens"] == sum(cached)
        else:
            assert cached == [0] * 6
    assert outs[True] == outs[False]
    assert prefilled[False] == sum(map(len, prompts))
    assert prefilled[True] == prefilled[False] - engine.stats["cached_tokens"]


async def test_a_weight_update_stops_reuse_of_kv_from_old_weights(model, make_engine):
    engine = make_engine(model, EngineConfig(**CONFIG))
    prompt = SYSTEM + [1, 2]
    await engine.generate(prompt, GREEDY)
    again = await engine.generate(prompt, GREEDY)
    assert again.cached_tokens == len(prompt) - 1  # same weights: reused
    await engine.update_weights(nnx.state(tiny_model(seed=4), nnx.Param), version=1)
    fresh = await engine.generate(prompt, GREEDY)
    assert fresh.cached_tokens == 0 and fresh.versions == [1] * 6
    reused = await engine.generate(prompt, GREEDY)  # now from the new weights' KV
    assert reused.cached_tokens == len(prompt) - 1
    assert reused.token_ids == fresh.token_ids
    # A sampled group sharing the prompt: each sample still draws its own tokens.
    sampled = [SamplingParams(temperature=1.0, max_new_tokens=8, seed=s) for s in range(4)]
    outs = await asyncio.gather(*(engine.generate(prompt, sp) for sp in sampled))
    assert all(o.cached_tokens == len(prompt) - 1 for o in outs)
    assert len({tuple(o.token_ids) for o in outs}) > 1  # not one sample copied four times


# ----------------------------------------------------------- void decode
@pytest.mark.parametrize("end", ["stop_token", "max_tokens"], ids=["stop_token", "max_tokens"])
async def test_the_device_stops_decoding_when_every_request_has_ended(model, end, make_engine):
    """A request that ends mid-chunk stops its slot on device, and a chunk queued ahead
    whose requests all ended runs no step: no decode step is spent past the end."""
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=64, decode_steps=8))
    free = await engine.generate([5, 6, 7], SamplingParams(temperature=0.0, max_new_tokens=12))
    base = engine.stats["decode_steps"]
    assert base == 11 and engine.stats["void_decode_steps"] == 0  # 1 token from the prefill
    if end == "stop_token":
        stop = free.token_ids[3]
        n = free.token_ids.index(stop) + 1
        sampling = SamplingParams(temperature=0.0, max_new_tokens=12, stop_token_ids=(stop,))
    else:
        n = 3
        sampling = SamplingParams(temperature=0.0, max_new_tokens=n)
    out = await engine.generate([5, 6, 7], sampling)
    assert out.token_ids == free.token_ids[:n]
    assert engine.stats["decode_steps"] - base == n - 1
    assert engine.stats["void_decode_steps"] == 0
