import asyncio
import functools
import time

import jax
import jax.numpy as jnp
import pytest

from tunix_agentic.inference import (
    EngineConfig,
    EngineError,
    JaxEngine,
    PromptTooLongError,
    SamplingParams,
)
from tunix_agentic.testing import tiny_model

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=9)


@pytest.fixture(scope="module")
def model():
    return tiny_model(seed=3)


@functools.cache
def _full_forward(model):
    # Right padding never changes earlier positions, so one padded shape serves all.
    return jax.jit(lambda ids: model(ids, jnp.arange(ids.shape[1])[None])[0])


def greedy_reference(model, prompt, n, width=96):
    """One sequence at a time, full forward (no cache) per token: the obviously right way."""
    forward = _full_forward(model)
    ids = list(prompt)
    for _ in range(n):
        logits = forward(jnp.array([ids + [0] * (width - len(ids))]))
        ids.append(int(jnp.argmax(logits[0, len(ids) - 1])))
    return ids[len(prompt) :]


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
async def test_concurrent_requests_are_batched_and_exact(model, overlap, make_engine):
    engine = make_engine(
        model, EngineConfig(max_slots=4, max_seq_len=48, decode_steps=4, overlap=overlap)
    )
    prompts = [[5, 6, 7], [9] * 17, [11, 12], [20, 21, 22, 23, 24], [30], [31, 32, 33]]
    outs = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.token_ids == greedy_reference(model, prompt, 9)
        assert out.finish_reason == "length"
        assert len(out.logprobs) == 9 and all(lp <= 0 for lp in out.logprobs)
        assert out.prompt_tokens == len(prompt)
    # 6 requests on 4 slots: fewer decode chunks than serving them one at a time would take.
    assert engine.stats["decode_chunks"] < 6 * 9 / 4


async def test_new_prompt_lengths_do_not_recompile(model, make_engine):
    engine = make_engine(
        model, EngineConfig(max_slots=4, max_seq_len=64, decode_steps=4, min_prefill_len=16)
    )
    for n in range(1, 16):  # every length falls into the first length bucket
        await engine.generate(list(range(1, n + 1)), GREEDY)
    assert engine.compiles == {"prefill": 1, "decode": 1}
    # Next length bucket (no prefix in common with those above): one more prefill shape.
    await engine.generate(list(range(19, 0, -1)), GREEDY)
    assert engine.compiles == {"prefill": 2, "decode": 1}


async def test_stop_token_ends_generation_and_is_kept(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=48))
    free = await engine.generate([4, 5, 6], GREEDY)
    stop = free.token_ids[3]
    out = await engine.generate(
        [4, 5, 6], SamplingParams(temperature=0.0, max_new_tokens=9, stop_token_ids=(stop,))
    )
    first = free.token_ids.index(stop)
    assert out.token_ids == free.token_ids[: first + 1]
    assert out.finish_reason == "stop" and out.matched_stop == stop


async def test_seeded_sampling_is_reproducible_whatever_is_batched_beside_it(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=4, max_seq_len=48))
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    alone = await engine.generate([1, 2, 3], sp)
    crowd = await asyncio.gather(
        engine.generate([1, 2, 3], sp),
        *(engine.generate([9, 9, i], SamplingParams(max_new_tokens=12, seed=i)) for i in range(3)),
    )
    assert crowd[0].token_ids == alone.token_ids
    other = await engine.generate(
        [1, 2, 3], SamplingParams(temperature=1.0, max_new_tokens=12, seed=8)
    )
    assert other.token_ids != alone.token_ids


async def test_session_reuse_prefills_only_new_tokens(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=64))
    first = await engine.generate([1, 2, 3, 4], GREEDY, session_id="ep")
    second_prompt = [1, 2, 3, 4] + first.token_ids + [40, 41]
    before = engine.stats["prefill_tokens"]
    second = await engine.generate(second_prompt, GREEDY, session_id="ep")
    assert second.cached_tokens == 4 + len(first.token_ids) - 1
    assert engine.stats["prefill_tokens"] - before == len(second_prompt) - second.cached_tokens
    assert second.token_ids == greedy_reference(model, second_prompt, 9)


async def test_update_weights_mid_flight_tags_versions_without_draining(model, make_engine):
    other = tiny_model(seed=11)
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=96, decode_steps=2))
    from flax import nnx

    new_params = nnx.state(other, nnx.Param)
    task = asyncio.create_task(
        engine.generate([1, 2, 3], SamplingParams(temperature=0.0, max_new_tokens=40))
    )
    while engine.stats["generated_tokens"] < 4:
        await asyncio.sleep(0.001)
    engine.update_weights(new_params, version=1)
    out = await task
    assert out.versions[0] == 0 and out.versions[-1] == 1
    assert out.versions == sorted(out.versions)
    assert len(out.token_ids) == 40  # the request was not dropped or restarted
    assert engine.version == 1


