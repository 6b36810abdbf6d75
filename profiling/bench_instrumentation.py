"""What the run's instrumentation costs: RL step time with it on and off, printed.

"On" is the default: latency percentiles and histograms of every span
(``metrics.latency_samples``), the TensorBoard layout (``metrics.layout``) and the
Perfetto trace (``trace.enabled``). "Off" turns all three off; the always-on scalars
(span sums, counters, gauges, learner and rollout statistics) stay, as a run cannot do
without them. Both run the default recipe (configs/calculator_tiny.yaml), shortened,
through the real :class:`~tunix_agentic.trainer.Trainer`, in one process, as
interleaved pairs (on, off, then off, on, ...: the side that goes first alternates, so
a drift of the machine falls on both). The RL step time of a run is the median of
``throughput/step_s`` over its steps after the first (which compiles); each pair gives
the ratio on/off, and the median ratio with its spread is printed (goal: at most
1.03), never asserted.

    python profiling/bench_instrumentation.py
    BENCH_PAIRS=3 BENCH_RL_STEPS=12 python profiling/bench_instrumentation.py

Environment: BENCH_PAIRS (2), BENCH_RL_STEPS (10), BENCH_SFT_STEPS (200), BENCH_SEED (0).
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from common import env_int

from tunix_agentic.trainer import train

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")
OFF = ["metrics.latency_samples=0", "metrics.layout=false", "trace.enabled=false"]


def median_step_s(overrides: list[str], run_dir: Path) -> float:
    """One shortened run's median RL step time (steps after the first)."""
    result = train(CONFIG, [*overrides, f"run_dir={run_dir}"], progress=False)
    steps = [h["throughput/step_s"] for h in result.history]
    return statistics.median(steps[1:] or steps)


def main() -> dict:
    pairs = env_int("BENCH_PAIRS", 2)
    base = [
        f"rl.steps={env_int('BENCH_RL_STEPS', 10)}",
        f"sft.steps={env_int('BENCH_SFT_STEPS', 200)}",
        f"seed={env_int('BENCH_SEED', 0)}",
        "rl.eval_tasks=20",
        "rl.checkpoint_every=0",
    ]
    ratios, on_s, off_s = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        for k in range(pairs):
            order = ("on", "off") if k % 2 == 0 else ("off", "on")
            got = {}
            for side in order:
                extra = OFF if side == "off" else []
                got[side] = median_step_s([*base, *extra], Path(tmp) / f"{side}{k}")
            on_s.append(got["on"])
            off_s.append(got["off"])
            ratios.append(got["on"] / got["off"])
            print(
                f"pair {k + 1} ({order[0]} first): on {got['on']:.3f} s/step, "
                f"off {got['off']:.3f} s/step, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    summary = {
        "bench": "instrumentation",
        "pairs": pairs,
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "ratios": ratios,
        "on_step_s": on_s,
        "off_step_s": off_s,
    }
    print(
        f"RATIO instrumentation on/off RL step time: median {summary['median_ratio']:.3f} "
        f"(min {summary['min_ratio']:.3f} - max {summary['max_ratio']:.3f}; goal <= 1.03)"
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
