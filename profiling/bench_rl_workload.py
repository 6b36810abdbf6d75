"""The RL rollout workload, not plain decode: ours beside Tunix's sampler and HF ``generate``.

One rollout step of a multi-turn, tool-using RL run (``RLWorkload`` in
``profiling/peers/toy_common.py``): 8 tasks x G=8 samples = 64 episodes; each
starts from a 300-token system prompt (instructions and tool schemas, shared by
all) and a 20-token task message (shared by a task's G samples); 3 turns of
exactly 64 generated tokens, with a 32-token observation appended after each
turn but the last (prompts of 320, 416 and 512 tokens; 12,288 tokens generated).
The model is the peers' toy Qwen3 (4.46M parameters), built on each side from
``toy_common.MODEL_DIMS``; temperature 1, nothing ends early.

Each side is driven as its users drive it:

* ours: our ``JaxEngine`` as the rollout drives it: one async ``generate`` per
  episode turn (64 coroutines, no barrier between episodes), each episode its own
  ``session_id`` (its KV stays parked between turns, so a turn prefills only the
  observation), ``prefix_cache`` on (the system prompt and a task's message are
  prefilled once and copied), in a warm engine;
* Tunix (``peers/bench_tunix_rl.py``, JAX venv): its ``Sampler``, each turn the whole
  conversation re-sent as text for all 64 episodes in one batch;
* HF (``peers/bench_hf_rl.py``, torch venv): ``model.generate``, each turn the whole
  conversation re-sent as ids for all 64 episodes in one batch.

Printed per side: generated tokens per second (one step's 12,288 tokens over its
wall time, the median of ``--rounds`` timed rounds after an untimed one that
compiles; every round is a new step: new prompt ids, so nothing cached in an earlier
round is reused), prompt tokens prefilled per step, and the bytes each side reserves
for KV (ours: the engine's cache, from its config; Tunix: the cache its sampler
allocates per call, measured on its model's ``init_cache``; HF: the largest
``DynamicCache`` ``generate`` returned, summed over its tensors). Then the ratios
ours/Tunix and ours/HF against the goals (>= 3x Tunix and >= 4x HF generated
tokens/s), measured as ``--pairs`` interleaved pairs (ours, theirs, ours, theirs,
...; the side that goes first alternates) because this shared machine drifts by
more than the differences measured: ours in this process, each peer run a fresh
process in its venv (``bash profiling/peers/setup_venvs.sh`` builds them; a missing
one is skipped with a note). The load average is printed at the start and the end;
each pair's machine state is recorded and busy pairs left out as in ``profiling.compare_peers``
(``--busy-share``, ``--min-clean-pairs``, ``--threads``, ``--omp-wait-policy``), and the
FLOOR line puts each side against the rollout step's floor (``rl_step_floor``).
The last line is one JSON object with every figure.

    python -m profiling.bench_rl_workload                        # 3 pairs, 2 rounds a run
    python -m profiling.bench_rl_workload --pairs 1 --peers tunix --torch-threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from profiling.pairs import (
    JAX_PY,
    PEERS,
    TORCH_PY,
    MachineSettings,
    Measurement,
    PairedComparison,
    add_machine_args,
    emit_json,
    guarded_peak,
    machine_settings,
    paired,
    print_comparison,
    run,
    toy_shape,
)
from profiling.peers import toy_common as tc
from tunix_agentic.compare.floor import (
    MachinePeak,
    StepFloor,
    decode_floor_s,
    measure_peak,
)
from tunix_agentic.compare.machine import parse_threads, xla_threads

GOALS = {"tunix": 3.0, "hf": 4.0}  # ours / theirs, generated tokens per second
PEER_SCRIPTS = {"tunix": (JAX_PY, "bench_tunix_rl.py"), "hf": (TORCH_PY, "bench_hf_rl.py")}
DEFAULT_PAIRS, DEFAULT_ROUNDS = 3, 2


# ------------------------------------------------------------------ floor
def rl_step_floor(w: tc.RLWorkload, peak: MachinePeak) -> StepFloor:
    """The least one rollout step of ``w`` takes here: every token that must be prefilled
    (the system prompt once, each task's message once, each observation) at the matmul
    peak, and each turn's decode of all episodes at the decode roofline (weights and every
    episode's KV read once a step)."""
    shape = toy_shape()
    unique = (
        1 + w.system_tokens + w.tasks * w.task_tokens + w.episodes * w.obs_tokens * (w.turns - 1)
    )
    decode = sum(
        decode_floor_s(
            shape,
            w.episodes,
            prompt,
            w.new_tokens,
            flops_per_s=peak.flops_per_s,
            bytes_per_s=peak.bytes_per_s,
        )
        for prompt in w.prompt_lengths()
    )
    return StepFloor(prefill_s=2 * shape.matmul_params * unique / peak.flops_per_s, decode_s=decode)


# ------------------------------------------------------------------ ours
def peer_model_config():
    """Our ModelConfig at the peers' dims (the toy Qwen3 of ``toy_common.MODEL_DIMS``)."""
    from tunix_agentic.models.transformer import ModelConfig

    d = tc.MODEL_DIMS
    return ModelConfig(
        vocab_size=d["vocab_size"],
        d_model=d["d_model"],
        num_layers=d["num_layers"],
        num_heads=d["num_heads"],
        num_kv_heads=d["num_kv_heads"],
        head_dim=d["head_dim"],
        ffn_dim=d["ffn_dim"],
        rope_theta=float(d["rope_theta"]),
        norm_eps=d["norm_eps"],
        qk_norm=True,
        tie_embeddings=d["tied_embedding"],
    )


def kv_bytes_per_token(engine: Any) -> int:
    import numpy as np

    m = engine.model_config
    return 2 * m.num_layers * m.num_kv_heads * m.head_dim * np.dtype(m.jnp_dtype).itemsize


def engine_kv_bytes(engine: Any) -> int:
    """Bytes the engine reserves for K and V on device.

    From ``stats["kv_tokens_reserved"]`` where the engine reports it (what its layout
    sets aside: dense, ``max_slots`` rows of ``max_seq_len``; paged, the block pool),
    else from its config's dense cache (``max_slots x max_seq_len``, allocated whole).
    """
    tokens = engine.stats.get("kv_tokens_reserved")
    if tokens is None:
        tokens = engine.config.max_slots * engine.config.max_seq_len
    return int(tokens) * kv_bytes_per_token(engine)


def engine_kv_peak_bytes(engine: Any) -> int | None:
    """Bytes of the most KV blocks a paged engine held at once (None when not paged)."""
    peak = engine.stats.get("kv_blocks_peak")
    if peak is None:
        return None
    return int(peak) * engine.config.kv_block_size * kv_bytes_per_token(engine)


async def episode(engine: Any, w: tc.RLWorkload, seed: int, e: int) -> int:
    """One episode's turns, as the rollout drives the engine; tokens generated."""
    from tunix_agentic.inference import SamplingParams

    ids = w.first_prompt(seed, w.task_of(e))
    generated = 0
    for turn in range(w.turns):
        sampling = SamplingParams(
            temperature=1.0, max_new_tokens=w.new_tokens, seed=(seed * 1000 + e) * 10 + turn
        )
        out = await engine.generate(ids, sampling, session_id=f"step{seed}/episode{e}")
        if len(out.token_ids) != w.new_tokens:
            raise RuntimeError(f"episode {e} turn {turn}: {len(out.token_ids)} tokens")
        generated += len(out.token_ids)
        ids = ids + out.token_ids
        if turn < w.turns - 1:
            ids = ids + w.observation(seed, e, turn)
    return generated


async def rollout_step(engine: Any, w: tc.RLWorkload, seed: int) -> dict[str, float]:
    """Every episode of one step at once; seconds, tokens generated and prefilled."""
    before = engine.stats
    t = time.perf_counter()
    counts = await asyncio.gather(*(episode(engine, w, seed, e) for e in range(w.episodes)))
    s = time.perf_counter() - t
    after = engine.stats
    return {
        "s": s,
        "generated": sum(counts),
        "prefilled": after["prefill_tokens"] - before["prefill_tokens"],
        "cached": after["cached_tokens"] - before["cached_tokens"],
        # Where the engine's time went: device busy, host gaps between calls, idle.
        **{k: after[k] - before[k] for k in ("busy_s", "sched_gap_s", "idle_s", "decode_steps")},
    }


class Ours:
    """Our engine at the peers' dims, warm, one step per round (each round a new step)."""

    def __init__(
        self,
        w: tc.RLWorkload,
        rounds: int,
        *,
        kv_layout: str = "dense",
        decode_steps: int = 16,
        decode_window: str = "bucketed",
    ):
        from flax import nnx

        from tunix_agentic.inference import EngineConfig, JaxEngine
        from tunix_agentic.models.transformer import Transformer

        self.w, self.rounds, self.seed = w, rounds, 0
        self.loop = asyncio.new_event_loop()
        model = Transformer(peer_model_config(), rngs=nnx.Rngs(0))
        # kv_layout only when not the default, so this runs on engines without the option.
        layout = {} if kv_layout == "dense" else {"kv_layout": kv_layout}
        if decode_window != "bucketed":
            layout["decode_window"] = decode_window
        config = EngineConfig(
            max_slots=w.episodes,  # one slot an episode: its KV stays parked between turns
            max_seq_len=w.final_length,
            decode_steps=decode_steps,
            session_reuse=True,
            prefix_cache=True,
            warmup=False,
            **layout,
        )
        self.engine = JaxEngine(model, config)
        self.kv_bytes = engine_kv_bytes(self.engine)
        t = time.perf_counter()
        self.first = self._step()  # compiles the shapes this workload meets
        self.first_s = time.perf_counter() - t
        self.compiles = sum(self.engine.compiles.values())

    def _step(self) -> dict[str, float]:
        self.seed += 1
        return self.loop.run_until_complete(rollout_step(self.engine, self.w, self.seed))

    def measure(self) -> Measurement:
        steps = [self._step() for _ in range(self.rounds)]
        if any(s["generated"] != self.w.generated_tokens for s in steps):
            raise RuntimeError("a round generated fewer tokens than the workload states")
        med = statistics.median(s["s"] for s in steps)
        tps = self.w.generated_tokens / med
        compiles = sum(self.engine.compiles.values()) - self.compiles
        self.compiles += compiles
        note = f", {compiles} compile(s) in the timed rounds" if compiles else ""
        line = (
            f"RESULT ours_rl: {tps:,.1f} gen tok/s (median of {self.rounds} rounds, "
            f"{[round(s['s'], 3) for s in steps]} s), prefill tokens {steps[0]['prefilled']:.0f} "
            f"(cached {steps[0]['cached']:.0f}), kv bytes {self.kv_bytes}{note}"
        )
        mid = sorted(steps, key=lambda s: s["s"])[(len(steps) - 1) // 2]
        line += (
            f"; engine in the median round: busy {mid['busy_s']:.1f}s, host gaps "
            f"{mid['sched_gap_s']:.1f}s, idle {mid['idle_s']:.1f}s, {mid['decode_steps']:.0f} "
            f"decode steps"
        )
        peak = engine_kv_peak_bytes(self.engine)
        if peak is not None:
            line += f", kv bytes in use at peak {peak}"
        extra = {
            "threads": xla_threads().to_dict(),
            "kv_peak_bytes": peak,
            "prefill_tokens": int(steps[0]["prefilled"]),
            "cached_tokens": int(steps[0]["cached"]),
            "kv_bytes": self.kv_bytes,
            "compiles_in_timed_rounds": compiles,
            "engine_split_s": {k: round(mid[k], 3) for k in ("busy_s", "sched_gap_s", "idle_s")},
        }
        return Measurement(tps, line, extra)

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.close())
        self.loop.close()


# ------------------------------------------------------------------ peers
def peer_measure(
    name: str, w: tc.RLWorkload, rounds: int, settings: MachineSettings, torch_threads: int | None
):
    python, script = PEER_SCRIPTS[name]
    env = {**settings.env, **tc.rl_workload_env(w), "RL_ROUNDS": str(rounds)}
    if torch_threads is not None and name == "hf":
        env["OMP_NUM_THREADS"] = str(torch_threads)

    def measure() -> Measurement:
        out = run([python, str(PEERS / script)], env)
        res = next((json.loads(ln) for ln in out.splitlines() if ln.startswith("{")), None)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT")), None)
        if res is None or line is None:
            return Measurement(None, "no figure; output ends: " + out[-400:].strip())
        extra = {
            "prefill_tokens": res["prefill_tokens"],
            "kv_bytes": res["kv_bytes"],
            "threads": parse_threads(out),
        }
        return Measurement(res["gen_tok_per_s"], line, extra)

    return measure


def median_extra(extras: tuple[dict[str, Any], ...], key: str) -> float | None:
    values = [x[key] for x in extras if x.get(key) is not None]
    return statistics.median(values) if values else None


def report(name: str, c: PairedComparison) -> dict[str, Any]:
    """The three figures of one comparison, their ratios and the goal's verdict, printed."""
    goal = GOALS[name]
    ours_pf, theirs_pf = (
        median_extra(c.ours_extra, "prefill_tokens"),
        median_extra(c.theirs_extra, "prefill_tokens"),
    )
    ours_kv, theirs_kv = (
        median_extra(c.ours_extra, "kv_bytes"),
        median_extra(c.theirs_extra, "kv_bytes"),
    )
    out: dict[str, Any] = {"goal_gen_tok_per_s_ratio": goal}
    print_comparison(c)
    if c.median is None:
        why = "machine busy" if not c.stands else "no complete pair"
        print(f"GOAL ours/{name} >= {goal:g}x gen tok/s: {why}, no verdict")
        return out
    met = "met" if c.median >= goal else "NOT met"
    print(
        f"  gen tok/s:       ours {statistics.median(c.ours):,.0f}  {name} "
        f"{statistics.median(c.theirs):,.0f}  ratio {c.median:.2f}x"
    )
    if ours_pf and theirs_pf:
        print(
            f"  prefill tokens:  ours {ours_pf:,.0f}  {name} {theirs_pf:,.0f}  "
            f"ours/{name} {ours_pf / theirs_pf:.3f} ({theirs_pf / ours_pf:.1f}x fewer)"
        )
    if ours_kv and theirs_kv:
        print(
            f"  KV bytes:        ours {ours_kv / 2**20:,.1f} MiB  {name} {theirs_kv / 2**20:,.1f} MiB"
            f"  ours/{name} {ours_kv / theirs_kv:.3f}"
        )
    ours_peak = median_extra(c.ours_extra, "kv_peak_bytes")
    if ours_peak:
        print(f"  KV bytes in use at peak (ours, paged): {ours_peak / 2**20:,.1f} MiB")
    print(
        f"GOAL ours/{name} >= {goal:g}x gen tok/s: {met} (median {c.median:.2f}x, "
        f"min {min(c.ratios):.2f}, max {max(c.ratios):.2f})"
    )
    out.update(
        goal_met=c.median >= goal,
        prefill_tokens={"ours": ours_pf, name: theirs_pf},
        kv_bytes={"ours": ours_kv, name: theirs_kv},
    )
    return out


# ------------------------------------------------------------------ main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help="interleaved pairs (3)")
    p.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS, help="timed steps a run (2)")
    p.add_argument("--peers", default="tunix,hf", help="comma-separated: tunix, hf (both)")
    p.add_argument(
        "--kv-layout",
        choices=("dense", "paged"),
        default="dense",
        help="our engine's KV layout (dense)",
    )
    p.add_argument(
        "--decode-window",
        choices=("bucketed", "full"),
        default="bucketed",
        help="our engine's engine.decode_window (bucketed; full: every step over max_seq_len)",
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS for the HF side alone, over --threads (then the sides' thread "
        "counts differ; kept for older command lines)",
    )
    add_machine_args(p)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.torch_threads is not None and args.torch_threads < 1:
        p.error(f"--torch-threads must be >= 1, got {args.torch_threads}")
    args.machine = machine_settings(p, args, ours_in_process=True)
    args.peers = [x for x in args.peers.split(",") if x]
    bad = sorted(set(args.peers) - set(PEER_SCRIPTS))
    if bad or not args.peers:
        p.error(f"--peers takes {', '.join(PEER_SCRIPTS)}, got {bad or 'nothing'}")
    return args


def main(argv: list[str] | None = None, workload: tc.RLWorkload | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings: MachineSettings = args.machine
    w = workload or tc.rl_workload_from_env()
    print(settings.describe())
    peak = guarded_peak(measure_peak, settings.guard)
    floor = rl_step_floor(w, peak)
    floor_tps = w.generated_tokens / floor.total_s
    print(f"{peak.describe()}; rollout step {floor.describe()} = {floor_tps:,.0f} gen tok/s")
    load = os.getloadavg()
    print(
        f"workload: {w.tasks} tasks x G={w.group} = {w.episodes} episodes, {w.turns} turns of "
        f"{w.new_tokens} tokens, {w.obs_tokens}-token observations; prompts "
        f"{w.prompt_lengths()} tokens; {w.generated_tokens:,} tokens generated a step; "
        f"re-sending every turn prefills {w.resend_prefill_tokens():,}"
    )
    print(
        f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} CPUs)"
    )
    skipped = []
    for name in args.peers:
        python, _ = PEER_SCRIPTS[name]
        if not Path(python).exists():
            print(
                f"skip {name}: {python} not found (bash {PEERS}/setup_venvs.sh builds it; "
                f"ANCHOR_JAX_PY / ANCHOR_TORCH_PY point elsewhere)"
            )
            skipped.append(name)
    ours = Ours(w, args.rounds, kv_layout=args.kv_layout, decode_window=args.decode_window)
    print(
        f"ours: first (compiling) step {ours.first_s:.1f}s, prefill tokens "
        f"{ours.first['prefilled']:.0f}, KV reserved {ours.kv_bytes / 2**20:.1f} MiB "
        f"({args.kv_layout} layout, {ours.engine.config.max_slots} slots x "
        f"{ours.engine.config.max_seq_len} tokens; decode windows "
        f"{ours.engine.config.window_buckets()})"
    )
    comparisons, verdicts = [], {}
    try:
        for name in args.peers:
            if name in skipped:
                continue
            label = f"ours / {name} [rl workload]"
            print(f"{label}: {args.pairs} pairs (ours warm in-process, theirs fresh processes)")
            theirs = peer_measure(name, w, args.rounds, settings, args.torch_threads)
            c = paired(
                label,
                ours.measure,
                theirs,
                args.pairs,
                unit="gen tok/s",
                higher_is_better=True,
                guard=settings.guard,
                floor=floor_tps,
            )
            verdicts[name] = report(name, c)
            comparisons.append(c)
    finally:
        ours.close()
    load = os.getloadavg()
    print(f"load average at end: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    return emit_json(
        "bench_rl_workload",
        args.pairs,
        comparisons,
        skipped=skipped,
        workload=vars(w),
        rounds=args.rounds,
        kv_layout=args.kv_layout,
        decode_window=args.decode_window,
        torch_threads=args.torch_threads,
        verdicts=verdicts,
        machine=settings.to_dict(),
        peak=peak.to_dict(),
        floor=floor.to_dict(),
    )


if __name__ == "__main__":
    main()
