"""Our GRPO step beside Tunix's GRPOLearner and TRL's GRPOTrainer, printed, never asserted.

Same model and workload as profiling/peers/ (README.md there): a 4.46M-parameter
Qwen3-style decoder (4 layers, d_model 256, q/k-norm, tied, vocab 2048, fp32);
per step 4 prompts x G=4 = 16 completions of exactly 64 tokens after 32-token
prompts (no stop ids, so nothing ends early), temperature 1, a reference model
with KL 0.04, AdamW 1e-5, token_mean aggregation (TRL's dapo default). One step
= our engine generates the 16 completions + one learner train step + the
weight sync to the engine (rows padded as the trainer pads them: 96 here). Figures:
the median over steps 2..N, split into generate / train / sync; the train step
alone with rows padded to 128 (multiples of 64, the padding before
``learner.length_bucket``) and to 96; the cost of the collapse diagnostic
(``learner.mi_pairs``, off in the comparison since the peers compute none); the peers'
s/step from their own scripts run as subprocesses (skipped with a note when
their venvs are missing; build them with ``bash profiling/peers/setup_venvs.sh``)
and the ratios. TRL's script reports whole steps only: its train share is
estimated as its step minus HF ``generate`` (sampled, same shapes) timed by
``bench_hf_generate.py`` right after it, and printed as an estimate. Also our
train step's tokens/s at the default run's shapes (the 234K-parameter model of
configs/calculator_tiny.yaml, 64 rows x 128) and at a ~48M-parameter model,
with the fraction of this machine's measured f32 matmul peak.

Peers are measured as ``--pairs`` interleaved pairs (ours, theirs, ours,
theirs, ...; the side that goes first alternates), because this 2-core
machine drifts between runs by more than the differences measured. Our side
stays a warm process, as it always was here: the engine and learner built (and
compiled) once in this process run a block of ``LEARNER_STEPS - 1`` steady
steps per pair, the same count the peers' scripts take their median over after
their compile step. Each peer run is a fresh process (another venv), whose
start-up and compile fall outside its figure. Per comparison it prints each
pair's s/step, the ratio (their s/step / ours: above 1 means ours is faster),
the median ratio and its spread (min-max); the last line is one JSON object
with those figures (see ``compare_peers.py``).

Each pair records the machine's state (load average, the CPU time other processes used
during it, from /proc) and each side's intra-op threads. A pair during which other work
used more than ``--busy-share`` (10 %) of the CPUs is marked BUSY and left out of the
median; with fewer than ``--min-clean-pairs`` (2) clean pairs left, the comparison prints
"machine busy: not a comparison" and no ratio. Both sides get ``--threads`` intra-op
threads (XLA's NPROC, torch's OMP_NUM_THREADS; default: the CPUs this process may use),
torch with ``--omp-wait-policy`` (default: unset, as torch's users run it). Beside each ratio, the FLOOR line gives each
side's s/step over the GRPO step's floor on this machine (``tunix_agentic.compare.floor``:
train FLOPs at the measured matmul peak, decode at the measured memory bandwidth).

    python -m profiling.bench_learner --pairs 5   # LEARNER_STEPS=8 LEARNER_TRAIN_REPEATS=7
    LEARNER_PEERS=0 LEARNER_BIG=0 LEARNER_STEPS=3 python -m profiling.bench_learner  # quick
    LEARNER_STEPS=4 python -m profiling.bench_learner --peers-only --pairs 3  # peers only
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from profiling.common import DECODE_STEPS, PEER_DIMS, matmul_peak_gflops
from profiling.common import PEER_NEW as NEW
from profiling.common import PEER_PROMPT as PROMPT
from profiling.pairs import (
    JAX_PY,
    NUMBER,
    PEERS,
    TORCH_PY,
    MachineSettings,
    Measurement,
    PairedComparison,
    add_machine_args,
    emit_json,
    from_pairs,
    guarded_peak,
    machine_settings,
    paired,
    print_comparison,
    process_measure,
)
from tunix_agentic.compare.floor import (
    MachinePeak,
    ModelShape,
    StepFloor,
    grpo_step_floor,
    measure_bandwidth,
    measure_matmul_flops,
)
from tunix_agentic.compare.machine import xla_threads
from tunix_agentic.config import load_config
from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams
from tunix_agentic.learners.batching import pad_rows
from tunix_agentic.learners.grpo import GRPOConfig, GRPOLearner
from tunix_agentic.learners.state import OptimizerConfig
from tunix_agentic.models.transformer import ModelConfig, Transformer, count_params

STEPS = int(os.environ.get("LEARNER_STEPS", 8))  # step 1 compiles and is not counted
PAIRS = int(os.environ.get("LEARNER_PAIRS", 5))
N_PROMPTS = int(os.environ.get("LEARNER_PROMPTS", 4))
G = int(os.environ.get("LEARNER_G", 4))
TRAIN_REPEATS = int(os.environ.get("LEARNER_TRAIN_REPEATS", 7))
RUN_PEERS = os.environ.get("LEARNER_PEERS", "1") != "0"
RUN_BIG = os.environ.get("LEARNER_BIG", "1") != "0"
BIG_ROWS = int(os.environ.get("LEARNER_BIG_ROWS", 8))
BIG_LEN = int(os.environ.get("LEARNER_BIG_LEN", 128))
# The default run's model (234K parameters, character vocab), read from its config.
DEFAULT_CONFIG = load_config(
    Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml"
)
DEFAULT_DIMS = DEFAULT_CONFIG.model
_ROLLOUT = DEFAULT_CONFIG.rollout
DEFAULT_ROWS = int(
    os.environ.get("LEARNER_DEFAULT_ROWS", _ROLLOUT.groups_per_batch * _ROLLOUT.group_size)
)
DEFAULT_LEN = int(os.environ.get("LEARNER_DEFAULT_LEN", DEFAULT_CONFIG.engine.max_seq_len))

BIG_DIMS = ModelConfig(
    vocab_size=32000,
    d_model=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=4,
    head_dim=64,
    ffn_dim=2048,
    rope_theta=1_000_000.0,
    qk_norm=True,
)
PEER_GRPO = GRPOConfig(
    optimizer=OptimizerConfig(learning_rate=1e-5, b2=0.999),  # AdamW, as TRL/Tunix default
    aggregation="token_mean",
    kl_coef=0.04,
    # The peers compute no collapse diagnostic; its cost is printed on its own line.
    mi_pairs=0,
)


# ------------------------------------------------------------------ helpers
def median_s(times: list[float]) -> float:
    return statistics.median(times) if times else float("nan")


def train_flops(cfg: ModelConfig, n_params: int, rows: int, length: int, ref: bool) -> float:
    """Matmul FLOPs of one train step over ``rows x length`` padded tokens.

    Forward: 2 x (parameters less the input embedding) per token, plus the LM head
    when tied (2 V d), plus attention's two [T, T] products (computed in full, masked);
    backward twice the forward; the reference model one more forward.
    """
    embed = cfg.vocab_size * cfg.d_model
    dense = 2 * (n_params - embed) + (2 * embed if cfg.tie_embeddings else 0)
    attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length
    fwd = rows * length * (dense + attn)
    return fwd * (3 + (1 if ref else 0))


def random_batch(cfg: ModelConfig, rows: int, length: int, seed: int = 0) -> dict:
    """A learner batch of ``rows`` full-length rows: a 1/3 prompt, the rest the completion."""
    rng = np.random.default_rng(seed)
    prompt = max(1, length // 3)
    out = []
    for _ in range(rows):
        mask = np.zeros(length, np.float32)
        mask[prompt:] = 1.0
        old = np.where(mask > 0, -np.log(cfg.vocab_size), 0.0).astype(np.float32)
        ids = rng.integers(1, cfg.vocab_size, length).astype(np.int32)
        out.append({"input_ids": ids, "loss_mask": mask, "old_logprobs": old})
    batch = pad_rows(out, pad_id=0, length_multiple=length)
    return batch.replace(advantages=rng.standard_normal(rows).astype(np.float32))


def time_train(learner: GRPOLearner, batch: dict, repeats: int) -> tuple[float, float]:
    """(first call incl. compile, median of ``repeats`` more) seconds of ``train_step``."""
    t = time.perf_counter()
    learner.train_step(batch)  # returns floats, so this waits for the device
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        learner.train_step(batch)
        times.append(time.perf_counter() - t)
    return first, median_s(times)


# --------------------------------------------------------------- full step
def even_reward(ids: list[int]) -> float:
    """The peers' reward: the fraction of completion tokens whose id is even."""
    return sum(1 for i in ids if i % 2 == 0) / max(len(ids), 1)


