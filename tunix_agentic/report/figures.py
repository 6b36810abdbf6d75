"""A run's metrics, read back from ``RUN_DIR/tensorboard/metrics.jsonl``, and the figures
the verdict rests on.

:func:`load_run` reads the JSON lines the metrics sink writes (one per write:
``{"step", "wall_time", name: value, ...}``) into per-name series; an RL step's row
is the one holding ``step_time/wall_s``. :func:`extract_figures` turns the RL
steps into a :class:`Figures`: per-step means of the ``time/<span>_s`` totals, the
engine's busy / host-gap / idle shares, and each span's p95 (``latency/<span>/p95_ms``
when the run wrote it, else the mean seconds per call, ``time/<span>_s`` over
``time/<span>_count``). The first RL step is left out of the means when there are
more (it compiles).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

STEP_KEY = "step_time/wall_s"  # present in every RL step's row, and only there


class ReportError(ValueError):
    """The run directory cannot be reported on (the message names the path)."""


@dataclasses.dataclass(frozen=True)
class RunMetrics:
    """A run's metrics: ``series[name]`` is ``[(step, value), ...]`` in file order, and
    ``rl_rows`` the RL steps' rows (one dict per step, in order)."""

    run_dir: Path
    series: dict[str, list[tuple[int, float]]]
    rl_rows: list[dict[str, float]]

    def names(self, prefix: str) -> list[str]:
        """The metric names that start with ``prefix``, sorted."""
        return sorted(n for n in self.series if n.startswith(prefix))


@dataclasses.dataclass(frozen=True)
class SpanFigure:
    """One span (a tool, an environment start-up key): its seconds per RL step summed
    over all its calls, and its p95 in seconds (``quantile`` says which: ``"p95"``, or
    ``"mean"`` when the run wrote no percentiles)."""

    name: str
    seconds_per_step: float
    p95: float
    quantile: str = "p95"


@dataclasses.dataclass(frozen=True)
class Figures:
    """What the verdict is computed from: per RL step means (seconds), and shares.

    ``step_s``, ``wait_s``, ``train_s``, ``sync_s``: the learner's step and its parts
    (waiting for a batch, the train step, the weight sync). ``busy``, ``host_gap``,
    ``idle``: the engine's shares of its time per RL step, averaged (0-1). ``init_s``,
    ``model_s``, ``reward_s``: the episodes' seconds per RL step in INIT (environment
    start), model calls and EVAL (the reward), summed over episodes; ``tools`` the same
    per tool, ``startup`` per environment start-up key (``env/<key>``). ``*_p95``: the
    stage's p95 (or mean, see ``quantile``) seconds.
    """

    steps: int
    step_s: float
    wait_s: float
    train_s: float
    sync_s: float
    busy: float
    host_gap: float
    idle: float
    init_s: float = 0.0
    model_s: float = 0.0
    reward_s: float = 0.0
    init_p95: float = 0.0
    model_p95: float = 0.0
    reward_p95: float = 0.0
    tools: tuple[SpanFigure, ...] = ()
    startup: tuple[SpanFigure, ...] = ()
    quantile: str = "p95"
    train_p50_s: float = 0.0  # the median train step and the longest (compiles show here)
    train_max_s: float = 0.0


