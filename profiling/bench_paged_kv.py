"""Dense against paged KV on one GRPO-shaped workload, printed, never asserted.

P prompts x G samples (P=8, G=8) that share a long prefix (a system prompt and tool
schemas) and differ in a short question, each sample with its own generation length
(varied ``max_new_tokens``), go to two in-process engines that differ only in
``kv_layout``, in interleaved rounds (dense, paged, dense, paged, ...; round 0 compiles
and is not timed). Prints:

- the KV each engine sets aside (dense: ``max_slots x max_seq_len`` tokens; paged: its
  block pool) and, paged, the peak blocks used against the tokens held at that moment,
  sampled while the workload runs (a shared prefix counts once per holder in "tokens
  held"; its full blocks are stored once, so blocks can be below tokens);
- generated tokens per second of wall time of each engine (the workload's prefill
  included; decode dominates it) and the paged/dense ratio per round.

    python -m profiling.bench_paged_kv   # PAGED_P=8 PAGED_G=8 PAGED_PREFIX=192 PAGED_NEW=64
                                         # PAGED_SLOTS=16 PAGED_BLOCK=16 PAGED_ROUNDS=3
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time

import numpy as np
from flax import nnx

from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.models.config import ModelConfig
from tunix_agentic.models.transformer import Transformer

P = int(os.environ.get("PAGED_P", 8))
G = int(os.environ.get("PAGED_G", 8))
PREFIX = int(os.environ.get("PAGED_PREFIX", 192))
QUESTION = 12
NEW = int(os.environ.get("PAGED_NEW", 64))
SLOTS = int(os.environ.get("PAGED_SLOTS", 16))
BLOCK = int(os.environ.get("PAGED_BLOCK", 16))
ROUNDS = int(os.environ.get("PAGED_ROUNDS", 3))
DIMS = ModelConfig(
    vocab_size=512, d_model=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, ffn_dim=256
)


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """P prompts x G samples: one shared prefix, a question per prompt, varied lengths."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(4, DIMS.vocab_size, PREFIX).tolist()
    out = []
    for p in range(P):
        question = rng.integers(4, DIMS.vocab_size, QUESTION).tolist()
        for g in range(G):
            new = int(rng.integers(NEW // 4, NEW + 1))
            sampling = SamplingParams(
                temperature=1.0, max_new_tokens=new, seed=seed * 1000 + p * G + g
            )
            out.append((prefix + question, sampling))
    return out


async def run(engine: JaxEngine, requests) -> tuple[float, int, list[tuple[int, int]]]:
    """(seconds, tokens generated, [(blocks used x block size, tokens held)] sampled)."""
    samples: list[tuple[int, int]] = []
    done = asyncio.Event()

    async def watch():
        while not done.is_set():
            s = engine.stats
            samples.append((int(s.get("kv_blocks_used", 0)) * BLOCK, int(s["kv_tokens_held"])))
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch())
    before = engine.stats["generated_tokens"]
    t = time.perf_counter()
    outs = await asyncio.gather(*(engine.generate(p, s) for p, s in requests))
    seconds = time.perf_counter() - t
    done.set()
    await watcher
    assert engine.stats["generated_tokens"] - before == sum(len(o.token_ids) for o in outs)
    return seconds, sum(len(o.token_ids) for o in outs), samples


async def main() -> dict[str, float]:
    model = Transformer(DIMS, rngs=nnx.Rngs(0))
    max_seq_len = -(-(PREFIX + QUESTION + NEW) // BLOCK) * BLOCK
    base = dict(max_slots=SLOTS, max_seq_len=max_seq_len, decode_steps=16, warmup=False)
    engines = {
        "dense": JaxEngine(model, EngineConfig(**base)),
        "paged": JaxEngine(model, EngineConfig(**base, kv_layout="paged", kv_block_size=BLOCK)),
    }
    tps: dict[str, list[float]] = {"dense": [], "paged": []}
    samples: list[tuple[int, int]] = []
    for r in range(ROUNDS + 1):  # round 0 compiles: not timed
        for name, engine in engines.items():
            seconds, tokens, seen = await run(engine, workload(r))
            if r:
                tps[name].append(tokens / seconds)
                if name == "paged":
                    samples += seen
    paged = engines["paged"].stats
    dense_reserved = engines["dense"].stats["kv_tokens_reserved"]
    used, held = max(samples)  # the moment of peak blocks used
    ratios = [
        paged_tps / dense_tps
        for dense_tps, paged_tps in zip(tps["dense"], tps["paged"], strict=True)
    ]
    fig = {
        "dense_kv_tokens_reserved": dense_reserved,
        "paged_kv_tokens_reserved": paged["kv_tokens_reserved"],
        "paged_peak_block_tokens": paged["kv_blocks_peak"] * BLOCK,
        "paged_block_tokens_at_peak": used,
        "tokens_held_at_peak": held,
        "dense_tokens_per_s": statistics.median(tps["dense"]),
        "paged_tokens_per_s": statistics.median(tps["paged"]),
        "paged_over_dense_tps": statistics.median(ratios),
    }
    print(
        f"{P} prompts x G={G}, shared prefix {PREFIX} + question {QUESTION} tokens, "
        f"{NEW // 4}..{NEW} new tokens each; {SLOTS} slots, max_seq_len {max_seq_len}, "
        f"blocks of {BLOCK}; {ROUNDS} timed rounds"
    )
    print(f"  KV set aside, dense: {dense_reserved:.0f} tokens ({SLOTS} x {max_seq_len})")
    print(
        f"  KV set aside, paged: {paged['kv_tokens_reserved']:.0f} tokens "
        f"({paged['kv_blocks_total']:.0f} blocks), {paged['kv_tokens_reserved'] / dense_reserved:.2f}x dense"
    )
    print(
        f"  paged peak blocks used: {paged['kv_blocks_peak']:.0f} ({fig['paged_peak_block_tokens']:.0f} tokens); "
        f"sampled at peak: {used} tokens in blocks for {held} tokens held "
        f"(blocks/held {used / max(held, 1):.2f}x)"
    )
    print(
        f"  generated tokens/s: dense {fig['dense_tokens_per_s']:.0f}, paged {fig['paged_tokens_per_s']:.0f}; "
        f"paged/dense median {fig['paged_over_dense_tps']:.2f}x "
        f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
    )
    print(
        f"  cached prompt tokens: dense {engines['dense'].stats['cached_tokens']:.0f}, "
        f"paged {paged['cached_tokens']:.0f}"
    )
    for engine in engines.values():
        await engine.close()
    return fig


if __name__ == "__main__":
    asyncio.run(main())