def step_prompts(step: int) -> list[list[int]]:
    rng = np.random.default_rng(1000 + step)
    return [
        [1] + rng.integers(4, PEER_DIMS.vocab_size, PROMPT - 1).tolist() for _ in range(N_PROMPTS)
    ]


async def grpo_step(engine: JaxEngine, learner: GRPOLearner, step: int) -> dict[str, float]:
    advantage_fn = learner.advantage_fn
    t0 = time.perf_counter()
    requests = [p for p in step_prompts(step) for _ in range(G)]
    outs = await asyncio.gather(
        *(
            engine.generate(
                p,
                SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=NEW, seed=step * 64 + i),
            )
            for i, p in enumerate(requests)
        )
    )
    t1 = time.perf_counter()
    rows, rewards = [], []
    for p, out in zip(requests, outs, strict=True):
        n = len(out.token_ids)
        mask = np.r_[np.zeros(len(p)), np.ones(n)].astype(np.float32)
        old = np.r_[np.zeros(len(p)), out.logprobs].astype(np.float32)
        rows.append(
            {
                "input_ids": np.asarray(p + out.token_ids, np.int32),
                "loss_mask": mask,
                "old_logprobs": old,
            }
        )
        rewards.append(even_reward(out.token_ids))
    adv = np.concatenate(
        [
            advantage_fn(np.asarray(rewards[g * G : (g + 1) * G], np.float32))
            for g in range(N_PROMPTS)
        ]
    )
    # Padded as the trainer pads (learner.length_bucket, geometric widths).
    batch = pad_rows(rows, pad_id=0, length_multiple=learner.config.length_bucket, geometric=True)
    batch = batch.replace(advantages=adv.astype(np.float32))
    metrics = learner.train_step(batch)
    t2 = time.perf_counter()
    await engine.update_weights(learner.params_for_engine(), version=step)
    t3 = time.perf_counter()
    return {
        "total": t3 - t0,
        "generate": t1 - t0,
        "train": t2 - t1,
        "sync": t3 - t2,
        "gen_tokens": sum(len(o.token_ids) for o in outs),
        "width": batch.input_ids.shape[1],
        "loss": metrics["loss"],
        "ref_kl_nats": metrics.get("ref_kl_nats", 0.0),
    }


