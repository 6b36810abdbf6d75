"""The pair machinery every peer benchmark shares: interleaved pairs of ours and a
peer's run, each pair's machine state, the busy guard, both sides' threads and the
floor, the printed RATIO / BUSY / FLOOR lines and the closing JSON.

Used by ``compare_peers``, ``bench_learner`` and ``bench_rl_workload``, with where the
peers' scripts and virtual environments are (``PEERS_DIR``, ``ANCHOR_JAX_PY``,
``ANCHOR_TORCH_PY``) and the peers' toy model as the floor arithmetic's shape. The
machine's state and the guard live in ``tunix_agentic.compare.machine``, the floor
arithmetic in ``tunix_agentic.compare.floor``. Benchmark devices only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from profiling.peers import toy_common
from tunix_agentic.compare.floor import MachinePeak, ModelShape
from tunix_agentic.compare.machine import (
    BUSY_SUMMARY,
    WAIT_POLICIES,
    BusyGuard,
    MachineState,
    Window,
    cpu_count,
    parse_threads,
    peer_env,
    thread_env,
    xla_threads,
)

NUMBER = r"([\d,]+(?:\.\d+)?)"
# The peers' scripts (profiling/peers/) and the Pythons of their venvs (setup_venvs.sh).
PEERS = Path(os.environ.get("PEERS_DIR", Path(__file__).resolve().parent / "peers"))
JAX_PY = os.environ.get("ANCHOR_JAX_PY", "/tmp/peers/venv/bin/python")
TORCH_PY = os.environ.get("ANCHOR_TORCH_PY", "/tmp/peers/venv-torch/bin/python")


def toy_shape() -> ModelShape:
    """The peers' toy model (``peers/toy_common.MODEL_DIMS``) for the floor arithmetic."""
    d = toy_common.MODEL_DIMS
    return ModelShape(
        params=toy_common.param_count(d),
        vocab_size=d["vocab_size"],
        d_model=d["d_model"],
        num_layers=d["num_layers"],
        num_heads=d["num_heads"],
        num_kv_heads=d["num_kv_heads"],
        head_dim=d["head_dim"],
        tied=d["tied_embedding"],
    )


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
    Pairs where either side printed no figure are left out of every tuple (``dropped``);
    so are pairs run while other work used more than the guard's share of the CPUs
    (``busy``; their ratios in ``busy_ratios``, never in the median). ``ours_extra`` and
    ``theirs_extra`` hold each kept pair's ``Measurement.extra``; ``states`` every measured
    pair's machine state (``MachineState.to_dict()`` plus its ``busy`` mark and ratio).
    ``stands`` is False when busy pairs left too few clean ones: then the comparison is
    "machine busy: not a comparison" and ``median`` is None.
    """

    name: str
    unit: str
    ours: tuple[float, ...]
    theirs: tuple[float, ...]
    ratios: tuple[float, ...]
    dropped: int = 0
    ours_extra: tuple[dict[str, Any], ...] = ()
    theirs_extra: tuple[dict[str, Any], ...] = ()
    higher_is_better: bool = True
    busy: int = 0
    busy_ratios: tuple[float, ...] = ()
    states: tuple[dict[str, Any], ...] = ()
    stands: bool = True
    threads: dict[str, Any] = dataclasses.field(default_factory=dict)
    # The physical floor of the figure on this machine, in ``unit`` (the least s/step, the
    # most tok/s), when the benchmark computed one.
    floor: float | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios and self.stands else None

    def floor_ratios(self) -> dict[str, float] | None:
        """Each side's median figure against the floor, as "x times the floor's time" (a
        time over the floor's, the floor's rate over a rate), None without a floor. Busy
        pairs' figures are not in it."""
        if not self.floor or not self.ours:
            return None
        out = {}
        for side, values in (("ours", self.ours), ("theirs", self.theirs)):
            med = statistics.median(values)
            out[side] = self.floor / med if self.higher_is_better else med / self.floor
        return out

    def summary(self) -> dict[str, Any]:
        """The JSON form: median ratio, min-max spread, per-pair ratios and figures."""
        floors = self.floor_ratios()
        return {
            "unit": self.unit,
            "verdict": "ok" if self.stands else BUSY_SUMMARY,
            "pairs": len(self.ratios),
            "dropped": self.dropped,
            "busy": self.busy,
            "median_ratio": _round(self.median),
            "min_ratio": _round(min(self.ratios, default=None)) if self.stands else None,
            "max_ratio": _round(max(self.ratios, default=None)) if self.stands else None,
            "ratios": [_round(r) for r in self.ratios],
            "busy_ratios": [_round(r) for r in self.busy_ratios],
            "ours": [_round(v) for v in self.ours],
            "theirs": [_round(v) for v in self.theirs],
            "ours_median": _round(statistics.median(self.ours) if self.ours else None),
            "theirs_median": _round(statistics.median(self.theirs) if self.theirs else None),
            "floor": _round(self.floor),
            "floor_ratio": {k: _round(v) for k, v in floors.items()} if floors else None,
            "machine": list(self.states),
            "threads": self.threads,
        }

    def line(self) -> str:
        """The printed RATIO line: median, spread and the per-pair ratios; or, when busy
        pairs left too few clean ones, a BUSY line with no ratio as a result."""
        busy = ""
        if self.busy:
            shares = ", ".join(
                f"{100 * s['other_share']:.0f}%" for s in self.states if s.get("busy")
            )
            busy = f"{self.busy} busy pair(s) left out (others used {shares} of the CPUs)"
        if not self.stands:
            seen = ", ".join(f"{r:.2f}" for r in self.busy_ratios + self.ratios)
            return (
                f"BUSY {self.name}: {BUSY_SUMMARY}: {busy}, {len(self.ratios)} clean; "
                f"ratios seen, not a result: {seen or 'none'}"
            )
        if not self.ratios:
            return f"RATIO {self.name}: no complete pair ({self.dropped} dropped)"
        per_pair = ", ".join(f"{r:.2f}" for r in self.ratios)
        dropped = f", {self.dropped} dropped" if self.dropped else ""
        return (
            f"RATIO {self.name}: median {self.median:.2f}x (min {min(self.ratios):.2f} - "
            f"max {max(self.ratios):.2f}) over {len(self.ratios)} interleaved pairs{dropped}"
            f"{'; ' + busy if busy else ''}; per pair: {per_pair}"
        )

    def floor_line(self) -> str | None:
        """The printed floor ratio of each side's median figure, None without a floor."""
        floors = self.floor_ratios()
        if floors is None:
            return None
        return (
            f"FLOOR {self.name}: floor ratio ours {floors['ours']:.2f}x, theirs "
            f"{floors['theirs']:.2f}x the floor's time (this machine's floor: "
            f"{self.floor:,.4g} {self.unit})"
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
    guard: BusyGuard | None = None,
    floor: float | None = None,
) -> PairedComparison:
    """Measures ``pairs`` interleaved pairs; pair i runs ours first when i is even.

    Each side's RESULT line is printed as it comes, tagged with its pair and side, and
    each pair's machine state after it. With a ``guard``, a pair during which other
    processes used more than its share of the CPUs is marked busy and left out of the
    median; without one, states are recorded and nothing is left out.
    """
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    measured: list[tuple[Measurement, Measurement, MachineState]] = []
    for i in range(pairs):
        order = (("ours", ours), ("theirs", theirs))
        if i % 2:
            order = order[::-1]
        got: dict[str, Measurement] = {}
        with Window() as window:
            for side, measure in order:
                got[side] = measure()
                print(f"  pair {i + 1}/{pairs} {side}: {got[side].line}", flush=True)
        busy = guard is not None and guard.is_busy(window.state)
        print(
            f"  pair {i + 1}/{pairs} machine: {window.state.describe()}"
            f"{' -> BUSY, left out' if busy else ''}",
            flush=True,
        )
        measured.append((got["ours"], got["theirs"], window.state))
    return judge_pairs(
        name, measured, unit=unit, higher_is_better=higher_is_better, guard=guard, floor=floor
    )


