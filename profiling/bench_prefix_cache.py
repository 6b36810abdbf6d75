"""A GRPO group's shared prompt with and without the engine's prefix cache, printed, never asserted.

G samples of one long prompt (a real template's system prompt and tool schemas
run to hundreds of tokens) go to the in-process engine at the peers' model
dims (profiling/peers/), once with ``prefix_cache`` on and once off, in
interleaved rounds (on, off, on, off, ...), each round a fresh prompt so no
round reuses an earlier one's KV. Compiles are done in an untimed first round.
Prints prefill tokens computed per group, the median wall time per group and
the off/on ratio with its spread; and, on the cached engine, G distinct
prompts against G samples of one. Then the same on the wire: the cached engine behind
our SGLang-compatible ``/generate`` server, G concurrent HTTP requests per group, shared
and distinct groups interleaved, and how many of the shared group's answers report
``meta_info.cached_tokens`` (the issue's acceptance shape: at least G - 1 of G, served
at least 2.5x faster than G distinct prompts).

    python -m profiling.bench_prefix_cache   # PREFIX_G=8 PREFIX_PROMPT=400 PREFIX_NEW=64 PREFIX_ROUNDS=5
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import aiohttp
import numpy as np
from flax import nnx

from profiling.common import PEER_DIMS  # the peers' model dimensions
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.models.transformer import Transformer
from tunix_agentic.serving import start_server

G = int(os.environ.get("PREFIX_G", 8))
PROMPT = int(os.environ.get("PREFIX_PROMPT", 400))
NEW = int(os.environ.get("PREFIX_NEW", 64))
ROUNDS = int(os.environ.get("PREFIX_ROUNDS", 5))
SAMPLING = [SamplingParams(temperature=1.0, max_new_tokens=NEW, seed=s) for s in range(G)]


def prompt(seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(4, PEER_DIMS.vocab_size, PROMPT).tolist()


async def group(engine: JaxEngine, prompts: list[list[int]]) -> tuple[float, float]:
    """(seconds, prefill tokens computed) for one group served at once."""
    before = engine.stats["prefill_tokens"]
    t = time.perf_counter()
    await asyncio.gather(*(engine.generate(p, sp) for p, sp in zip(prompts, SAMPLING, strict=True)))
    return time.perf_counter() - t, engine.stats["prefill_tokens"] - before


async def wire_group(
    http: aiohttp.ClientSession, url: str, prompts: list[list[int]]
) -> tuple[float, list[int]]:
    """(seconds, each answer's ``meta_info.cached_tokens``): G requests sent at once."""

    async def one(ids: list[int]) -> int:
        body = {"input_ids": ids, "sampling_params": {"temperature": 1.0, "max_new_tokens": NEW}}
        async with http.post(url, json=body) as resp:
            resp.raise_for_status()
            return (await resp.json())["meta_info"]["cached_tokens"]

    t = time.perf_counter()
    cached = await asyncio.gather(*(one(p) for p in prompts))
    return time.perf_counter() - t, list(cached)


async def on_the_wire(engine: JaxEngine) -> None:
    """Shared and distinct groups through our server, interleaved; printed."""
    runner, port = await start_server(engine)
    url = f"http://127.0.0.1:{port}/generate"
    seconds: dict[str, list[float]] = {"shared": [], "distinct": []}
    reported = []
    try:
        async with aiohttp.ClientSession() as http:
            for r in range(ROUNDS + 1):  # round 0: any compile left, not timed
                shared = [prompt(7000 + r)] * G
                distinct = [prompt(8000 + 100 * r + i) for i in range(G)]
                order = (("shared", shared), ("distinct", distinct))
                for name, prompts in order if r % 2 else order[::-1]:
                    s, cached = await wire_group(http, url, prompts)
                    if r:
                        seconds[name].append(s)
                        if name == "shared":
                            reported.append(sum(c > 0 for c in cached))
    finally:
        await runner.cleanup()
    ratios = [d / s for s, d in zip(seconds["shared"], seconds["distinct"], strict=True)]
    print(f"on the wire (our /generate server, the cached engine, {G} concurrent requests):")
    print(
        f"  shared group: cached_tokens reported on {min(reported)}-{max(reported)} of {G} "
        f"answers per group; wall/group {statistics.median(seconds['shared']):.3f} s"
    )
    print(f"  distinct group: wall/group {statistics.median(seconds['distinct']):.3f} s")
    print(f"  wall distinct/shared (interleaved): {spread(ratios)}")


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.2f}x (min {min(xs):.2f}, max {max(xs):.2f})"


async def main() -> None:
    model = Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    engines = {
        on: JaxEngine(
            model,
            EngineConfig(
                max_slots=G,
                max_seq_len=PROMPT + NEW + 16,
                decode_steps=16,
                prefix_cache=on,
                warmup=False,
            ),
        )
        for on in (True, False)
    }
    seconds: dict[object, list[float]] = {True: [], False: [], "distinct": []}
    tokens: dict[object, float] = {}
    for r in range(ROUNDS + 1):  # round 0 compiles: not timed
        for on, engine in engines.items():
            s, n = await group(engine, [prompt(1000 * r + on)] * G)
            if r:
                seconds[on].append(s)
                tokens[on] = n
        distinct = [prompt(1000 * r + 500 + i) for i in range(G)]
        s, n = await group(engines[True], distinct)
        if r:
            seconds["distinct"].append(s)
            tokens["distinct"] = n
    print(f"G={G} samples of one {PROMPT}-token prompt, {NEW} new tokens, {ROUNDS} rounds")
    for key, label in (
        (False, "prefix_cache off"),
        (True, "prefix_cache on"),
        ("distinct", "on, G distinct prompts"),
    ):
        med = statistics.median(seconds[key])
        print(f"  {label:24s} prefill tokens/group {tokens[key]:6.0f}  wall/group {med:6.3f} s")
    ratios = [off / on for on, off in zip(seconds[True], seconds[False], strict=True)]
    vs_distinct = [d / on for on, d in zip(seconds[True], seconds["distinct"], strict=True)]
    print(f"  wall off/on (interleaved pairs): {spread(ratios)}")
    print(f"  wall distinct/shared (cached engine): {spread(vs_distinct)}")
    print(f"  cached tokens (on engine, whole run): {engines[True].stats['cached_tokens']:.0f}")
    await on_the_wire(engines[True])
    for engine in engines.values():
        await engine.close()


if __name__ == "__main__":
    asyncio.run(main())