@dataclasses.dataclass
class OursGRPO:
    """Our engine and learner at the peers' shapes, kept warm for the paired blocks."""

    engine: JaxEngine
    learner: GRPOLearner
    next_step: int = 1
    last_width: int = PROMPT + NEW  # the width the trainer padded the last batch to

    async def steps(self, n: int) -> list[dict[str, float]]:
        out = []
        for _ in range(n):
            out.append(await grpo_step(self.engine, self.learner, self.next_step))
            self.last_width = int(out[-1]["width"])
            self.next_step += 1
        return out


def split_medians(steps: list[dict[str, float]]) -> dict[str, float]:
    return {k: median_s([s[k] for s in steps]) for k in ("total", "generate", "train", "sync")}


async def ours_full(peak: float) -> tuple[dict[str, float], OursGRPO]:
    model = Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    n_params = count_params(model)
    engine = JaxEngine(
        model,
        EngineConfig(max_slots=N_PROMPTS * G, max_seq_len=PROMPT + NEW, decode_steps=DECODE_STEPS),
    )
    learner = GRPOLearner(model, PEER_GRPO)
    print(
        f"model: {n_params:,} parameters; {jax.devices()}; f32 matmul peak {peak:.1f} GFLOP/s; "
        f"{N_PROMPTS}x{G} completions of {NEW} tokens after {PROMPT}-token prompts, kl 0.04"
    )
    ours = OursGRPO(engine, learner)
    steps = await ours.steps(STEPS)
    first, steady = steps[0], steps[1:] or steps
    all_full = all(s["gen_tokens"] == N_PROMPTS * G * NEW for s in steps)
    fig = split_medians(steady)
    print(
        f"RESULT ours_grpo {N_PROMPTS}x{G} P={PROMPT} C={NEW} beta=0.04: {fig['total']:.3f} s/step "
        f"(median of steps 2..{STEPS}), {N_PROMPTS * G * NEW / fig['total']:,.0f} completion tok/s, "
        f"first step {first['total']:.2f}s"
    )
    print(
        f"RESULT ours_grpo split: generate {fig['generate']:.3f}s ({100 * fig['generate'] / fig['total']:.0f}%), "
        f"train step {fig['train']:.3f}s ({100 * fig['train'] / fig['total']:.0f}%, rows padded to "
        f"{first['width']}), weight sync {fig['sync']:.3f}s; every completion {NEW} tokens: "
        f"{all_full}; loss {steps[-1]['loss']:+.4f}, ref_kl_nats {steps[-1]['ref_kl_nats']:.2e}"
    )
    return fig, ours


