"""CPU time and per-chip memory of a TPU recipe's train step compiled unrolled against
scanned (``model.scan_layers``), printed, never asserted.

Each form is compiled in a fresh process (``tunix_agentic.aot.compile.run_programs`` for
the recipe's topology, ``learner.train_step`` only), with the model's real dimensions
from ``tests/data/model_configs``. Prints per form: the CPU seconds of the whole run
(building the learner's programs, lowering, compiling) and of the compile as the aot
report counts it, GiB per chip (arguments, outputs, temporaries, total) and the FLOPs per
chip as the aot report counts them (op by op over the loops, each body times its trips:
the scanned form's matmuls equal the unrolled form's).

    python -m profiling.compile_scan                       # Qwen3-0.6B, v5e:1x1
    python -m profiling.compile_scan --recipe qwen3_1.7b_tpu_v5e8 --forms scanned
    python -m profiling.compile_scan --layers 4            # a cut model, quicker
    python -m profiling.compile_scan --set learner.remat=true

Needs libtpu (the ``tpu`` extra). A full-depth compile is minutes of CPU: Qwen3-1.7B's
train step unrolled took 5-9 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOPOLOGY = {"qwen3_0.6b_tpu_v5e": "v5e:1x1", "qwen3_1.7b_tpu_v5e8": "v5e:2x4"}
MODELS = {"qwen3_0.6b_tpu_v5e": "Qwen3-0.6B", "qwen3_1.7b_tpu_v5e8": "Qwen3-1.7B"}
GiB = 1 << 30


def _model_dir(recipe: str, layers: int | None, tmp: Path) -> Path:
    """The recipe's config.json, or a copy cut to ``layers`` layers."""
    src = ROOT / "tests" / "data" / "model_configs" / MODELS[recipe]
    if layers is None:
        return src
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = layers
    (tmp / "config.json").write_text(json.dumps(cfg))
    return tmp


def measure(recipe: str, form: str, layers: int | None, extra: list[str]) -> dict:
    """One form's compile of the recipe's train step (run in this process)."""
    from tunix_agentic.aot.compile import run_programs
    from tunix_agentic.config import load_config, resolve_model

    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"model.path={_model_dir(recipe, layers, Path(tmp))}",
            f"model.scan_layers={'true' if form == 'scanned' else 'false'}",
            *extra,
        ]
        cfg = resolve_model(load_config(str(ROOT / "configs" / f"{recipe}.yaml"), overrides))
        t = time.process_time()
        report = run_programs(
            cfg, TOPOLOGY[recipe], select=lambda n: n.startswith("learner.train_step")
        )
        cpu = time.process_time() - t
    (p,) = report.programs
    return {
        "form": form,
        "layers": cfg.model.num_layers,
        "cpu_s": cpu,
        "compile_s": p.compile_s,
        **{k: getattr(p, k) / GiB for k in ("arguments", "outputs", "temp", "total")},
        "tflops": p.flops / 1e12,
        "fits": p.fits,
        "name": p.name,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="qwen3_0.6b_tpu_v5e", choices=sorted(TOPOLOGY))
    ap.add_argument("--forms", default="unrolled,scanned", help="comma-separated")
    ap.add_argument("--layers", type=int, default=None, help="cut the model (default: full)")
    ap.add_argument(
        "--set", nargs="*", default=[], help="config overrides, e.g. learner.remat=true"
    )
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child process
    args = ap.parse_args()
    forms = args.forms.split(",")
    if args.one:
        print(json.dumps(measure(args.recipe, forms[0], args.layers, args.set)))
        return
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    print(f"# {args.recipe} {' '.join(args.set)} on {TOPOLOGY[args.recipe]}, train step, {stamp}")
    print("form      layers  cpu_s  compile_s  args  outs  temp  total (GiB/chip)  TFLOP  fits")
    for form in forms:
        cmd = [sys.executable, "-m", "profiling.compile_scan", "--one", "--recipe", args.recipe]
        cmd += ["--forms", form, "--set", *args.set]
        cmd += [] if args.layers is None else ["--layers", str(args.layers)]
        out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if out.returncode:
            print(f"{form}: failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['form']:9} {r['layers']:6} {r['cpu_s']:6.0f} {r['compile_s']:10.0f} "
            f"{r['arguments']:5.2f} {r['outputs']:5.2f} {r['temp']:5.2f} {r['total']:6.2f}"
            f"{'':17}{r['tflops']:6.1f}  {r['fits']}"
        )


if __name__ == "__main__":
    main()