async def test_update_weights_rejects_a_different_tree(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=1, max_seq_len=32))
    from flax import nnx

    with pytest.raises(ValueError, match="does not match"):
        engine.update_weights(nnx.state(tiny_model(d_model=48), nnx.Param), version=1)


async def test_cancelling_a_caller_aborts_and_frees_its_slot(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=1, max_seq_len=200, decode_steps=2))
    long = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=190)))
    while engine.stats["generated_tokens"] < 2:
        await asyncio.sleep(0.001)
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    out = await asyncio.wait_for(engine.generate([3, 4], GREEDY), timeout=60)
    assert len(out.token_ids) == 9
    assert engine.health()["active"] == 0


async def test_bad_requests_get_clear_errors(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=1, max_seq_len=16))
    with pytest.raises(PromptTooLongError):
        await engine.generate(list(range(1, 17)), GREEDY)
    with pytest.raises(ValueError, match="empty"):
        await engine.generate([], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        await engine.generate([1, 999], GREEDY)
    out = await engine.generate(
        list(range(1, 12)), SamplingParams(temperature=0.0, max_new_tokens=50)
    )
    assert len(out.token_ids) == 16 - 11 and out.finish_reason == "length"  # clipped to the window


@pytest.mark.parametrize(
    "kwargs",
    [dict(temperature=-1.0), dict(top_p=0.0), dict(top_k=-1), dict(max_new_tokens=0)],
    ids=["temperature", "top_p", "top_k", "max_new_tokens"],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)


async def test_every_second_is_busy_waiting_for_the_host_or_idle(model, make_engine):
    engine = make_engine(model, EngineConfig(max_slots=4, max_seq_len=48, decode_steps=4))
    await engine.generate([5, 6, 7], GREEDY)  # compiles: the clock starts after this
    before = engine.clock()
    t0 = time.perf_counter()
    await asyncio.sleep(0.3)  # nothing to do
    await asyncio.gather(*(engine.generate([i, i + 1], GREEDY) for i in range(1, 7)))
    wall = time.perf_counter() - t0
    after = engine.clock()
    busy, gap, idle = (after[k] - before[k] for k in ("busy_s", "sched_gap_s", "idle_s"))
    assert idle >= 0.3 and busy > 0 and gap > 0
    # The three buckets cover the wall clock (up to the moments around the two calls above).
    assert abs((busy + gap + idle) - wall) < 0.05 * wall + 0.02
    # The 6 requests end together (length), so no chunk was queued past them: none is void.
    assert engine.stats["void_chunks"] == 0
    await asyncio.sleep(0.1)  # an idle period under way counts before it ends
    assert engine.clock()["idle_s"] >= after["idle_s"] + 0.1


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "lockstep"])
async def test_slots_reused_under_a_chunk_queued_ahead_stay_exact(model, overlap, make_engine):
    """The next chunk is queued before the host sees a request end: its writes into that
    slot (parked for the session, or handed to the next request) must never leak."""
    engine = make_engine(
        model, EngineConfig(max_slots=1, max_seq_len=64, decode_steps=4, overlap=overlap)
    )
    a_prompt, b_prompt = [7, 8, 9], [40, 41]
    a_free = greedy_reference(model, a_prompt, 9)
    stop = a_free[1]  # A ends after two tokens, mid-chunk
    a_sampling = SamplingParams(temperature=0.0, max_new_tokens=9, stop_token_ids=(stop,))
    a, b = await asyncio.gather(
        engine.generate(a_prompt, a_sampling, session_id="a"), engine.generate(b_prompt, GREEDY)
    )
    assert a.token_ids == a_free[: a_free.index(stop) + 1]
    assert b.token_ids == greedy_reference(model, b_prompt, 9)  # B took A's slot at once
    if overlap:  # a chunk was queued for A before its stop token was seen: nothing used it
        assert engine.stats["void_chunks"] >= 1
    else:
        assert engine.stats["void_chunks"] == 0
    # The session's next turn reuses a parked cache that a queued-ahead chunk wrote past.
    c = await engine.generate(a_prompt, a_sampling, session_id="c")
    turn2 = a_prompt + c.token_ids + [50, 51, 52]
    d = await engine.generate(turn2, GREEDY, session_id="c")
    assert d.cached_tokens > 0
    assert d.token_ids == greedy_reference(model, turn2, 9)