def ours_train_widths(peak: float) -> dict[int, float]:
    """The train step alone on one fixed peer-shaped batch, rows padded to 128 vs 96.

    The two widths alternate, call by call, so that load from other processes falls on both.
    """
    model = Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    n_params = count_params(model)
    learner = GRPOLearner(model, PEER_GRPO)
    rows = N_PROMPTS * G
    base = random_batch(PEER_DIMS, rows, PROMPT + NEW)
    base.loss_mask[:, :PROMPT] = 0.0
    base.loss_mask[:, PROMPT:] = 1.0
    raw = [
        {"input_ids": base.input_ids[i], "loss_mask": base.loss_mask[i], "old_logprobs": old}
        for i, old in enumerate(base.old_logprobs)
    ]
    batches, firsts, times = {}, {}, {}
    for multiple in (64, 32):
        batch = pad_rows(raw, pad_id=0, length_multiple=multiple)
        batch = batch.replace(advantages=base.advantages)
        width = batch.input_ids.shape[1]
        batches[width] = (multiple, batch)
        firsts[width], _ = time_train(learner, batch, 0)
        times[width] = []
    for _ in range(TRAIN_REPEATS):
        for width, (_, batch) in batches.items():
            t = time.perf_counter()
            learner.train_step(batch)
            times[width].append(time.perf_counter() - t)
    out = {}
    for width, (multiple, _) in batches.items():
        med = out[width] = median_s(times[width])
        frac = train_flops(PEER_DIMS, n_params, rows, width, True) / med / (peak * 1e9)
        print(
            f"RESULT ours train_step {rows}x{width} (length_multiple={multiple}, "
            f"{PROMPT + NEW} real tokens): {1e3 * med:.1f} ms (median of {TRAIN_REPEATS}, "
            f"alternating), first {firsts[width]:.2f}s, {100 * frac:.1f}% of matmul peak"
        )
    if len(out) == 2:
        (wa, ta), (wb, tb) = sorted(out.items(), reverse=True)
        print(f"RATIO train_step padded to {wa} / padded to {wb}: {ta / tb:.2f}x the time")
    # The collapse diagnostic (learner.mi_pairs, on by default every learner.mi_every-th
    # step): k*k extra forward rows, timed here on every step.
    mi = GRPOLearner(
        Transformer(PEER_DIMS, rngs=nnx.Rngs(0)),
        dataclasses.replace(PEER_GRPO, mi_pairs=4, mi_every=1),
    )
    _, batch = batches[min(batches)]
    prompts = np.arange(rows) // G  # distinct prompts per group, as in a real batch
    batch = batch.replace(input_ids=batch.input_ids.copy())
    batch.input_ids[:, 0] = 1 + prompts
    time_train(mi, batch, 0)
    plain, with_mi = [], []
    for _ in range(TRAIN_REPEATS):
        for learner_, sink in ((learner, plain), (mi, with_mi)):
            t = time.perf_counter()
            learner_.train_step(batch)
            sink.append(time.perf_counter() - t)
    ratio = median_s(with_mi) / median_s(plain)
    every = GRPOConfig().mi_every
    print(
        f"RATIO train_step with the collapse diagnostic (mi_pairs=4: 16 extra forward rows) / "
        f"without, {rows}x{min(batches)}: {ratio:.2f}x the time on a step it runs, "
        f"{1 + (ratio - 1) / every:.2f}x a step on average at the default mi_every={every}"
    )
    return out


