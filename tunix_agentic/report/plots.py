"""The report's pictures (matplotlib, Agg backend): one function per PNG, each returning
the file it wrote, or ``None`` with nothing to draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; set before pyplot is imported
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from tunix_agentic.report.figures import RunMetrics, steady_rows  # noqa: E402

STAGE_COLORS = {"stage/init": "#8c6bb1", "stage/run": "#a1d99b", "stage/eval": "#fd8d3c"}
STAGE_LABELS = {"stage/init": "INIT (env start)", "stage/run": "RUN", "stage/eval": "EVAL (reward)"}
DPI = 110


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _step_axis(ax) -> None:
    """Whole-number RL steps on the x axis."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("RL step")


def _legend_below(ax, ncol: int = 2) -> None:
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol)


def _clip_outliers(ax, steps: np.ndarray, totals: np.ndarray) -> None:
    """Caps the y axis near the bulk of the bars (a compiling step can be 10x the rest)
    and writes the value of each bar cut off above it."""
    if len(totals) < 4 or not totals.max() > 0:
        return
    top = 1.15 * float(np.percentile(totals, 90))
    if totals.max() <= 1.5 * top or top <= 0:
        return
    ax.set_ylim(0, top)
    for x, v in zip(steps, totals, strict=True):
        if v > top:
            ax.annotate(
                f"{v:.0f} s ↑",
                (x, top),
                ha="center",
                va="top",
                rotation=90,
                fontsize=7,
                xytext=(0, -3),
                textcoords="offset points",
            )


def _rl_steps(metrics: RunMetrics) -> np.ndarray:
    return np.asarray([r["step"] for r in metrics.rl_rows])


def _rl_values(metrics: RunMetrics, name: str) -> np.ndarray:
    return np.asarray([r.get(name, 0.0) for r in metrics.rl_rows])


def plot_reward(metrics: RunMetrics, path: Path) -> Path | None:
    """Mean reward and success rate (reward > 0) per task over RL steps, with the held-out
    evaluations' of each."""
    tasks = [
        n.removeprefix("rollout/success_fraction/")
        for n in metrics.names("rollout/success_fraction/")
    ]
    if not tasks and "rollout/success_fraction" not in metrics.series:
        return None
    fig, (ax_r, ax_s) = plt.subplots(1, 2, figsize=(11, 4.6))
    steps = _rl_steps(metrics)
    for task in tasks or [""]:
        suffix = f"/{task}" if task else ""
        ax_r.plot(
            steps,
            _rl_values(metrics, f"rollout/reward_mean{suffix}"),
            marker=".",
            label=task or "all",
        )
        ax_s.plot(
            steps,
            _rl_values(metrics, f"rollout/success_fraction{suffix}"),
            marker=".",
            label=f"{task or 'all'} (training rollouts)",
        )
    # The held-out evaluations: success rate (reward > 0) beside success, mean reward beside
    # reward (before this version eval/success_fraction held the mean reward).
    for ax, name in ((ax_s, "eval/success_fraction"), (ax_r, "eval/reward_mean")):
        held = metrics.series.get(name, [])
        if held:
            ax.plot(
                [s for s, _ in held],
                [v for _, v in held],
                "k*--",
                markersize=10,
                label="held-out (greedy eval)",
            )
    ax_r.set(title="Mean reward per task", xlabel="RL step", ylabel="reward")
    ax_s.set(title="Success rate per task", xlabel="RL step", ylabel="success (reward > 0)")
    ax_s.set_ylim(-0.05, 1.05)
    for ax in (ax_r, ax_s):
        ax.grid(alpha=0.3)
        _step_axis(ax)
        _legend_below(ax)
    return _save(fig, path)


