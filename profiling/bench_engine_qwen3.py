"""The engine at a real model's size (Qwen3-0.6B dims, random init), printed, never asserted.

Vocabulary 151,936, 28 layers, d_model 1,024, 16/8 heads of 128, FFN 3,072,
q/k norms, tied embeddings. For each batch (1 and 8 by default): generated
tokens/s (median of the repeats, greedy, no early stop), the first call
(compiles included), and the peak memory (host RSS, and the device's own peak
where it reports one). Then the sampler's share of a decode step at this
vocabulary: the jitted sampling function alone on ``[B, 151936]`` logits
(greedy; temperature 1; temperature 1 with top-k 50 and top-p 0.95) against
the engine's time per decode step.

    python -m profiling.bench_engine_qwen3                 # float32 on CPU, bfloat16 elsewhere
    QWEN3_BATCHES=1,8,32 QWEN3_DTYPE=bfloat16 python -m profiling.bench_engine_qwen3
    QWEN3_LAYERS=2 QWEN3_VOCAB=4096 python -m profiling.bench_engine_qwen3   # a quick look

Environment: QWEN3_BATCHES (1,8), QWEN3_PROMPT (64), QWEN3_NEW (32), QWEN3_REPEATS (3),
QWEN3_DTYPE, QWEN3_LAYERS (28), QWEN3_VOCAB (151936), QWEN3_DECODE_STEPS (8).
"""

from __future__ import annotations

import asyncio
import os
import resource
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from profiling.common import clean_call_times
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.inference.sampling import sample
from tunix_agentic.models.transformer import ModelConfig, Transformer, count_params


def _env_ints(name: str, default: str) -> list[int]:
    return [int(x) for x in os.environ.get(name, default).split(",")]


def qwen3_06b_dims(dtype: str, layers: int = 28, vocab: int = 151_936) -> ModelConfig:
    return ModelConfig(
        vocab_size=vocab,
        d_model=1024,
        num_layers=layers,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        ffn_dim=3072,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=True,
        dtype=dtype,
    )


def peak_memory() -> dict[str, float]:
    out = {"host_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["device_peak_gib"] = stats["peak_bytes_in_use"] / 2**30
    return out


async def generate_rate(
    engine: JaxEngine, batch: int, prompt: int, new: int, vocab: int, repeats: int
) -> tuple[float, float]:
    """Tokens/s over the timed calls that compiled nothing, and the first call's seconds.
    The first call compiles the shapes this workload meets (a full warm-up would compile
    every bucket of a 28-layer model); every call sends fresh prompts, so the timed ones
    meet the same shapes and no prefix an earlier call cached
    (:func:`~profiling.common.clean_call_times`)."""
    rng = np.random.default_rng(batch)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new)

    async def call(i: int) -> None:
        prompts = [rng.integers(10, vocab, prompt).tolist() for _ in range(batch)]
        await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))

    times, first = await clean_call_times(engine, call, repeats, f"B={batch}")
    return batch * new / statistics.median(times), first


def sampler_seconds(batch: int, vocab: int, mode: str, reps: int = 10) -> float:
    """Seconds per call of the engine's jitted sampling function on [batch, vocab] logits."""
    logits = jax.random.normal(jax.random.key(0), (batch, vocab), jnp.float32)
    keys = jax.random.key_data(jax.random.split(jax.random.key(1), batch))
    temperature = jnp.full((batch,), 0.0 if mode == "greedy" else 1.0)
    top_k = jnp.full((batch,), 50 if mode == "top-k/top-p" else 0, jnp.int32)
    top_p = jnp.full((batch,), 0.95 if mode == "top-k/top-p" else 1.0)
    fn = jax.jit(sample)
    jax.block_until_ready(fn(logits, keys, temperature, top_k, top_p))
    t = time.perf_counter()
    for _ in range(reps):
        jax.block_until_ready(fn(logits, keys, temperature, top_k, top_p))
    return (time.perf_counter() - t) / reps


async def main() -> dict[str, Any]:
    on_cpu = jax.default_backend() == "cpu"
    dtype = os.environ.get("QWEN3_DTYPE", "float32" if on_cpu else "bfloat16")
    cfg = qwen3_06b_dims(
        dtype,
        layers=int(os.environ.get("QWEN3_LAYERS", 28)),
        vocab=int(os.environ.get("QWEN3_VOCAB", 151_936)),
    )
    batches = _env_ints("QWEN3_BATCHES", "1,8")
    prompt, new = int(os.environ.get("QWEN3_PROMPT", 64)), int(os.environ.get("QWEN3_NEW", 32))
    repeats = int(os.environ.get("QWEN3_REPEATS", 3))
    decode_steps = int(os.environ.get("QWEN3_DECODE_STEPS", 8))
    t = time.perf_counter()
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    print(
        f"model: Qwen3-0.6B dims ({cfg.num_layers} layers, vocab {cfg.vocab_size:,}), "
        f"{count_params(model):,} parameters, {dtype}, random init in {time.perf_counter() - t:.0f}s; "
        f"devices {jax.devices()}"
    )
    results: dict[str, Any] = {"dtype": dtype, "batches": {}}
    for batch in batches:
        engine = JaxEngine(
            model,
            EngineConfig(max_slots=batch, max_seq_len=prompt + new, decode_steps=decode_steps),
        )
        rate, first = await generate_rate(engine, batch, prompt, new, cfg.vocab_size, repeats)
        chunks = engine.stats["decode_chunks"]
        busy = engine.stats["busy_s"]
        await engine.close()
        step_s = batch / rate  # wall seconds per decode step of the whole batch
        memory = peak_memory()
        results["batches"][batch] = {"tok_per_s": rate, "first_call_s": first, **memory}
        shown = ", ".join(f"{k} {v:.2f}" for k, v in memory.items())
        print(
            f"RESULT qwen3-0.6b B={batch} P={prompt} N={new}: {rate:,.1f} gen tok/s "
            f"(median of {repeats}; {1000 * step_s:.1f} ms per decode step), first call "
            f"{first:.1f}s; peak memory {shown}; {chunks} decode chunks, busy {busy:.1f}s"
        )
        for mode in ("greedy", "temperature 1", "top-k/top-p"):
            s = sampler_seconds(batch, cfg.vocab_size, mode)
            results["batches"][batch][f"sampler_{mode}_s"] = s
            print(
                f"       sampler ({mode}) on [{batch}, {cfg.vocab_size:,}]: {1000 * s:.2f} ms = "
                f"{100 * s / step_s:.1f}% of a decode step"
            )
    if len(batches) > 1:
        lo, hi = batches[0], batches[-1]
        ratio = results["batches"][hi]["tok_per_s"] / results["batches"][lo]["tok_per_s"]
        results["ratio"] = ratio
        print(f"RATIO B={hi} / B={lo} throughput: {ratio:.2f}x")
    return results


if __name__ == "__main__":
    asyncio.run(main())
