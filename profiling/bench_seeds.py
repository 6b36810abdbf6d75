"""The default run's headline across seeds: held-out success before/after RL, printed.

Runs the shipped recipe (``configs/calculator_tiny.yaml``) once per seed, one
after another (each takes a few minutes on 2 cores), and prints one line per
seed and the spread. Nothing is asserted: it shows whether the recipe is robust
on this machine.

    python -m profiling.bench_seeds                 # seeds 0-9
    python -m profiling.bench_seeds --seeds 0,3 rl.steps=30
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tunix_agentic.trainer import train

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "calculator_tiny.yaml"


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9", help="comma-separated seeds")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-seeds-") as tmp:
        for seed in seeds:
            result = train(
                args.config,
                [*args.overrides, f"seed={seed}", f"run_dir={Path(tmp) / f'seed{seed}'}"],
                progress=False,
            )
            rows.append(
                {
                    "seed": seed,
                    "before": result.success_before,
                    "after": result.success_after,
                    "seconds": result.seconds,
                }
            )
            print(f"seed {seed}: {result.summary()}", flush=True)
    after = [r["after"] for r in rows]
    print(
        f"held-out success after RL over {len(rows)} seeds: min {min(after):.2f}, "
        f"max {max(after):.2f}; longest run {max(r['seconds'] for r in rows):.0f}s"
    )
    return rows


if __name__ == "__main__":
    main()