def plot_step_time(metrics: RunMetrics, path: Path) -> Path:
    """Seconds per RL step, stacked: the learner's parts, and the episodes' stages."""
    steps = _rl_steps(metrics)
    fig, (ax_l, ax_e) = plt.subplots(1, 2, figsize=(12, 5.2))
    total = _rl_values(metrics, "step_time/wall_s")
    parts = {
        "waiting for a batch": _rl_values(metrics, "time/wait_for_batch_s"),
        "train step": _rl_values(metrics, "time/train_s"),
        "weight sync": _rl_values(metrics, "time/weight_sync_s"),
    }
    parts["other (eval, checkpoints, logging)"] = np.maximum(0.0, total - sum(parts.values()))
    bottom = np.zeros_like(total)
    for (label, values), color in zip(
        parts.items(), ("#fdae6b", "#3182bd", "#e6550d", "#bdbdbd"), strict=True
    ):
        ax_l.bar(steps, values, bottom=bottom, label=label, color=color)
        bottom += values
    _clip_outliers(ax_l, steps, bottom)
    ax_l.set(title="Learner: seconds per RL step", xlabel="RL step", ylabel="seconds")
    tools = [n for n in metrics.names("time/tool/") if n.endswith("_s")]
    run = _rl_values(metrics, "time/stage/run_s")
    model = _rl_values(metrics, "time/model_call_s")
    tool_sum = sum((_rl_values(metrics, n) for n in tools), np.zeros_like(run))
    episode = {
        "INIT (environment start)": _rl_values(metrics, "time/stage/init_s"),
        "RUN: model calls": model,
        **{
            f"RUN: tool {n.removeprefix('time/tool/').removesuffix('_s')}": _rl_values(metrics, n)
            for n in tools
        },
        "RUN: other": np.maximum(0.0, run - model - tool_sum),
        "EVAL (reward)": _rl_values(metrics, "time/stage/eval_s"),
    }
    bottom = np.zeros_like(run)
    colors = plt.get_cmap("tab10").colors
    for i, (label, values) in enumerate(episode.items()):
        ax_e.bar(steps, values, bottom=bottom, label=label, color=colors[i % len(colors)])
        bottom += values
    _clip_outliers(ax_e, steps, bottom)
    ax_e.set(
        title="Episodes: seconds per RL step by stage",
        xlabel="RL step",
        ylabel="seconds (summed over the step's episodes)",
    )
    for ax in (ax_l, ax_e):
        _step_axis(ax)
        _legend_below(ax)
        ax.grid(alpha=0.3, axis="y")
    return _save(fig, path)


def plot_engine(metrics: RunMetrics, path: Path) -> Path | None:
    """The engine's busy / host gap / idle shares of its time in each RL step."""
    names = ["engine/busy_fraction", "engine/host_gap_fraction", "engine/idle_fraction"]
    if not any(n in metrics.rl_rows[-1] for n in names):
        return None
    steps = _rl_steps(metrics)
    fig, ax = plt.subplots(figsize=(9, 4.4))
    ax.stackplot(
        steps,
        *(100 * _rl_values(metrics, n) for n in names),
        labels=["busy (device calls)", "host gap (work waiting on the host)", "idle (no work)"],
        colors=["#31a354", "#fd8d3c", "#d9d9d9"],
    )
    ax.set(
        title="Engine time per RL step",
        xlabel="RL step",
        ylabel="% of the step's engine time",
        ylim=(0, 100),
    )
    _step_axis(ax)
    _legend_below(ax, ncol=3)
    ax.grid(alpha=0.3)
    return _save(fig, path)


_LATENCY_ORDER = ("episode", "stage/init", "stage/run", "stage/eval", "model_call", "env_step")
_LEARNER = ("wait_for_batch", "train", "weight_sync")


def latency_table(metrics: RunMetrics) -> dict[str, dict[str, float]]:
    """``{span: {"p50", "p95", "p99"}}``: each RL step's percentile averaged over the RL
    steps that have the span (the first left out when there are more); from
    ``latency/<span>/pNN_ms`` (in seconds here), or, for a run without them, the mean seconds per call under
    all three."""
    rows = steady_rows(metrics)
    spans = {n.removeprefix("latency/").rsplit("/", 1)[0] for n in metrics.names("latency/")}
    spans |= {  # spans that ran once a step have no percentiles: their seconds per call
        n.removeprefix("time/").removesuffix("_s")
        for n in metrics.names("time/")
        if n.endswith("_s") and n.removeprefix("time/").removesuffix("_s") in _LEARNER
    }
    if not spans:  # an older run: means per call
        spans = {
            n.removeprefix("time/").removesuffix("_s")
            for n in metrics.names("time/")
            if n.endswith("_s")
        }
    wanted = [
        s for s in spans if s in _LATENCY_ORDER or s in _LEARNER or s.startswith(("tool/", "env/"))
    ]
    out: dict[str, dict[str, float]] = {}
    for span in wanted:
        qs = {}
        for q in ("p50", "p95", "p99"):
            key = f"latency/{span}/{q}_ms"
            values = [r[key] / 1e3 for r in rows if key in r]
            if values:
                qs[q] = float(np.mean(values))
        if not qs:
            total = sum(r.get(f"time/{span}_s", 0.0) for r in rows)
            count = sum(r.get(f"time/{span}_count", 0.0) for r in rows)
            if not count:
                continue
            qs = dict.fromkeys(("p50", "p95", "p99"), total / count)
        out[span] = qs

    def order(span: str) -> tuple[int, str]:
        if span in _LATENCY_ORDER:
            return (0, f"{_LATENCY_ORDER.index(span)}")
        return (1 if span.startswith(("tool/", "env/")) else 2, span)

    return dict(sorted(out.items(), key=lambda kv: order(kv[0])))