def judge_pairs(
    name: str,
    measured: Sequence[tuple[Measurement, Measurement, MachineState]],
    *,
    unit: str,
    higher_is_better: bool,
    guard: BusyGuard | None = None,
    floor: float | None = None,
) -> PairedComparison:
    """The comparison of measured pairs (ours, theirs, the machine's state over the pair):
    a pair where a side printed no figure is dropped; with a ``guard``, a busy pair is left
    out of the median, and too few clean pairs leave no result (``stands`` False)."""
    kept: list[tuple[Measurement, Measurement]] = []
    busy_values: list[tuple[float, float]] = []
    states: list[dict[str, Any]] = []
    threads: dict[str, Any] = {}
    dropped = 0
    for i, (a, b, state) in enumerate(measured):
        is_busy = guard is not None and guard.is_busy(state)
        complete = bool(a.value and b.value)
        for side, m in (("ours", a), ("theirs", b)):
            if m.extra.get("threads"):
                threads[side] = m.extra["threads"]
        states.append({"pair": i + 1, **state.to_dict(), "busy": is_busy, "complete": complete})
        if not complete:
            dropped += 1
        elif is_busy:
            busy_values.append((a.value, b.value))
        else:
            kept.append((a, b))
    stands = guard is None or guard.stands(len(kept), len(busy_values), len(measured))
    return from_pairs(
        name,
        [(a.value, b.value) for a, b in kept],
        unit=unit,
        higher_is_better=higher_is_better,
        dropped=dropped,
        ours_extra=tuple(a.extra for a, _ in kept),
        theirs_extra=tuple(b.extra for _, b in kept),
        busy=len(busy_values),
        busy_ratios=ratios_of(busy_values, higher_is_better),
        states=tuple(states),
        stands=stands,
        threads=threads,
        floor=floor,
    )


