"""Decode throughput of the JAX engine at the peers' fixed dims, printed, never asserted.

Same model and workload as profiling/peers/ (a 4.46M-parameter Qwen3-style
decoder, 32-token prompts, 64 new tokens, greedy, no early stop), so the
figures sit beside Tunix's sampler and HF ``generate`` measured on this
machine. Also: the same engine serving requests one at a time, the fraction
of this machine's measured f32 matmul peak, and prefill tokens of a 5-turn
episode with and without per-session KV reuse.

    python -m profiling.bench_engine            # ENGINE_BATCHES=1,16,64 ENGINE_REPEATS=5
    python -m profiling.bench_engine --floor [--models peers,50m,smollm2] [--json FILE]

``--floor``: ours beside the bare jitted loop over the same model and prompts, the ratio,
the roofline and the compiles in timed calls, for each model and batch
(:mod:`profiling.engine_floor`); ``--json`` writes one row per model and batch.

``ENGINE_DECODE_WINDOW`` sets ``engine.decode_window`` (``bucketed``, the default, or
``full``); ``ab`` measures both on one model for each batch, interleaved repeat by repeat
(bucketed, full, bucketed, ...), and prints their median ratio.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import jax
import numpy as np
from flax import nnx

from profiling.common import (
    DECODE_STEPS,
    PEER_DIMS,
    PEER_NEW,
    PEER_PROMPT,
    clean_call_times,
    matmul_peak_gflops,
)
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.models.transformer import Transformer, count_params

PROMPT, NEW = PEER_PROMPT, PEER_NEW
REPEATS = int(os.environ.get("ENGINE_REPEATS", 5))
BATCHES = [int(b) for b in os.environ.get("ENGINE_BATCHES", "1,16,64").split(",")]
# ENGINE_SAMPLING=top_p is the peers' sampled mode: temperature 1, top_p 1.0 (nothing cut).
SAMPLING_MODE = os.environ.get("ENGINE_SAMPLING", "greedy")
DECODE_WINDOW = os.environ.get("ENGINE_DECODE_WINDOW", "bucketed")
if DECODE_WINDOW not in ("bucketed", "full", "ab"):
    raise SystemExit(f"ENGINE_DECODE_WINDOW must be bucketed, full or ab, got {DECODE_WINDOW!r}")
if SAMPLING_MODE not in ("greedy", "top_p"):
    raise SystemExit(f"ENGINE_SAMPLING must be greedy or top_p, got {SAMPLING_MODE!r}")
GREEDY = (
    SamplingParams(temperature=0.0, max_new_tokens=NEW)
    if SAMPLING_MODE == "greedy"
    else SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=NEW, seed=0)
)


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(4, PEER_DIMS.vocab_size, PROMPT - 1).tolist() for _ in range(n)]


async def timed_calls(
    engine: JaxEngine, batch: int, *, sequential: bool = False
) -> tuple[float, float]:
    """Generated tokens/s (median over the ``REPEATS`` timed calls that compiled nothing)
    and the first call's seconds. The engine is warmed up first; every call sends fresh
    prompts (:func:`~profiling.common.clean_call_times`)."""
    await asyncio.to_thread(engine.start_warmup().result)

    async def call(i: int) -> None:
        ps = prompts(batch, seed=i)
        if sequential:
            for p in ps:
                await engine.generate(p, GREEDY)
        else:
            await asyncio.gather(*(engine.generate(p, GREEDY) for p in ps))

    times, first = await clean_call_times(engine, call, REPEATS, f"B={batch}")
    return batch * NEW / statistics.median(times), first


async def window_ab(model: Transformer, batch: int) -> None:
    """``decode_window`` bucketed against full on one batch size: two warm engines, one
    timed call each in turn (``REPEATS`` pairs), the median of the per-pair ratios."""
    engines = {
        mode: JaxEngine(
            model,
            EngineConfig(
                max_slots=batch,
                max_seq_len=PROMPT + NEW,
                decode_steps=DECODE_STEPS,
                decode_window=mode,
            ),
        )
        for mode in ("bucketed", "full")
    }

    async def once(engine: JaxEngine, seed: int) -> float:
        ps = prompts(batch, seed=seed)  # fresh prompts: no prefix-cache hit
        before = sum(engine.compiles.values())
        t = time.perf_counter()
        await asyncio.gather(*(engine.generate(p, GREEDY) for p in ps))
        seconds = time.perf_counter() - t
        if sum(engine.compiles.values()) != before:
            raise RuntimeError(f"a timed call compiled (B={batch}): the warm-up missed a shape")
        return batch * NEW / seconds

    for engine in engines.values():
        await asyncio.to_thread(engine.warmup)
        await once(engine, 0)
    tps: dict[str, list[float]] = {"bucketed": [], "full": []}
    for i in range(REPEATS):
        order = ("bucketed", "full") if i % 2 == 0 else ("full", "bucketed")
        for mode in order:
            tps[mode].append(await once(engines[mode], 1 + i))
    ratios = [b / f for b, f in zip(tps["bucketed"], tps["full"], strict=True)]
    windows = engines["bucketed"].config.window_buckets()
    print(
        f"RESULT decode_window B={batch} P={PROMPT} N={NEW} max_seq_len {PROMPT + NEW} "
        f"(windows {windows}): bucketed {statistics.median(tps['bucketed']):,.0f} gen tok/s, "
        f"full {statistics.median(tps['full']):,.0f}; RATIO bucketed/full "
        f"{statistics.median(ratios):.2f}x (median of {REPEATS} pairs, min {min(ratios):.2f}, "
        f"max {max(ratios):.2f}); decode compiles {engines['bucketed'].compiles['decode']} vs "
        f"{engines['full'].compiles['decode']}"
    )
    for engine in engines.values():
        await engine.close()


async def session_prefill(model: Transformer) -> tuple[int, int]:
    """Prefill tokens for one 5-turn episode (16 new tokens, 8 observation tokens a turn)."""
    out = []
    for reuse in (False, True):
        engine = JaxEngine(
            model, EngineConfig(max_slots=2, max_seq_len=256, decode_steps=DECODE_STEPS)
        )
        ids = prompts(1)[0]
        for turn in range(5):
            res = await engine.generate(
                ids,
                SamplingParams(temperature=0.0, max_new_tokens=16),
                session_id="episode" if reuse else None,
            )
            ids = ids + res.token_ids + list(range(100 + 8 * turn, 108 + 8 * turn))
        out.append(engine.stats["prefill_tokens"])
        await engine.close()
    return out[0], out[1]


async def main() -> None:
    model = Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    n_params = count_params(model)
    peak = matmul_peak_gflops()
    flops_per_token = (
        2 * (n_params - PEER_DIMS.vocab_size * PEER_DIMS.d_model)
        + 2 * PEER_DIMS.vocab_size * PEER_DIMS.d_model
    )
    print(
        f"model: {n_params:,} parameters; devices {jax.devices()}; f32 matmul peak {peak:.1f} GFLOP/s"
    )
    results = {}
    if DECODE_WINDOW == "ab":
        for batch in BATCHES:
            await window_ab(model, batch)
        return
    for batch in BATCHES:
        engine = JaxEngine(
            model,
            EngineConfig(
                max_slots=batch,
                max_seq_len=PROMPT + NEW,
                decode_steps=DECODE_STEPS,
                decode_window=DECODE_WINDOW,
                warmup=True,
            ),
        )
        tps, first = await timed_calls(engine, batch)
        results[batch] = tps
        frac = tps * flops_per_token / (peak * 1e9)
        print(
            f"RESULT engine[{SAMPLING_MODE}] B={batch} P={PROMPT} N={NEW}: {tps:,.0f} gen tok/s (median of {REPEATS}), "
            f"first call after warm-up {first:.2f}s, {100 * frac:.1f}% of matmul peak"
        )
        await engine.close()
    engine = JaxEngine(
        model,
        EngineConfig(
            max_slots=16, max_seq_len=PROMPT + NEW, decode_steps=DECODE_STEPS, warmup=True
        ),
    )
    seq_tps, _ = await timed_calls(engine, 16, sequential=True)
    await engine.close()
    print(f"RESULT one-at-a-time B=16 (sequential requests, same engine): {seq_tps:,.0f} gen tok/s")
    if 16 in results:
        print(f"RATIO batched B=16 / one-at-a-time: {results[16] / seq_tps:.2f}x")
    plain, reused = await session_prefill(model)
    print(
        f"RESULT 5-turn episode prefill tokens: {plain} without session reuse, {reused} with "
        f"({plain / max(reused, 1):.2f}x fewer)"
    )


def cli(argv: list[str] | None = None) -> None:
    import argparse

    from tunix_agentic.compare.floor import MachinePeak, measure_bandwidth

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--floor", action="store_true", help="ours beside the bare jitted loop")
    p.add_argument("--models", default="peers,50m", help="peers, 50m, smollm2 (comma-separated)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--repeats", type=int, default=REPEATS, help="timed calls a side")
    p.add_argument("--json", default=None, help="write one row per model and batch here")
    args = p.parse_args(argv)
    if not args.floor:
        if args.json:
            p.error("--json goes with --floor")
        asyncio.run(main())
        return
    from profiling.engine_floor import run_floor

    peak = MachinePeak(
        matmul_peak_gflops() * 1e9, measure_bandwidth(), source="XLA matmul, NumPy read"
    )
    asyncio.run(
        run_floor(
            args.models.split(","),
            [int(b) for b in args.batches.split(",")],
            args.repeats,
            peak,
            args.json,
        )
    )


if __name__ == "__main__":
    cli()