def ours_scale(name: str, cfg: ModelConfig, rows: int, length: int, peak: float, ref: bool) -> None:
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    n_params = count_params(model)
    config = GRPOConfig(optimizer=OptimizerConfig(learning_rate=3e-4), kl_coef=0.04 if ref else 0.0)
    learner = GRPOLearner(model, config)
    batch = random_batch(cfg, rows, length)
    repeats = TRAIN_REPEATS if n_params < 10_000_000 else max(2, TRAIN_REPEATS // 3)
    first, med = time_train(learner, batch, repeats)
    frac = train_flops(cfg, n_params, rows, length, ref) / med / (peak * 1e9)
    print(
        f"RESULT ours train_step [{name}, {n_params:,} params, {rows}x{length}, kl {'0.04' if ref else 'off'}]: "
        f"{1e3 * med:.1f} ms, {rows * length / med:,.0f} tok/s (median of {repeats}), "
        f"first {first:.2f}s, {100 * frac:.1f}% of matmul peak"
    )


# ------------------------------------------------------------------ peers
def ours_measure(ours: OursGRPO, loop: asyncio.AbstractEventLoop) -> Measurement:
    """One block of steady steps of our warm engine and learner (the ours side of a pair)."""
    n = max(1, STEPS - 1)
    fig = split_medians(loop.run_until_complete(ours.steps(n)))
    line = (
        f"ours_grpo {fig['total']:.3f} s/step (median of {n} steps: generate "
        f"{fig['generate']:.3f}s, train {fig['train']:.3f}s, sync {fig['sync']:.3f}s)"
    )
    return Measurement(fig["total"], line, extra={**fig, "threads": xla_threads().to_dict()})


def trl_then_hf_generate(env: dict[str, str]) -> Measurement:
    """TRL's step, then HF ``generate`` at the same shapes right after it, for the estimate."""
    step = process_measure([TORCH_PY, str(PEERS / "bench_trl_grpo.py")], env, rf"{NUMBER} s/step")()
    gen_env = {**env, "ANCHOR_SAMPLING": "top_p", "ANCHOR_BATCH": str(N_PROMPTS * G)}
    gen = process_measure(
        [TORCH_PY, str(PEERS / "bench_hf_generate.py")], gen_env, rf"{NUMBER} gen tok/s"
    )()
    gen_s = N_PROMPTS * G * NEW / gen.value if gen.value else None
    line = step.line + (f"; then hf_generate {gen_s:.3f}s" if gen_s else "; hf_generate: no figure")
    return Measurement(
        step.value, line, extra={"gen_s": gen_s, "threads": step.extra.get("threads")}
    )


def peer_pairs(
    ours: OursGRPO,
    loop: asyncio.AbstractEventLoop,
    pairs: int,
    settings: MachineSettings,
    floor: StepFloor,
) -> tuple[list[PairedComparison], list[str]]:
    """Interleaved pairs against Tunix's GRPOLearner and TRL's GRPOTrainer (s/step), each
    pair's machine state recorded and busy pairs left out (``settings.guard``); both sides
    get ``settings.threads`` intra-op threads."""
    env = {
        **settings.env,
        "ANCHOR_GRPO_PROMPTS": str(N_PROMPTS),
        "ANCHOR_GRPO_G": str(G),
        "ANCHOR_GRPO_STEPS": str(STEPS),
        "ANCHOR_PROMPT_LEN": str(PROMPT),
        "ANCHOR_NEW_TOKENS": str(NEW),
    }
    jobs = {
        "tunix_grpo": (
            JAX_PY,
            process_measure(
                [JAX_PY, str(PEERS / "bench_tunix_grpo.py")],
                env,
                rf"{NUMBER} s/step",
                jax_side=True,
            ),
        ),
        "trl_grpo": (TORCH_PY, lambda: trl_then_hf_generate(env)),
    }
    shape = f"{N_PROMPTS}x{G}, P={PROMPT}, C={NEW}, beta 0.04"
    comparisons, skipped = [], []
    for name, (python, theirs) in jobs.items():
        if not Path(python).exists():
            print(f"skip {name}: {python} not found (bash {PEERS}/setup_venvs.sh builds it)")
            skipped.append(name)
            continue
        label = f"ours / {name} full step"
        print(f"{label}: {shape}, {pairs} pairs (ours warm in-process, theirs fresh)")
        c = paired(
            label,
            lambda: ours_measure(ours, loop),
            theirs,
            pairs,
            unit="s/step",
            higher_is_better=False,
            guard=settings.guard,
            floor=floor.total_s,
        )
        print_comparison(c)
        comparisons.append(c)
        if name == "trl_grpo":
            comparisons.extend(trl_train_estimate(c, floor.train_s))
    return comparisons, skipped


def trl_train_estimate(c: PairedComparison, floor_s: float | None) -> list[PairedComparison]:
    """Per pair: our train step vs TRL's step less HF ``generate`` (an estimate), over the
    clean pairs of ``c`` only; it stands only when ``c`` does."""
    values = [
        (o["train"], step - t["gen_s"])
        for o, step, t in zip(c.ours_extra, c.theirs, c.theirs_extra, strict=True)
        if t.get("gen_s") and step - t["gen_s"] > 0
    ]
    est = from_pairs(
        "ours train step / trl train share (estimated)",
        values,
        unit="s",
        higher_is_better=False,
        dropped=len(c.ratios) - len(values),
        busy=c.busy,
        stands=c.stands,
        states=c.states,
        threads=c.threads,
        floor=floor_s,
    )
    print(
        "ESTIMATE trl train share = TRL step - HF generate (sampled, same shapes, "
        "bench_hf_generate.py run right after it in each pair): ref forward, reward, "
        "policy fwd+bwd, AdamW; TRL's script does not split its step"
    )
    print_comparison(est)
    return [est]


# ------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--pairs", type=int, default=PAIRS, help="interleaved pairs per peer (LEARNER_PAIRS, 5)"
    )
    p.add_argument(
        "--peers-only",
        action="store_true",
        help="skip the train-step widths and scale sections",
    )
    add_machine_args(p)
    args = p.parse_args(argv)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    args.machine = machine_settings(p, args, ours_in_process=True)
    return args