def load_run(run_dir: str | Path) -> RunMetrics:
    """Reads ``run_dir/tensorboard/metrics.jsonl``; :class:`ReportError` naming the path
    when ``run_dir`` is not a directory, the file is missing, unreadable or holds no RL
    step."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a directory (give a run directory, e.g. runs/X)")
    path = run_dir / "tensorboard" / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{path} does not exist: {run_dir} is not a run directory")
    series: dict[str, list[tuple[int, float]]] = {}
    rl_rows: list[dict[str, float]] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = int(row["step"])
            except (ValueError, KeyError, TypeError) as exc:
                if not line.endswith("\n"):
                    break  # the last line of a run killed mid-write
                raise ReportError(f"{path}:{number} is not a metrics line: {exc}") from None
            values = {
                k: float(v)
                for k, v in row.items()
                if k not in ("step", "wall_time") and isinstance(v, int | float)
            }
            for name, value in values.items():
                series.setdefault(name, []).append((step, value))
            if STEP_KEY in values:
                rl_rows.append({"step": float(step), **values})
    if not rl_rows:
        raise ReportError(
            f"{path} holds no RL step (no {STEP_KEY!r} line): run at least one RL step"
        )
    return RunMetrics(run_dir, series, rl_rows)


def steady_rows(metrics: RunMetrics) -> list[dict[str, float]]:
    """The RL steps the figures average over: all but the first (it compiles), if there
    are at least two."""
    rows = metrics.rl_rows
    return rows[1:] if len(rows) > 1 else rows


def mean_of(rows: list[dict[str, float]], name: str) -> float:
    """The mean of ``name`` over ``rows`` (a row without it counts 0)."""
    return float(np.mean([r.get(name, 0.0) for r in rows])) if rows else 0.0


def span_p95(rows: list[dict[str, float]], span: str) -> tuple[float, str]:
    """``(seconds, "p95")``: the mean over the steps that have it of
    ``latency/<span>/p95_ms``; else ``(seconds, "mean")``: the mean seconds per call (a
    span that ran once a step has no percentiles)."""
    values = [r[f"latency/{span}/p95_ms"] / 1e3 for r in rows if f"latency/{span}/p95_ms" in r]
    if values:
        return float(np.mean(values)), "p95"
    total = sum(r.get(f"time/{span}_s", 0.0) for r in rows)
    count = sum(r.get(f"time/{span}_count", 0.0) for r in rows)
    return (total / count if count else 0.0), "mean"


def _spans(metrics: RunMetrics, rows: list[dict[str, float]], prefix: str) -> list[SpanFigure]:
    names = {
        n.removeprefix("time/").removesuffix("_s")
        for n in metrics.names(f"time/{prefix}")
        if n.endswith("_s")
    }
    out = []
    for span in sorted(names):
        p95, quantile = span_p95(rows, span)
        out.append(
            SpanFigure(span.removeprefix(prefix), mean_of(rows, f"time/{span}_s"), p95, quantile)
        )
    return sorted(out, key=lambda s: -s.seconds_per_step)


def extract_figures(metrics: RunMetrics) -> Figures:
    """The :class:`Figures` of a run's RL steps (see the module docstring)."""
    rows = steady_rows(metrics)
    fractions = [
        float(np.mean([r[f"engine/{k}_fraction"] for r in rows if f"engine/{k}_fraction" in r]))
        if any(f"engine/{k}_fraction" in r for r in rows)
        else math.nan
        for k in ("busy", "host_gap", "idle")
    ]
    busy, host_gap, idle = (0.0 if math.isnan(v) else v for v in fractions)
    init_p95, quantile = span_p95(rows, "stage/init")
    train = [r["time/train_s"] for r in rows if r.get("time/train_count", 0) > 0]
    return Figures(
        steps=len(metrics.rl_rows),
        step_s=mean_of(rows, STEP_KEY),
        wait_s=mean_of(rows, "time/wait_for_batch_s"),
        train_s=mean_of(rows, "time/train_s"),
        sync_s=mean_of(rows, "time/weight_sync_s"),
        busy=busy,
        host_gap=host_gap,
        idle=idle,
        init_s=mean_of(rows, "time/stage/init_s"),
        model_s=mean_of(rows, "time/model_call_s"),
        reward_s=mean_of(rows, "time/stage/eval_s"),
        init_p95=init_p95,
        model_p95=span_p95(rows, "model_call")[0],
        reward_p95=span_p95(rows, "stage/eval")[0],
        tools=tuple(_spans(metrics, rows, "tool/")),
        startup=tuple(_spans(metrics, rows, "env/")),
        quantile=quantile,
        train_p50_s=float(np.median(train)) if train else 0.0,
        train_max_s=max(train, default=0.0),
    )