async def test_decoding_goes_on_while_the_callers_loop_is_busy(model, make_engine):
    """The scheduler has its own thread: agent code hogging the event loop (here a
    busy-wait, pure Python) does not stop the engine from decoding."""
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=200, decode_steps=2))
    task = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=150)))
    while engine.stats["generated_tokens"] < 2:
        await asyncio.sleep(0.001)
    before = engine.stats["generated_tokens"]
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:  # the loop runs nothing else meanwhile
        pass
    assert engine.stats["generated_tokens"] > before + 2
    out = await task
    assert len(out.token_ids) == 150


def test_one_engine_serves_successive_event_loops_and_can_be_collected(model, monkeypatch):
    import gc
    import weakref

    from tunix_agentic.inference import scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "IDLE_EXIT_S", 0.05)
    engine = JaxEngine(model, EngineConfig(max_slots=2, max_seq_len=48, decode_steps=4))
    first = asyncio.run(engine.generate([5, 6, 7], GREEDY))
    time.sleep(0.3)  # the scheduler thread ends when idle; the next request starts another
    assert not engine._scheduler.running
    second = asyncio.run(engine.generate([5, 6, 7], GREEDY))
    assert first.token_ids == second.token_ids == greedy_reference(model, [5, 6, 7], 9)
    time.sleep(0.3)
    ref = weakref.ref(engine)
    del engine
    gc.collect()
    assert ref() is None  # no thread keeps an engine no one closed alive


async def test_close_aborts_what_is_in_flight(model):
    engine = JaxEngine(model, EngineConfig(max_slots=2, max_seq_len=200, decode_steps=2))
    tasks = [
        asyncio.create_task(engine.generate([i, i + 1], SamplingParams(max_new_tokens=190)))
        for i in range(1, 5)  # 2 decoding, 2 queued
    ]
    while engine.stats["generated_tokens"] < 4:
        await asyncio.sleep(0.001)
    await engine.close()
    outs = await asyncio.gather(*tasks)
    assert [o.finish_reason for o in outs] == ["abort"] * 4
    assert any(o.token_ids for o in outs)  # what was generated comes back
    assert engine.in_flight == 0
    with pytest.raises(EngineError, match="closed"):
        await engine.generate([1, 2], GREEDY)


async def test_a_failed_device_call_fails_every_open_request(model, make_engine):
    """Fault injection (a device cannot be made to fail on demand here): the decode call
    raises. Every caller gets an EngineError, none hangs, and the engine reports it."""
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=64, decode_steps=2))
    await engine.generate([1, 2], GREEDY)  # compiled and working

    def lost(*args, **kwargs):
        raise RuntimeError("device lost")

    engine._scheduler.decode_fn = lost
    outs = await asyncio.wait_for(
        asyncio.gather(
            *(engine.generate([i], GREEDY) for i in range(1, 4)), return_exceptions=True
        ),
        timeout=60,
    )
    assert all(isinstance(o, EngineError) and "device lost" in str(o) for o in outs)
    health = engine.health()
    assert health["ok"] is False and "device lost" in health["error"]
    with pytest.raises(EngineError, match="device lost"):
        await engine.generate([1, 2], GREEDY)
    assert engine.in_flight == 0
    from flax import nnx

    with pytest.raises(EngineError, match="device lost"):  # no weights will ever be applied
        await engine.update_weights(nnx.state(model, nnx.Param), version=1)


async def test_update_weights_resolves_when_applied_superseded_or_never(model, make_engine):
    from flax import nnx

    params = nnx.state(model, nnx.Param)
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=64, decode_steps=2))
    first = engine.update_weights(params, version=1)
    second = engine.update_weights(params, version=2)  # may replace the first before it lands
    assert await asyncio.wait_for(second, 30) == 2 and await asyncio.wait_for(first, 30) == 1
    assert engine.version == 2 and engine.pending_version is None
    # While a request decodes, the update lands at a chunk boundary and the request goes on.
    task = asyncio.create_task(engine.generate([1, 2], SamplingParams(max_new_tokens=40)))
    while engine.in_flight == 0 or engine.stats["decode_chunks"] == 0:
        await asyncio.sleep(0.001)
    assert await asyncio.wait_for(engine.update_weights(params, version=3), 30) == 3
    out = await task
    assert out.versions[-1] == 3 and out.finish_reason == "length"
    # From plain threads, result() blocks until applied.
    assert await asyncio.to_thread(lambda: engine.update_weights(params, 4).result(30)) == 4
    await engine.close()
    late = engine.update_weights(params, version=5)
    with pytest.raises(EngineError, match="closed"):
        await late
    assert engine.pending_version == 5  # handed over, never applied