def ratios_of(values: Sequence[tuple[float, float]], higher_is_better: bool) -> tuple[float, ...]:
    """(ours, theirs) figures as ratios, above 1 when ours is faster."""
    return tuple(a / b if higher_is_better else b / a for a, b in values)


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
    return PairedComparison(
        name,
        unit,
        tuple(a for a, _ in values),
        tuple(b for _, b in values),
        ratios_of(values, higher_is_better),
        dropped,
        higher_is_better=higher_is_better,
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
    cmd: list[str],
    env: dict[str, str],
    pattern: str,
    line_marker: str = "RESULT",
    *,
    jax_side: bool = False,
) -> Callable[[], Measurement]:
    """A measurement that runs ``cmd`` in a fresh process and reads ``pattern``'s number.

    Its thread settings come back in ``extra["threads"]``: the process's own ``THREADS``
    line (the peer scripts print one), else, for ``jax_side``, XLA's pool as the process's
    environment sizes it, else the environment alone."""

    def measure() -> Measurement:
        out = run(cmd, env)
        value = figure(out, pattern)
        line = next(
            (ln for ln in out.splitlines() if ln.startswith("RESULT") and line_marker in ln),
            None,
        )
        threads = parse_threads(out)
        if threads is None:
            merged = {**os.environ, **env}
            threads = (
                xla_threads(merged).to_dict()
                if jax_side
                else {"intra_op": None, "source": "not reported", "env": thread_env(merged)}
            )
        if value is None or line is None:
            return Measurement(
                value,
                line or "no figure; output ends: " + out[-400:].strip(),
                {"threads": threads},
            )
        return Measurement(value, line, {"threads": threads})

    return measure


