"""RL step time with and without evaluation beside training (``rl.eval_every``), printed.

Runs the default recipe (configs/calculator_tiny.yaml), shortened, through the
real :class:`~tunix_agentic.trainer.Trainer` once per setting in one process:
``rl.eval_every=0`` (evaluation before and after RL only) and ``rl.eval_every=N``
at each ``rl.eval_priority`` asked for, with the recipe's ``rl.eval_tasks`` (200)
unless BENCH_EVAL_TASKS says otherwise. The RL step time is the median of
``step_time/wall_s`` over the steps after the first (which compiles; the median
because a shared machine's load spikes single steps); the ratio on/off is printed
(goal: within 15 %, i.e. <= 1.15), never asserted.

    python -m profiling.bench_eval_overlap
    BENCH_EVAL_EVERY=2 BENCH_PRIORITIES=high,low python -m profiling.bench_eval_overlap
    python -m profiling.bench_eval_overlap --set rollout.max_staleness=2   # any override

Environment: BENCH_RL_STEPS (8), BENCH_SFT_STEPS (200), BENCH_EVAL_TASKS (0: the recipe's),
BENCH_EVAL_EVERY (2), BENCH_PRIORITIES (high), BENCH_SEED (0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from profiling.common import env_int
from tunix_agentic.metrics import read_scalars
from tunix_agentic.trainer import train

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")


def run_once(overrides: list[str], run_dir: Path) -> dict[str, Any]:
    """One shortened run; its RL step times and what evaluation did beside training."""
    t0 = time.perf_counter()
    result = train(CONFIG, [*overrides, f"run_dir={run_dir}"], progress=False)
    scalars = read_scalars(Path(result.run_dir) / "tensorboard")
    steps = [h["step_time/wall_s"] for h in result.history]
    held = sum(v for _, v in scalars.get("count/eval/held_weight_updates_per_step", []))
    return {
        "step_s": steps,
        "median_step_s": statistics.median(steps[1:] or steps),
        "mean_step_s": statistics.mean(steps[1:] or steps),
        # Beside training: every evaluation but the one before RL and the final one.
        "evaluated_at": [s for s, _ in scalars.get("eval/wall_s", [])[1:-1]],
        "eval_wall_s": [round(v, 2) for _, v in scalars.get("eval/wall_s", [])[1:-1]],
        "skipped_at": [s for s, _ in scalars.get("eval/skipped", [])],
        # What each evaluation ran (before, beside and after RL): how long its episodes were.
        "eval_generated_tokens": [
            (s, round(v, 1)) for s, v in scalars["eval/generated_tokens_mean"]
        ],
        "eval_success": [(s, round(v, 3)) for s, v in scalars["eval/success_fraction"]],
        "held_weight_updates": held,
        "run_s": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    every = env_int("BENCH_EVAL_EVERY", 2)
    priorities = os.environ.get("BENCH_PRIORITIES", "high").split(",")
    base = [
        f"seed={env_int('BENCH_SEED', 0)}",
        f"rl.steps={env_int('BENCH_RL_STEPS', 8)}",
        f"sft.steps={env_int('BENCH_SFT_STEPS', 200)}",
        "rl.checkpoint_every=0",
        *args.set,
    ]
    if env_int("BENCH_EVAL_TASKS", 0):
        base.append(f"rl.eval_tasks={env_int('BENCH_EVAL_TASKS', 0)}")
    out: dict[str, Any] = {"overrides": base, "eval_every": every}
    with tempfile.TemporaryDirectory() as tmp:
        out["off"] = run_once([*base, "rl.eval_every=0"], Path(tmp) / "off")
        off = out["off"]
        print(
            f"off: {off['median_step_s']:.2f} s per RL step (median; mean {off['mean_step_s']:.2f})",
            flush=True,
        )
        for priority in priorities:
            on = run_once(
                [*base, f"rl.eval_every={every}", f"rl.eval_priority={priority}"],
                Path(tmp) / priority,
            )
            on["ratio"] = on["median_step_s"] / off["median_step_s"]
            out[priority] = on
            print(
                f"eval_every={every} priority={priority}: {on['median_step_s']:.2f} s per RL "
                f"step (median; mean {on['mean_step_s']:.2f}), "
                f"ratio {on['ratio']:.3f} (goal <= 1.15); evaluated at {on['evaluated_at']} "
                f"({on['eval_wall_s']} s), skipped {on['skipped_at']}, "
                f"{on['held_weight_updates']:.0f} weight updates held",
                flush=True,
            )
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
