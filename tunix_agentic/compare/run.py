"""``tunix-agentic compare``: our pipeline and TRL's ``GRPOTrainer`` on the same model,
tasks, reward and settings, side by side.

Each side trains in a process of its own (JAX in one, torch in the other), one after the
other; then the first batch ours trained on goes through both losses on the initial
weights (:mod:`tunix_agentic.compare.parity`). Both policies are evaluated on the same
held-out tasks before RL and after every step. Settings of ours that TRL has no
counterpart of are fixed (:data:`OURS_FIXED`, printed). The output directory gets
``compare.json``, ``compare.md`` and, with matplotlib, ``compare.png``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tunix_agentic.compare.batch import ParityBatch
from tunix_agentic.compare.machine import (
    BUSY_SUMMARY,
    BusyGuard,
    Window,
    cpu_count,
    machine_name,
    peer_env,
)
from tunix_agentic.compare.mapping import trl_mapping
from tunix_agentic.compare.parity import judge
from tunix_agentic.compare.report import CompareResult, write_report
from tunix_agentic.config import ConfigError, RunConfig, load_config

PEERS = ("trl",)
# Why ``--against tunix`` stops, and what it would take (checked against google-tunix 0.1.7).
TUNIX_NOT_BUILT = (
    "--against tunix is not built: google-tunix 0.1.7 cannot run this model as it is. Its "
    "Llama 3 model (tunix.models.llama3) loads SmolLM2's safetensors "
    "(params.create_model_from_safe_tensors with SmolLM2's dims and weight_tying=True), "
    "but its attention calls apply_rope without the config's rope_theta, so every model "
    "gets RoPE base 1,000,000; SmolLM2 needs 100,000 (measured: logits up to 5.2 apart "
    "from transformers' on 12 tokens, 83 % of next-token argmaxes equal; with the base "
    "patched to 100,000 they agree within 2e-4). Needed: a Tunix that passes rope_theta "
    "(or a patch of tunix.models.llama3.model.apply_rope), then a Tunix side in a "
    "process of its virtual environment: an RLCluster (its vanilla sampler, an optax "
    "optimizer, a mesh, the HF tokenizer) under tunix.rl.grpo's GRPOLearner, our "
    "environment's reward as a Tunix reward function on the single-turn form of the "
    "task, per-step timings from its metrics, held-out success per step, and the first "
    "batch through Tunix's GRPO loss. profiling/compare_peers.py and "
    "profiling/bench_learner.py time Tunix's sampler and learner meanwhile"
)
# Settings of ours that compare fixes, because TRL has no counterpart: why, by key.
OURS_FIXED = {
    "sft.steps": ("0", "the same starting weights on both sides"),
    "rollout.filter_uniform_groups": (
        "false",
        "TRL has no dynamic sampling: a filtered batch keeps only groups with reward "
        "spread, so its mean reward is not the policy's (and it generates more groups)",
    ),
    "learner.mi_pairs": ("0", "a diagnostic TRL has no counterpart of"),
}


def _worker(
    module: str,
    job: dict[str, Any],
    log: Path,
    timeout_s: float | None,
    thread_env: dict[str, str] | None = None,
) -> dict:
    """Run ``python -m module JOB`` and return the JSON it writes, with the machine's
    state over the run under ``"machine"``; RuntimeError with the log's tail when it
    fails. ``thread_env`` (``machine.peer_env``) goes into the process's environment."""
    job_path = Path(job["result"]).with_suffix(".job.json")
    job_path.write_text(json.dumps(job, indent=1))
    env = {
        **os.environ,
        "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
        **(thread_env or {}),
    }
    with open(log, "w") as err, Window() as window:
        proc = subprocess.run(
            [sys.executable, "-m", module, str(job_path)],
            stdout=err,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=timeout_s,
        )
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{module} failed (exit {proc.returncode}); {log}:\n{tail}")
    out = json.loads(Path(job["result"]).read_text())
    out["machine"] = window.state.to_dict()
    return out


def _check(cfg: RunConfig) -> None:
    if cfg.model.source != "hf":
        raise ConfigError(
            f"compare needs a Hugging Face model directory on both sides (model.source=hf, "
            f"got {cfg.model.source!r}): export the built-in model with `tunix-agentic export "
            "RUN_DIR --to DIR`, or convert one with `tunix-agentic convert`, then pass "
            "model.source=hf model.path=DIR"
        )
    if cfg.model.dtype not in ("float32", ""):
        raise ConfigError(
            f"model.dtype={cfg.model.dtype!r}: compare runs both sides in float32 "
            "(pass model.dtype=float32)"
        )


