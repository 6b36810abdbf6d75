"""Our engine beside the peers' decode benchmarks, as interleaved pairs; printed, never asserted.

Runs the peer scripts in ``profiling/peers/`` (Tunix's sampler in its JAX venv,
HF ``generate`` in its PyTorch venv; ``bash profiling/peers/setup_venvs.sh`` builds
the venvs under /tmp/peers) and our ``bench_engine.py`` at the
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

    python profiling/compare_peers.py                   # 5 pairs, greedy and top_p
    python profiling/compare_peers.py --pairs 7 --modes greedy --repeats 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PEERS = Path(os.environ.get("PEERS_DIR", HERE / "peers"))
JAX_PY = os.environ.get("ANCHOR_JAX_PY", "/tmp/peers/venv/bin/python")
TORCH_PY = os.environ.get("ANCHOR_TORCH_PY", "/tmp/peers/venv-torch/bin/python")
NUMBER = r"([\d,]+(?:\.\d+)?)"
DEFAULT_PAIRS = 5


# ------------------------------------------------------- shared pair helpers
@dataclasses.dataclass(frozen=True)
class Measurement:
    """One run of one side: its figure (None when it printed none), its RESULT line, and
    any other figures the caller wants back per pair (``extra``)."""

    value: float | None
    line: str
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PairedComparison:
    """Interleaved pairs of one comparison and their ratios.

    ``ratios[i]`` is ``ours[i] / theirs[i]`` when ``higher_is_better`` (throughputs),
    ``theirs[i] / ours[i]`` for times, so above 1 always means ours is faster.
    Pairs where either side printed no figure are left out of every tuple; ``ours_extra``
    and ``theirs_extra`` hold each kept pair's ``Measurement.extra``.
    """

    name: str
    unit: str
    ours: tuple[float, ...]
    theirs: tuple[float, ...]
    ratios: tuple[float, ...]
    dropped: int = 0
    ours_extra: tuple[dict[str, Any], ...] = ()
    theirs_extra: tuple[dict[str, Any], ...] = ()

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    def summary(self) -> dict[str, Any]:
        """The JSON form: median ratio, min-max spread, per-pair ratios and figures."""
        return {
            "unit": self.unit,
            "pairs": len(self.ratios),
            "dropped": self.dropped,
            "median_ratio": _round(self.median),
            "min_ratio": _round(min(self.ratios, default=None)),
            "max_ratio": _round(max(self.ratios, default=None)),
            "ratios": [_round(r) for r in self.ratios],
            "ours": [_round(v) for v in self.ours],
            "theirs": [_round(v) for v in self.theirs],
            "ours_median": _round(statistics.median(self.ours) if self.ours else None),
            "theirs_median": _round(statistics.median(self.theirs) if self.theirs else None),
        }

    def line(self) -> str:
        """The printed RATIO line: median, spread and the per-pair ratios."""
        if not self.ratios:
            return f"RATIO {self.name}: no complete pair ({self.dropped} dropped)"
        per_pair = ", ".join(f"{r:.2f}" for r in self.ratios)
        dropped = f", {self.dropped} dropped" if self.dropped else ""
        return (
            f"RATIO {self.name}: median {self.median:.2f}x (min {min(self.ratios):.2f} - "
            f"max {max(self.ratios):.2f}) over {len(self.ratios)} interleaved pairs{dropped}; "
            f"per pair: {per_pair}"
        )


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def paired(
    name: str,
    ours: Callable[[], Measurement],
    theirs: Callable[[], Measurement],
    pairs: int,
    *,
    unit: str,
    higher_is_better: bool,
) -> PairedComparison:
    """Measures ``pairs`` interleaved pairs; pair i runs ours first when i is even.

    Each side's RESULT line is printed as it comes, tagged with its pair and side.
    """
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    kept: list[tuple[Measurement, Measurement]] = []
    dropped = 0
    for i in range(pairs):
        order = (("ours", ours), ("theirs", theirs))
        if i % 2:
            order = order[::-1]
        got: dict[str, Measurement] = {}
        for side, measure in order:
            got[side] = measure()
            print(f"  pair {i + 1}/{pairs} {side}: {got[side].line}", flush=True)
        if got["ours"].value and got["theirs"].value:
            kept.append((got["ours"], got["theirs"]))
        else:
            dropped += 1
    return from_pairs(
        name,
        [(a.value, b.value) for a, b in kept],
        unit=unit,
        higher_is_better=higher_is_better,
        dropped=dropped,
        ours_extra=tuple(a.extra for a, _ in kept),
        theirs_extra=tuple(b.extra for _, b in kept),
    )


def from_pairs(
    name: str,
    values: Sequence[tuple[float, float]],
    *,
    unit: str,
    higher_is_better: bool,
    dropped: int = 0,
    **extra: Any,
) -> PairedComparison:
    """A comparison from (ours, theirs) figures already measured pair by pair."""
    ratios = tuple(a / b if higher_is_better else b / a for a, b in values)
    return PairedComparison(
        name,
        unit,
        tuple(a for a, _ in values),
        tuple(b for _, b in values),
        ratios,
        dropped,
        **extra,
    )


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 900) -> str:
    """stdout + stderr of a fresh process (a note instead when it times out)."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
        )
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout}s: {' '.join(cmd)}"
    return proc.stdout + proc.stderr