async def test_update_weights_names_the_mismatched_array(model, make_engine):
    from flax import nnx

    engine = make_engine(model, EngineConfig(max_slots=1, max_seq_len=32))
    params = nnx.state(model, nnx.Param)
    wrong = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    with pytest.raises(ValueError, match="bfloat16"):
        engine.update_weights(wrong, version=1)
    assert engine.pending_version is None


async def test_warmup_compiles_every_shape_ahead_of_the_requests(model, make_engine):
    """After warmup() (run on another thread, as the trainer does beside SFT), requests
    of every prefill shape and the decode chunk start without any XLA compile."""
    cfg = EngineConfig(max_slots=4, max_seq_len=48, decode_steps=4, min_prefill_len=16)
    engine = make_engine(model, cfg)
    out = await asyncio.to_thread(engine.warmup)
    assert out["shapes"] == len(cfg.length_buckets()) * len(cfg.row_buckets()) + 1
    compiled: list[str] = []

    def listener(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)

    served = []
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for length in (3, 20, 40):  # one per length bucket (16, 32, 48)
            for rows in cfg.row_buckets():
                prompts = [[(length + r + i) % 60 + 1 for i in range(length)] for r in range(rows)]
                outs = await asyncio.gather(*(engine.generate(p, GREEDY) for p in prompts))
                served.append((prompts[-1], outs[-1]))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiled == []
    assert engine.stats["prefill_calls"] >= len(served) and engine.stats["decode_chunks"] > 0
    for prompt, out in served:  # the warmed-up executables compute what they should
        assert out.token_ids == greedy_reference(model, prompt, len(out.token_ids))


async def test_a_warmed_engine_compiles_nothing_whatever_the_requests(model, make_engine):
    """``EngineConfig(warmup=True)`` warms the engine as it is built (in the background);
    once warm, repeated calls, prefix-cache hits, session continuations, a decode that
    crosses window buckets, and sampled requests beside greedy ones compile nothing."""
    cfg = EngineConfig(
        max_slots=2, max_seq_len=128, decode_steps=4, min_prefill_len=32, warmup=True
    )
    engine = make_engine(model, cfg)
    warmed = await asyncio.to_thread(engine.start_warmup().result)  # the one begun at build
    assert warmed["shapes"] == 3 * 2 + len(cfg.window_buckets())
    counted = dict(engine.compiles)
    compiled: list[str] = []

    def listener(event, seconds, **kwargs):
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(event)

    prompt = [(7 * i) % 60 + 1 for i in range(40)]
    sampled = SamplingParams(temperature=1.0, top_k=5, top_p=0.9, max_new_tokens=9, seed=3)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        for _ in range(2):  # the same shapes again, then the same prompts (prefix hits)
            await asyncio.gather(engine.generate(prompt, GREEDY), engine.generate(prompt, sampled))
        assert engine.stats["cached_tokens"] > 0
        first = await engine.generate(prompt[:20], GREEDY, session_id="s")
        turn = [*prompt[:20], *first.token_ids, 5, 6, 7]
        again = await engine.generate(turn, GREEDY, session_id="s")  # a session continues
        long = await engine.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=60))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert again.cached_tokens >= 20 and len(long.token_ids) == 60  # 40 -> 100: windows 64, 96, 128
    assert compiled == [] and dict(engine.compiles) == counted
    assert long.token_ids == greedy_reference(model, prompt, 60, width=128)


async def test_the_engine_keeps_its_own_copy_of_the_parameters(make_engine):
    """A donating train step on the model the engine was built from deletes the model's
    buffers; the engine must still generate (device_put to the same place does not copy)."""
    import numpy as np
    from flax import nnx

    from tunix_agentic.learners.batching import GRPOBatch
    from tunix_agentic.learners.grpo import GRPOLearner

    model = tiny_model(seed=4)
    engine = make_engine(model, EngineConfig(max_slots=2, max_seq_len=48, decode_steps=4))
    want = await engine.generate([5, 6, 7], GREEDY)
    model_arrays = jax.tree.leaves(nnx.state(model, nnx.Param))
    learner = GRPOLearner(model)  # shares the model's buffers, and donates them
    ids = np.asarray([[5, 6, 7, 8, 9, 10, 11, 12]] * 2, np.int32)
    mask = np.zeros(ids.shape, np.float32)
    mask[:, 4:] = 1
    learner.train_step(
        GRPOBatch.build(
            input_ids=ids,
            loss_mask=mask,
            old_logprobs=np.zeros(ids.shape, np.float32),
            advantages=np.asarray([1.0, -1.0], np.float32),
        )
    )
    assert all(x.is_deleted() for x in model_arrays)  # the step did donate them
    again = await engine.generate([5, 6, 7], GREEDY)
    assert again.token_ids == want.token_ids
