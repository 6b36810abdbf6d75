"""Our engine and learner beside the peers' benchmarks, measured in one run.

Runs, one after another on this machine, the peer scripts in
``../shared/peers`` (Tunix's sampler and GRPO learner in their JAX venv, HF
``generate`` and TRL's GRPOTrainer in their PyTorch venv; build the venvs with
``bash ../shared/peers/setup_venvs.sh``) and our own figures at the same dims
and workload, then prints the ratios. Peers that are not installed are
skipped with a note. Nothing is asserted.

    python profiling/compare_peers.py
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("PEERS_DIR", HERE.parents[1] / "shared" / "peers"))
JAX_PY = os.environ.get("ANCHOR_JAX_PY", "/tmp/peers/venv/bin/python")
TORCH_PY = os.environ.get("ANCHOR_TORCH_PY", "/tmp/peers/venv-torch/bin/python")
NUMBER = r"([\d,]+(?:\.\d+)?)"


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 600) -> str:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    return proc.stdout + proc.stderr


def figure(text: str, pattern: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


def main() -> None:
    for mode in ("greedy", "top_p"):
        compare(mode)


def compare(mode: str) -> None:
    """One sampling mode: greedy, or the peers' top_p mode (temperature 1, top_p 1.0)."""
    figures: dict[str, float] = {}
    ours = run(
        [sys.executable, str(HERE / "bench_engine.py")],
        env={"ENGINE_BATCHES": "16", "ENGINE_SAMPLING": mode},
    )
    figures["ours"] = figure(ours, rf"engine\[{mode}\] B=16 .*?: {NUMBER} gen tok/s")
    print(
        next(
            (line for line in ours.splitlines() if "B=16" in line and line.startswith("RESULT")),
            ours[-500:],
        )
    )
    peers = [
        ("tunix_sampler", JAX_PY, "bench_tunix_sampler.py"),
        ("hf_generate", TORCH_PY, "bench_hf_generate.py"),
    ]
    for name, python, script in peers:
        if not Path(python).exists():
            print(f"skip {name}: {python} not found (bash {PEERS}/setup_venvs.sh builds it)")
            continue
        out = run([python, str(PEERS / script)], env={"ANCHOR_SAMPLING": mode})
        figures[name] = figure(out, rf"{NUMBER} gen tok/s")
        print(next((line for line in out.splitlines() if line.startswith("RESULT")), out[-500:]))
    base = figures.get("ours")
    for name, _, _ in peers:
        if base and figures.get(name):
            print(
                f"RATIO ours / {name} ({mode}, batch 16, P=32, N=64, same run): "
                f"{base / figures[name]:.2f}x"
            )


if __name__ == "__main__":
    main()