def figure(text: str, pattern: str) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1).replace(",", "")) if m else None


def process_measure(
    cmd: list[str], env: dict[str, str], pattern: str, line_marker: str = "RESULT"
) -> Callable[[], Measurement]:
    """A measurement that runs ``cmd`` in a fresh process and reads ``pattern``'s number."""

    def measure() -> Measurement:
        out = run(cmd, env)
        value = figure(out, pattern)
        line = next(
            (ln for ln in out.splitlines() if ln.startswith("RESULT") and line_marker in ln),
            None,
        )
        if value is None or line is None:
            return Measurement(value, line or "no figure; output ends: " + out[-400:].strip())
        return Measurement(value, line)

    return measure


def emit_json(bench: str, pairs: int, comparisons: Sequence[PairedComparison], **extra) -> dict:
    """Prints the closing JSON line (medians and spreads) and returns it."""
    out = {
        "bench": bench,
        "pairs_requested": pairs,
        **extra,
        "comparisons": {c.name: c.summary() for c in comparisons},
    }
    print(json.dumps(out), flush=True)
    return out


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
    args = p.parse_args(argv)
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
    repeats = {} if args.repeats is None else {"ENGINE_REPEATS": str(args.repeats)}
    comparisons, skipped = [], []
    for name in args.peers:
        python, _ = PEER_SCRIPTS[name]
        if not Path(python).exists():
            print(f"skip {name}: {python} not found (bash {PEERS}/setup_venvs.sh builds it)")
            skipped.append(name)
    for mode in args.modes:
        ours = process_measure(
            [sys.executable, str(HERE / "bench_engine.py")],
            {"ENGINE_BATCHES": "16", "ENGINE_SAMPLING": mode, **repeats},
            rf"engine\[{mode}\] B=16 .*?: {NUMBER} gen tok/s",
            line_marker="B=16",
        )
        for name in args.peers:
            if name in skipped:
                continue
            python, script = PEER_SCRIPTS[name]
            env = {"ANCHOR_SAMPLING": mode}
            if args.repeats is not None:
                env["ANCHOR_REPEATS"] = str(args.repeats)
            theirs = process_measure([python, str(PEERS / script)], env, rf"{NUMBER} gen tok/s")
            label = f"ours / {name} [{mode}]"
            print(f"{label}: batch 16, P=32, N=64, {args.pairs} pairs, fresh processes")
            c = paired(label, ours, theirs, args.pairs, unit="gen tok/s", higher_is_better=True)
            print(c.line(), flush=True)
            comparisons.append(c)
    return emit_json("compare_peers", args.pairs, comparisons, skipped=skipped)


if __name__ == "__main__":
    main()
