"""The "before you book a TPU" table: Qwen3 0.6B to 8B, LoRA and full fine-tuning, on
v5e-8, v5p-8 and v6e-8, each compiled by :func:`~tunix_agentic.aot.compile.run_programs`
(the learner's train step and the engine's decode at its longest window), and one H200
by arithmetic. ``python -m tunix_agentic.aot.table [--models 0.6B,1.7B] [--out FILE]``
prints Markdown stamped with the command and the date.

The runs are ``configs/qwen3_1.7b_tpu_v5e8.yaml`` with the model swapped: the engine on
half the chips (tensor parallel), the learner on the other half (FSDP), 32 rows of 2,048
tokens, micro-batches of 4 rows, remat; full fine-tuning keeps a float32 master copy,
LoRA is rank 16.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from pathlib import Path

from tunix_agentic.aot.chips import CHIPS, GiB
from tunix_agentic.config import load_config, resolve_model

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "configs" / "qwen3_1.7b_tpu_v5e8.yaml"
MODELS = ROOT / "tests" / "data" / "model_configs"
TOPOLOGIES = {"v5e-8": "v5e:2x4", "v5p-8": "v5p:2x2x1", "v6e-8": "v6e:2x4"}
MODES = {
    "LoRA": ["learner.lora.rank=16", "learner.optimizer.master_dtype=''"],
    "full": ["learner.lora.rank=0", "learner.optimizer.master_dtype=float32"],
}


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    mode: str
    where: str
    fits: bool
    learner_gib: float
    engine_gib: float
    learner_s: float
    decode_s: float
    arithmetic: bool = False


def _meshes(chips: int) -> list[str]:
    half = chips // 2
    return [
        f"engine.mesh.tp={half}",
        "engine.mesh.fsdp=1",
        f"engine.mesh.devices='0:{half}'",
        f"learner.mesh.fsdp={half}",
        "learner.mesh.tp=1",
        f"learner.mesh.devices='{half}:{chips}'",
    ]


def compiled_row(model: str, mode: str, where: str) -> Row:
    from tunix_agentic.aot.compile import run_programs
    from tunix_agentic.aot.topology import get_topology

    topo = get_topology(TOPOLOGIES[where])
    overrides = [
        f"model.path={MODELS / f'Qwen3-{model}'}",
        *MODES[mode],
        *_meshes(len(topo.devices)),
    ]
    cfg = resolve_model(load_config(RECIPE, overrides))
    report = run_programs(
        cfg, topo, select=lambda n: n.startswith(("learner.train_step", "engine.decode"))
    )
    learner = next(p for p in report.programs if p.component == "learner")
    decode = next(p for p in report.programs if p.name.startswith("engine.decode"))
    return Row(
        model,
        mode,
        where,
        report.fits,
        learner.total / GiB,
        decode.total / GiB,
        learner.roofline_s,
        decode.roofline_s,
    )


def h200_row(model: str, mode: str) -> Row:
    """One H200 holding learner and engine, by arithmetic (no compile): the learner's state
    (bf16 weights; full: a float32 master copy and two float32 moments and float32
    gradients, 16 bytes a parameter; LoRA: the frozen bf16 weights), the engine's bf16
    weights and its KV cache; activations not counted. Step times at the chip's peak:
    8 x params x tokens (remat) plus causal attention; a decode step reads the weights and
    the full KV once."""
    from tunix_agentic.aot.programs import _causal_attention_flops, param_count

    cfg = resolve_model(load_config(RECIPE, [f"model.path={MODELS / f'Qwen3-{model}'}"]))
    mc, ec = cfg.model, cfg.engine
    n = param_count(mc)
    kv = ec.max_slots * ec.max_seq_len * 2 * mc.num_layers * mc.num_kv_heads * mc.head_dim * 2
    learner = n * (16 if mode == "full" else 2)
    engine = 2 * n + kv
    rows, length = 32, ec.max_seq_len
    per_token = 8 if mode == "full" else 6
    flops = per_token * n * rows * length + 4 * _causal_attention_flops(mc, rows, length)
    chip = CHIPS["h200"]
    return Row(
        model,
        mode,
        "1 x H200",
        learner + engine < chip.hbm,
        learner / GiB,
        engine / GiB,
        chip.roofline_s(flops, 0),
        chip.roofline_s(0, 2 * n + kv),
        arithmetic=True,
    )


def markdown(rows: list[Row], command: str) -> str:
    out = [
        f"Made by `{command}` on {datetime.date.today().isoformat()} (jax 0.10.2, libtpu "
        "0.0.42.1); GiB per chip; step times at the chip's peak (roofline), not measured.",
        "",
        "| model | training | hardware | fits | learner GiB/chip | engine decode GiB/chip "
        "| learner step (roofline) | decode step (roofline) |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        mark = " (arithmetic)" if r.arithmetic else ""
        # A learner the TPU compiler refused has no cost analysis: its GiB is what it asked.
        step = f"{r.learner_s:.2f} s" if r.learner_s > 0 else "refused"
        out.append(
            f"| Qwen3-{r.model} | {r.mode} | {r.where}{mark} | {'yes' if r.fits else '**no**'} "
            f"| {r.learner_gib:.1f} | {r.engine_gib:.1f} | {step} "
            f"| {r.decode_s * 1e3:.1f} ms |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tunix_agentic.aot.table")
    ap.add_argument("--models", default="0.6B,1.7B,4B,8B")
    ap.add_argument("--hardware", default=",".join(TOPOLOGIES))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", default=None, help="write the Markdown here too")
    args = ap.parse_args(argv)
    rows = []
    for model in args.models.split(","):
        for mode in args.modes.split(","):
            for where in args.hardware.split(","):
                rows.append(compiled_row(model, mode, where))
                print(rows[-1], file=sys.stderr, flush=True)
            rows.append(h200_row(model, mode))
    command = "python -m tunix_agentic.aot.table " + " ".join(argv or sys.argv[1:])
    text = markdown(rows, command.strip())
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