def plot_latency(
    table: dict[str, dict[str, float]], path: Path, *, means: bool = False
) -> Path | None:
    """Horizontal bars of p50 / p95 / p99 per span (log seconds); ``means``: the run
    logged no percentiles and the table holds the mean per call."""
    if not table:
        return None
    spans = list(table)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(spans) + 1.6))
    y = np.arange(len(spans))
    quantiles = (
        [("mean", "#4292c6")]
        if means
        else [("p50", "#9ecae1"), ("p95", "#4292c6"), ("p99", "#084594")]
    )
    width = 0.8 / len(quantiles)
    for i, (q, color) in enumerate(quantiles):
        key = "p50" if q == "mean" else q
        ax.barh(
            y + (i - (len(quantiles) - 1) / 2) * width,
            [max(table[s].get(key, 0.0), 1e-6) for s in spans],
            width,
            label=f"{q} per call" if means else q,
            color=color,
        )
    ax.set_yticks(y, spans)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set(
        title="Latency by stage, tool and learner part"
        + (" (mean per call: the run logged no percentiles)" if means else ""),
        xlabel="seconds (log scale)",
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)


def episode_tracks(trace: dict[str, Any], limit: int = 16) -> list[tuple[str, list[dict]]]:
    """The sampled episodes of a trace, ``[(episode id, its complete events)]``: the last
    ``limit`` finished ones to start (the run's steady state, past the first steps'
    compiles), in the order they started."""
    events = trace.get("traceEvents", [])
    pid = next(
        (
            e["pid"]
            for e in events
            if e.get("ph") == "M"
            and e.get("name") == "process_name"
            and e.get("args", {}).get("name") == "episodes"
        ),
        None,
    )
    if pid is None:
        return []
    names = {
        e["tid"]: str(e.get("args", {}).get("name", e["tid"]))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == pid
    }
    by_tid: dict[Any, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("pid") == pid and "dur" in e:
            by_tid.setdefault(e["tid"], []).append(e)
    tracks = [
        (names.get(tid, str(tid)), sorted(evs, key=lambda e: e["ts"]))
        for tid, evs in by_tid.items()
        if any(e["name"] in STAGE_COLORS for e in evs)
    ]
    finished = [t for t in tracks if any(e["name"] == "stage/eval" for e in t[1])]
    tracks = finished or tracks  # episodes the run's end cut off show only their INIT
    tracks.sort(key=lambda t: t[1][0]["ts"])
    return tracks[-limit:]


def plot_gantt(tracks: list[tuple[str, list[dict]]], path: Path) -> Path | None:
    """A bar per sampled episode: its INIT / RUN / EVAL stages, and inside RUN its model
    calls and tool calls."""
    if not tracks:
        return None
    t0 = min(evs[0]["ts"] for _, evs in tracks)
    height = 0.4 * len(tracks) + 2.2
    fig, ax = plt.subplots(figsize=(11, height))
    inner = {"model_call": ("#006d2c", "model call"), "tool/": ("black", "tool call")}
    for row, (_, evs) in enumerate(tracks):
        for e in evs:
            bar = [((e["ts"] - t0) / 1e6, max(e["dur"] / 1e6, 1e-4))]
            if e["name"] in STAGE_COLORS:
                ax.broken_barh(bar, (row - 0.4, 0.8), color=STAGE_COLORS[e["name"]])
            for prefix, (color, _) in inner.items():
                if e["name"].startswith(prefix):
                    ax.broken_barh(bar, (row - 0.15, 0.3), color=color)
    for name, color in STAGE_COLORS.items():  # legend entries
        ax.broken_barh([], (0, 0), color=color, label=STAGE_LABELS[name])
    for color, label in inner.values():
        ax.broken_barh([], (0, 0), color=color, label=label)
    ax.set_yticks(range(len(tracks)), [name for name, _ in tracks], fontsize=7)
    ax.invert_yaxis()
    ax.set(
        title=f"The last {len(tracks)} sampled episodes: INIT / RUN / EVAL, with model and "
        "tool calls",
        xlabel="seconds since the first episode shown started",
        ylabel="episode id",
    )
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.75 / height), ncol=5)
    ax.grid(alpha=0.3, axis="x")
    return _save(fig, path)
