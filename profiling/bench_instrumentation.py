"""What the run's instrumentation costs: RL step time with it on and off, printed.

"On" is the default: latency percentiles and histograms of every span
(``metrics.latency_samples``), the TensorBoard layout (``metrics.layout``) and the
Perfetto trace (``trace.enabled``). "Off" turns exactly those three off (:data:`OFF`)
and nothing else: the always-on scalars (span sums, counters, gauges, learner and
rollout statistics) stay, as a run cannot do without them, and W&B mirroring and
``--profile-steps`` are off on both sides. With percentiles off the recorder keeps no
span sample; with the trace off no span listener and no engine-clock observer is
attached (the clocks skip their notifications when nobody listens).

Both run the default recipe (configs/calculator_tiny.yaml), shortened, through the
real :class:`~tunix_agentic.trainer.Trainer`, in one process, as interleaved pairs (on,
off, then off, on, ...: the side that goes first alternates, so a drift of the machine
falls on both). Only steady-state RL steps count: the engine compiles its shapes before
RL (``engine.warmup=true``), the first ``BENCH_WARMUP_STEPS`` of a run are left out, and
so is every step during which XLA compiled anything (a new length bucket of the train
step, say), found from JAX's own compile events (``jax.monitoring``) against each
step's interval in ``metrics.jsonl``.
A run's step time is the median of ``throughput/step_s`` over its steady steps; each
pair gives the ratio on/off; the median ratio and its spread are printed (goal: at
most 1.03), never asserted. A ratio is only as good as its spread: on a machine that
drifts by more than the cost, add pairs. Each run's generated tokens per step are
printed too: the two sides should do the same work (their seeds are the same, but
which policy version samples an episode depends on timing).

    python profiling/bench_instrumentation.py
    BENCH_PAIRS=8 BENCH_RL_STEPS=24 python profiling/bench_instrumentation.py

Environment: BENCH_PAIRS (6), BENCH_RL_STEPS (16), BENCH_WARMUP_STEPS (2),
BENCH_SFT_STEPS (200), BENCH_SEED (0).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import jax
from common import env_int

from tunix_agentic.trainer import train

CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml")
# The instrumentation the issue prices, and nothing more.
OFF = ["metrics.latency_samples=0", "metrics.layout=false", "trace.enabled=false"]
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


class CompileLog:
    """Wall-clock intervals of every XLA backend compilation in this process, any thread."""

    def __init__(self) -> None:
        self.intervals: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)

    def _on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
        if event == _COMPILE_EVENT:
            end = time.time()
            with self._lock:
                self.intervals.append((end - duration_secs, end))

    def overlaps(self, start: float, end: float) -> bool:
        with self._lock:
            return any(s < end and start < e for s, e in self.intervals)


@dataclasses.dataclass
class RunFigures:
    """One run: its median steady step time, how many steps that is over, its work."""

    step_s: float
    steady: int
    steps: int
    tokens_per_step: float


def steady_steps(run_dir: Path, compiles: CompileLog, warmup: int) -> tuple[list[dict], int]:
    """The run's RL step rows (``metrics.jsonl``) past ``warmup`` in which nothing compiled,
    and how many RL steps it wrote."""
    rows = [
        row
        for row in map(json.loads, (run_dir / "tensorboard" / "metrics.jsonl").open())
        if row.get("throughput/step_s") is not None
    ]
    steady = [
        row
        for row in rows
        if row["step"] > warmup
        # A step ends as its row is written: [wall_time - step_s, wall_time].
        and not compiles.overlaps(row["wall_time"] - row["throughput/step_s"], row["wall_time"])
    ]
    return steady, len(rows)


def measure(overrides: list[str], run_dir: Path, compiles: CompileLog, warmup: int) -> RunFigures:
    """One shortened run's median steady-state RL step time."""
    train(CONFIG, [*overrides, f"run_dir={run_dir}"], progress=False)
    steady, steps = steady_steps(run_dir, compiles, warmup)
    if not steady:
        raise SystemExit(
            f"{run_dir}: no RL step past the first {warmup} ran without compiling; "
            "raise BENCH_RL_STEPS"
        )
    return RunFigures(
        step_s=statistics.median(r["throughput/step_s"] for r in steady),
        steady=len(steady),
        steps=steps,
        tokens_per_step=statistics.mean(r.get("rollout/generated_tokens", 0.0) for r in steady),
    )


def main() -> dict:
    pairs = env_int("BENCH_PAIRS", 6)
    warmup = env_int("BENCH_WARMUP_STEPS", 2)
    base = [
        f"rl.steps={env_int('BENCH_RL_STEPS', 16)}",
        f"sft.steps={env_int('BENCH_SFT_STEPS', 200)}",
        f"seed={env_int('BENCH_SEED', 0)}",
        "rl.eval_tasks=20",
        "rl.checkpoint_every=0",
        # Every engine shape compiled before RL (beside SFT), as on an accelerator: more
        # RL steps are steady. The RL steps' work is the recipe's.
        "engine.warmup=true",
    ]
    compiles = CompileLog()
    ratios: list[float] = []
    runs: dict[str, list[RunFigures]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="bench-instr-") as tmp:
        for k in range(pairs):
            order = ("on", "off") if k % 2 == 0 else ("off", "on")
            got: dict[str, RunFigures] = {}
            for side in order:
                extra = OFF if side == "off" else []
                got[side] = measure([*base, *extra], Path(tmp) / f"{side}{k}", compiles, warmup)
                runs[side].append(got[side])
            ratios.append(got["on"].step_s / got["off"].step_s)
            print(
                f"pair {k + 1} ({order[0]} first): "
                + ", ".join(
                    f"{side} {got[side].step_s:.3f} s/step over {got[side].steady} of "
                    f"{got[side].steps} steps, {got[side].tokens_per_step:.0f} tokens/step"
                    for side in ("on", "off")
                )
                + f"; ratio {ratios[-1]:.3f}",
                flush=True,
            )
    summary = {
        "bench": "instrumentation",
        "pairs": pairs,
        "warmup_steps": warmup,
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "max_ratio": max(ratios),
        "ratios": ratios,
        **{f"{side}_step_s": [r.step_s for r in rs] for side, rs in runs.items()},
        **{f"{side}_steady_steps": [r.steady for r in rs] for side, rs in runs.items()},
        **{f"{side}_tokens_per_step": [r.tokens_per_step for r in rs] for side, rs in runs.items()},
    }
    print(
        f"RATIO instrumentation on/off RL step time: median {summary['median_ratio']:.3f} "
        f"(min {summary['min_ratio']:.3f} - max {summary['max_ratio']:.3f}; goal <= 1.03)"
    )
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