def compare(
    config: str | None,
    *,
    against: str = "trl",
    steps: int = 5,
    out_dir: str | Path = "runs/compare",
    overrides: Sequence[str] = (),
    log: Callable[[str], None] = print,
    timeout_s: float | None = None,
    heldout: int = 8,
    threads: int | None = None,
    omp_wait_policy: str = "default",
    busy_share: float = 0.10,
) -> CompareResult:
    """Run both sides for ``steps`` steps and write the report to ``out_dir``.

    ``heldout``: held-out tasks each side's policy is evaluated on before RL and after
    every step (``rl.eval_temperature``; 0: greedy, as our evaluation), 0 for none.
    ``threads``: intra-op threads of both sides (XLA's ``NPROC``, torch's
    ``OMP_NUM_THREADS``; None: the CPUs this process may use); ``omp_wait_policy``:
    OpenMP's wait policy in both processes (``passive``, ``active`` or ``default``:
    unset). The machine's state over each side's run goes into the report; when other
    processes used more than ``busy_share`` of the CPUs during either, its timing rows
    say "machine busy: not a comparison".

    Raises ValueError for an unknown ``against`` or bad steps, ConfigError for a run TRL
    cannot share (not an HF model, not float32), ImportError naming ``pip install -e
    .[compare]`` without the extra, RuntimeError with a side's log when it fails.
    """
    if against == "tunix":
        raise ValueError(TUNIX_NOT_BUILT)
    if against not in PEERS:
        raise ValueError(f"--against {against!r}: comparable peers are {', '.join(PEERS)}")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if heldout < 0:
        raise ValueError(f"--heldout must be >= 0, got {heldout}")
    if not 0 < busy_share <= 1:
        raise ValueError(f"--busy-share must be in (0, 1], got {busy_share}")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    guard = BusyGuard(busy_share, 1)
    threads = threads or cpu_count()
    thread_env = peer_env(threads, omp_wait_policy)  # ValueError naming a bad policy
    from tunix_agentic.compare.trl_side import require_trl

    require_trl()
    out = Path(out_dir)
    ours_overrides = [
        *overrides,
        f"rl.steps={steps}",
        *(f"{key}={value}" for key, (value, _) in OURS_FIXED.items()),
        f"rl.eval_tasks={heldout}",
        f"rl.eval_every={1 if heldout else 0}",  # held-out success after every step
        "rl.checkpoint_every=0",
        f"run_dir={out / 'ours'}",
    ]
    cfg = load_config(config, ours_overrides)
    _check(cfg)
    mapping = trl_mapping(cfg)
    if mapping.lora:
        import importlib.util

        if importlib.util.find_spec("peft") is None:
            raise ImportError(
                "learner.lora needs peft on TRL's side (part of the compare extra): "
                "pip install -e .[compare]"
            )
    out.mkdir(parents=True, exist_ok=True)
    log("TRL GRPOConfig from this run:")
    for line in mapping.lines():
        log(f"  {line}")
    if cfg.agent.max_turns > 1:
        log(
            f"note: the task is multi-turn (agent.max_turns={cfg.agent.max_turns}); TRL plays "
            "its single-turn form (one completion, scored by our environment's reward)"
        )
    for key, (value, why) in OURS_FIXED.items():
        log(f"ours: {key}={value} ({why})")
    for name in mapping.differences:
        log(f"known difference: {name}")

    t0 = time.perf_counter()
    log("ours: training ...")
    ours = _worker(
        "tunix_agentic.compare.ours_side",
        {
            "config": config,
            "overrides": ours_overrides,
            "batch": str(out / "first_batch.npz"),
            "result": str(out / "ours.json"),
        },
        out / "ours.log",
        timeout_s,
        thread_env,
    )
    batches = parity_batches(cfg, out)
    from tunix_agentic.compare.parity import ours_loss
    from tunix_agentic.models.hf import load_hf_model

    initial = load_hf_model(cfg.model.path, dtype="float32")
    ours_values = {name: ours_loss(initial, b, cfg.learner) for name, b in batches.items()}
    log("TRL: training ...")
    trl = _worker(
        "tunix_agentic.compare.trl_side",
        {
            "config": config,
            "overrides": ours_overrides,
            "hf_dir": cfg.model.path,
            "mapping": mapping.kwargs(),
            "lora": mapping.lora,
            "batches": {name: str(out / f"parity_{name}.npz") for name in batches},
            "out_dir": str(out / "trl"),
            "heldout": heldout,
            "result": str(out / "trl.json"),
        },
        out / "trl.log",
        timeout_s,
        thread_env,
    )
    trl_values = trl.pop("parity_losses")
    if trl.get("single_turn_why"):
        log(f"note: {trl['single_turn_why']}")
    parity = {
        name: judge(ours_values[name], trl_values[name], b, mapping) for name, b in batches.items()
    }
    result = CompareResult(
        config=str(config),
        model=str(cfg.model.path),
        steps=steps,
        mapping=mapping,
        ours=ours,
        trl=trl,
        parity=parity,
        multi_turn=cfg.agent.max_turns > 1,
        ours_fixed={k: f"{v} ({why})" for k, (v, why) in OURS_FIXED.items()},
        heldout=heldout,
        out_dir=str(out),
        machine=machine_record(ours, trl, guard, threads, omp_wait_policy),
        command=_command(config, against, steps, heldout, out, overrides),
    )
    if result.machine["verdict"] != "ok":
        log(f"{BUSY_SUMMARY}: {result.machine['why']}")
    write_report(result, out)
    for name, p in parity.items():
        log(f"{name}: {p.line()}")
    log(f"wrote {out / 'compare.md'} ({time.perf_counter() - t0:.0f} s)")
    return result


