"""Our engine beside the peers' decode benchmarks, as interleaved pairs; printed, never asserted.

Runs the peer scripts in ``profiling/peers/`` (Tunix's sampler in its JAX venv,
HF ``generate`` in its PyTorch venv; ``bash profiling/peers/setup_venvs.sh`` builds
the venvs under /tmp/peers) and our ``profiling.bench_engine`` at the
same dims and workload (batch 16, 32-token prompts, 64 new tokens), for greedy
and the peers' sampled mode (temperature 1, top_p 1.0).

This 2-core machine drifts between runs by more than the differences measured,
so one run of each side, one after the other, says little. Each comparison is
``--pairs`` interleaved pairs (ours, theirs, ours, theirs, ...); within a pair
the two runs are back to back and the side that goes first alternates, so a
slow drift falls on both. Every measurement is its own fresh process (a pair is
two processes), as the peers' scripts are: they live in other venvs, and a fresh
process on our side pays the same start-up, import and first-call compile
(each script reports the median of its timed calls after a warm-up, so compile
is not in the figure). Printed per comparison: each pair's figures and ratio
(ours tok/s / theirs tok/s: above 1 means ours is faster), the median ratio,
and its spread (min-max over the pairs). The last line is one JSON object with
the same figures. Peers that are not installed are skipped with a note; a run
that prints no figure drops its pair (its output tail is printed). ``PEERS_DIR``
(the scripts), ``ANCHOR_JAX_PY`` and ``ANCHOR_TORCH_PY`` (the venvs' Pythons)
point elsewhere.

Each pair records the machine's state (``tunix_agentic.compare.machine``: load average,
the CPU time other processes used during the pair, each side's intra-op threads); a pair
during which others used more than ``--busy-share`` of the CPUs is marked BUSY and left
out of the median, and with fewer than ``--min-clean-pairs`` clean pairs the comparison
is "machine busy: not a comparison", with no ratio. Both sides get ``--threads``
intra-op threads, the peers' OpenMP ``--omp-wait-policy`` (default: unset). The FLOOR line
gives each side's figure against this machine's decode floor (weights and KV read once
a step at the measured bandwidth; ``tunix_agentic.compare.floor``). These flags and
helpers (``add_machine_args``, ``judge_pairs``) are shared by ``bench_learner`` and
``bench_rl_workload`` (they live in :mod:`profiling.pairs`).

    python -m profiling.compare_peers                   # 5 pairs, greedy and top_p
    python -m profiling.compare_peers --pairs 7 --modes greedy --repeats 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from profiling.pairs import (
    JAX_PY,
    NUMBER,
    PEERS,
    TORCH_PY,
    MachineSettings,
    add_machine_args,
    emit_json,
    guarded_peak,
    machine_settings,
    paired,
    print_comparison,
    process_measure,
    toy_shape,
)
from tunix_agentic.compare.floor import decode_floor, measure_peak

DEFAULT_PAIRS = 5


# ------------------------------------------------------------------- main
PEER_SCRIPTS = {
    "tunix_sampler": (JAX_PY, "bench_tunix_sampler.py"),
    "hf_generate": (TORCH_PY, "bench_hf_generate.py"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=DEFAULT_PAIRS, help="interleaved pairs (5)")
    p.add_argument("--modes", default="greedy,top_p", help="comma-separated: greedy, top_p (both)")
    p.add_argument(
        "--peers",
        default="tunix_sampler,hf_generate",
        help="comma-separated: tunix_sampler, hf_generate (both)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed calls per process on both sides (the scripts' default: 5)",
    )
    add_machine_args(p)
    args = p.parse_args(argv)
    args.machine = machine_settings(p, args, ours_in_process=False)
    if args.pairs < 1:
        p.error(f"--pairs must be >= 1, got {args.pairs}")
    if args.repeats is not None and args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    args.modes = [m for m in args.modes.split(",") if m]
    bad = sorted(set(args.modes) - {"greedy", "top_p"})
    if bad or not args.modes:
        p.error(f"--modes takes greedy and/or top_p, got {bad or 'nothing'}")
    args.peers = [m for m in args.peers.split(",") if m]
    bad = sorted(set(args.peers) - set(PEER_SCRIPTS))
    if bad or not args.peers:
        p.error(f"--peers takes {', '.join(PEER_SCRIPTS)}, got {bad or 'nothing'}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    settings: MachineSettings = args.machine
    print(settings.describe())
    repeats = {} if args.repeats is None else {"ENGINE_REPEATS": str(args.repeats)}
    comparisons, skipped = [], []
    for name in args.peers:
        python, _ = PEER_SCRIPTS[name]
        if not Path(python).exists():
            print(f"skip {name}: {python} not found (bash {PEERS}/setup_venvs.sh builds it)")
            skipped.append(name)
    peak = floor = None
    if len(skipped) < len(args.peers):
        peak = guarded_peak(measure_peak, settings.guard)
        rows, prompt, new = 16, 32, 64
        floor = decode_floor(toy_shape(), peak, rows=rows, prompt=prompt, new=new)
        floor_tps = rows * new / floor.total_s
        print(
            f"{peak.describe()}; decode floor of batch {rows}, P={prompt}, N={new}: "
            f"{floor.describe()} = {floor_tps:,.0f} gen tok/s"
        )
    for mode in args.modes:
        ours = process_measure(
            [sys.executable, "-m", "profiling.bench_engine"],  # from this working directory
            {"ENGINE_BATCHES": "16", "ENGINE_SAMPLING": mode, **repeats, **settings.env},
            rf"engine\[{mode}\] B=16 .*?: {NUMBER} gen tok/s",
            line_marker="B=16",
            jax_side=True,
        )
        for name in args.peers:
            if name in skipped:
                continue
            python, script = PEER_SCRIPTS[name]
            env = {"ANCHOR_SAMPLING": mode, **settings.env}
            if args.repeats is not None:
                env["ANCHOR_REPEATS"] = str(args.repeats)
            theirs = process_measure(
                [python, str(PEERS / script)],
                env,
                rf"{NUMBER} gen tok/s",
                jax_side=name == "tunix_sampler",
            )
            label = f"ours / {name} [{mode}]"
            print(f"{label}: batch 16, P=32, N=64, {args.pairs} pairs, fresh processes")
            c = paired(
                label,
                ours,
                theirs,
                args.pairs,
                unit="gen tok/s",
                higher_is_better=True,
                guard=settings.guard,
                floor=floor_tps,
            )
            print_comparison(c)
            comparisons.append(c)
    return emit_json(
        "compare_peers",
        args.pairs,
        comparisons,
        skipped=skipped,
        machine=settings.to_dict(),
        peak=peak.to_dict() if peak else None,
        floor=floor.to_dict() if floor else None,
    )


if __name__ == "__main__":
    main()