def machine_peak() -> MachinePeak:
    """This machine's f32 matmul peak (the better of XLA's and NumPy's BLAS, both measured
    now) and memory read bandwidth, for the floor."""
    xla = matmul_peak_gflops() * 1e9
    blas = measure_matmul_flops()
    source = "XLA matmul" if xla >= blas else "NumPy BLAS matmul"
    return MachinePeak(max(xla, blas), measure_bandwidth(), source=f"{source}, NumPy read")


def peer_floor(peak: MachinePeak, width: int) -> StepFloor:
    """The floor of one GRPO step at the peers' shapes, rows trained at ``width``."""
    model = Transformer(PEER_DIMS, rngs=nnx.Rngs(0))
    shape = ModelShape.from_config(PEER_DIMS, count_params(model))
    return grpo_step_floor(
        shape,
        peak,
        rows=N_PROMPTS * G,
        prompt=PROMPT,
        new=NEW,
        train_length=width,
        ref=PEER_GRPO.kl_coef > 0,
        remat=PEER_GRPO.remat,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings: MachineSettings = args.machine
    print(settings.describe())
    machine = guarded_peak(machine_peak, settings.guard)
    peak = machine.flops_per_s / 1e9
    # One loop for the whole run: the engine's tasks belong to the loop it was built in.
    loop = asyncio.new_event_loop()
    try:
        ours_fig, ours = loop.run_until_complete(ours_full(peak))
        floor = peer_floor(machine, ours.last_width)
        print(
            f"FLOOR ours_grpo: {ours_fig['total']:.3f} s/step = floor ratio "
            f"{floor.ratio(ours_fig['total']):.2f}x; {machine.describe()}; GRPO step "
            f"{floor.describe()}; train step alone {ours_fig['train']:.3f} s = "
            f"{ours_fig['train'] / floor.train_s:.2f}x its floor"
        )
        if not args.peers_only:
            ours_train_widths(peak)
            ours_scale(
                "default run, calculator_tiny", DEFAULT_DIMS, DEFAULT_ROWS, DEFAULT_LEN, peak, False
            )
            if RUN_BIG:
                ours_scale("~48M", BIG_DIMS, BIG_ROWS, BIG_LEN, peak, False)
        comparisons: list[PairedComparison] = []
        skipped: list[str] = []
        if RUN_PEERS:
            comparisons, skipped = peer_pairs(ours, loop, args.pairs, settings, floor)
        else:
            print("peers skipped (LEARNER_PEERS=0)")
        loop.run_until_complete(ours.engine.close())
    finally:
        loop.close()
    return emit_json(
        "bench_learner",
        args.pairs,
        comparisons,
        skipped=skipped,
        ours_first_block_s={k: round(v, 4) for k, v in ours_fig.items()},
        machine=settings.to_dict(),
        peak=machine.to_dict(),
        floor=floor.to_dict(),
        floor_ratio_ours_first_block=round(floor.ratio(ours_fig["total"]), 3),
    )


if __name__ == "__main__":
    main()