def guarded_peak(measure: Callable[[], MachinePeak], guard: BusyGuard) -> MachinePeak:
    """``measure()`` with the machine's state over it: measured while other work was
    busy, the peak is low and every floor from it too high, which its ``source`` says."""
    with Window() as window:
        peak = measure()
    if guard.is_busy(window.state):
        note = f"; measured while {window.state.describe()}: low, so floors from it are too high"
        print(f"WARNING peak{note}", flush=True)
        peak = dataclasses.replace(peak, source=peak.source + note)
    return peak


def print_comparison(c: PairedComparison) -> None:
    """The comparison's RATIO (or BUSY) line, each side's threads and its FLOOR line."""
    print(c.line(), flush=True)
    for side, t in c.threads.items():
        print(
            f"  threads {side}: {t.get('intra_op')} intra-op ({t.get('source')}), env {t.get('env')}"
        )
    floor = c.floor_line()
    if floor and c.stands:
        print(floor, flush=True)


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


# ------------------------------------------------------------ machine flags
@dataclasses.dataclass(frozen=True)
class MachineSettings:
    """What the machine flags chose: the busy guard, the threads each side gets and the
    environment a peer's process starts with (``peer_env``)."""

    guard: BusyGuard
    threads: int
    wait_policy: str
    env: dict[str, str]

    def describe(self) -> str:
        return (
            f"machine: {cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
            f"both sides {self.threads} intra-op threads (XLA: NPROC, torch: OMP_NUM_THREADS), "
            f"OpenMP wait policy {self.wait_policy}; {self.guard.describe()}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": cpu_count(),
            "threads": self.threads,
            "omp_wait_policy": self.wait_policy,
            "max_other_share": self.guard.max_other_share,
            "min_clean_pairs": self.guard.min_clean_pairs,
            "peer_env": self.env,
            "ours": xla_threads().to_dict(),
        }


def add_machine_args(p: argparse.ArgumentParser) -> None:
    """The flags every peer benchmark shares: the busy guard and both sides' threads."""
    p.add_argument(
        "--busy-share",
        type=float,
        default=0.10,
        help="a pair is busy, and left out, when other processes used more than this share "
        "of the CPUs during it (0.10)",
    )
    p.add_argument(
        "--min-clean-pairs",
        type=int,
        default=2,
        help="fewer clean pairs than this (or than requested) with some busy: 'machine busy: "
        "not a comparison' (2)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads on both sides (XLA's NPROC, torch's OMP_NUM_THREADS; default: "
        "the CPUs this process may use)",
    )
    p.add_argument(
        "--omp-wait-policy",
        choices=WAIT_POLICIES,
        default="default",
        help="OpenMP wait policy of the peers' processes (default: unset, as torch's users "
        "run it; passive: idle threads sleep, fairer to torch on a shared machine)",
    )


def machine_settings(
    p: argparse.ArgumentParser, args: argparse.Namespace, *, ours_in_process: bool
) -> MachineSettings:
    """The machine flags checked (``p.error`` naming the flag). With ``ours_in_process``,
    ``NPROC`` is set in this process's environment, so our side's XLA pool (created at
    JAX's first computation, after this) has the peer's thread count; else our side's
    processes get ``env`` as the peer's do."""
    if not 0 < args.busy_share <= 1:
        p.error(f"--busy-share must be in (0, 1], got {args.busy_share}")
    if args.min_clean_pairs < 1:
        p.error(f"--min-clean-pairs must be >= 1, got {args.min_clean_pairs}")
    if args.threads is not None and args.threads < 1:
        p.error(f"--threads must be >= 1, got {args.threads}")
    threads = args.threads or cpu_count()
    env = peer_env(threads, args.omp_wait_policy)
    if ours_in_process:
        os.environ["NPROC"] = str(threads)
    return MachineSettings(
        BusyGuard(args.busy_share, args.min_clean_pairs), threads, args.omp_wait_policy, env
    )