def machine_record(
    ours: dict[str, Any],
    trl: dict[str, Any],
    guard: BusyGuard,
    threads: int,
    omp_wait_policy: str,
) -> dict[str, Any]:
    """Both sides' machine states (popped from their results), their threads, and the
    verdict: ``ok``, or :data:`BUSY_SUMMARY` with why."""
    states = {name: side.pop("machine") for name, side in (("ours", ours), ("trl", trl))}
    busy = [n for n, s in states.items() if s["other_share"] > guard.max_other_share]
    why = "; ".join(
        f"other processes used {100 * states[n]['other_share']:.0f}% of the CPUs during "
        f"{n}'s run (more than {100 * guard.max_other_share:g}%)"
        for n in busy
    )
    return {
        "machine": machine_name(),
        "threads": threads,
        "omp_wait_policy": omp_wait_policy,
        "max_other_share": guard.max_other_share,
        "sides": states,
        "side_threads": {n: side.get("threads") for n, side in (("ours", ours), ("trl", trl))},
        "verdict": BUSY_SUMMARY if busy else "ok",
        "why": why,
    }


def _command(config, against, steps, heldout, out, overrides) -> str:
    extra = " ".join(overrides)
    return (
        f"tunix-agentic compare --config {config} --against {against} --steps {steps} "
        f"--heldout {heldout} --out {out}{' ' + extra if extra else ''}"
    )


def parity_batches(cfg: RunConfig, out: Path) -> dict[str, ParityBatch]:
    """The first batch ours trained on ("as_trained"), with reference logprobs from the
    initial weights when the KL term is on (what our learner's reference model gives),
    and the same rows with probe advantages +1, -1, +1, ... ("probe"): a first batch of
    an untrained model often has no reward spread, all advantages 0 and a loss of 0 on
    both sides, which checks nothing. Each is saved as ``parity_NAME.npz``."""
    first = ParityBatch.load(out / "first_batch.npz")
    if cfg.learner.kl_coef > 0:
        from tunix_agentic.compare.parity import reference_logprobs
        from tunix_agentic.models.hf import load_hf_model

        model = load_hf_model(cfg.model.path, dtype="float32")
        ref = reference_logprobs(model, first.input_ids, cfg.learner.temperature)
        first = dataclasses.replace(first, ref_logprobs=ref)
    signs = np.where(np.arange(len(first.advantages)) % 2 == 0, 1.0, -1.0).astype(np.float32)
    batches = {"as_trained": first, "probe": dataclasses.replace(first, advantages=signs)}
    for name, batch in batches.items():
        batch.save(out / f"parity_{name}.npz")
    return batches
