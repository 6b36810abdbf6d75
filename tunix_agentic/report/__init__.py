"""``tunix-agentic report RUN_DIR``: a run's pictures and its bottleneck, in words.

:func:`write_report` reads ``RUN_DIR/tensorboard/metrics.jsonl`` (and the trace,
``RUN_DIR/trace/*.json.gz``, when the run wrote one) and writes into
``RUN_DIR/report/`` (or ``out``):

* ``reward.png``: reward and success per task over RL steps, and the held-out success;
* ``step_time.png``: seconds per RL step, stacked: the learner's parts (waiting for a
  batch, train step, weight sync) and the episodes' stages (INIT, model calls, each
  tool, EVAL);
* ``engine.png``: the engine's busy / host gap / idle shares per RL step;
* ``latency.png``: p50 / p95 / p99 per stage, tool and learner part;
* ``episodes.png``: a Gantt chart of the trace's sampled episodes (INIT / RUN / EVAL);
* ``report.md``: the speed verdict (:mod:`tunix_agentic.report.verdict`) and the
  learning verdict (:mod:`tunix_agentic.report.learning`), the figures they rest on, one
  success and one failure quoted from each held-out evaluation's transcripts
  (:mod:`tunix_agentic.rollout.transcripts`), the latency table and the pictures.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from tunix_agentic.report.figures import (
    Figures,
    ReportError,
    RunMetrics,
    SpanFigure,
    extract_figures,
    load_run,
)
from tunix_agentic.report.learning import (
    LearningFigures,
    LearningVerdict,
    learning_figures,
    learning_verdict,
)
from tunix_agentic.report.verdict import Verdict, verdict

__all__ = [
    "Figures",
    "LearningFigures",
    "LearningVerdict",
    "Report",
    "ReportError",
    "RunMetrics",
    "SpanFigure",
    "Verdict",
    "add_report",
    "extract_figures",
    "learning_figures",
    "learning_verdict",
    "load_run",
    "verdict",
    "write_report",
]


@dataclasses.dataclass(frozen=True)
class Report:
    """What :func:`write_report` wrote: the folder, ``report.md``, the PNGs by name
    (``reward``, ``step_time``, ``engine``, ``latency``, ``episodes``; one with nothing to
    draw is absent, and ``skipped`` says why), the figures and the speed verdict, and the
    learning verdict."""

    out_dir: Path
    markdown: Path
    pictures: dict[str, Path]
    skipped: dict[str, str]
    figures: Figures
    verdict: Verdict
    learning: LearningVerdict | None = None


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Report:
    """Writes the report of ``run_dir`` into ``out`` (default ``run_dir/report``).

    Raises :class:`ReportError` (naming the path) before writing anything when
    ``run_dir`` is not a run directory or its metrics hold no RL step.
    """
    from tunix_agentic.report import plots  # matplotlib, only when drawing

    metrics = load_run(run_dir)
    figures = extract_figures(metrics)
    found = verdict(figures)
    learned = learning_verdict(learning_figures(metrics), run_dir=metrics.run_dir)
    out_dir = Path(out) if out is not None else metrics.run_dir / "report"
    out_dir.mkdir(parents=True, exist_ok=True)
    table = plots.latency_table(metrics)
    tracks, why_no_trace = _episode_tracks(metrics.run_dir, plots)
    drawn = {
        "reward": plots.plot_reward(metrics, out_dir / "reward.png"),
        "step_time": plots.plot_step_time(metrics, out_dir / "step_time.png"),
        "engine": plots.plot_engine(metrics, out_dir / "engine.png"),
        "latency": plots.plot_latency(
            table, out_dir / "latency.png", means=not metrics.names("latency/")
        ),
        "episodes": plots.plot_gantt(tracks, out_dir / "episodes.png"),
    }
    pictures = {k: v for k, v in drawn.items() if v is not None}
    skipped = {
        "reward": "the run logged no rollout/success_fraction",
        "engine": "the run logged no engine/*_fraction",
        "latency": "the run logged no latency/* nor time/* spans",
        "episodes": why_no_trace or "the trace holds no sampled episode",
    }
    skipped = {k: why for k, why in skipped.items() if k not in pictures}
    markdown = out_dir / "report.md"
    markdown.write_text(
        _markdown(metrics, figures, found, table, pictures, skipped, learned), encoding="utf-8"
    )
    return Report(out_dir, markdown, pictures, skipped, figures, found, learned)


def _episode_tracks(run_dir: Path, plots) -> tuple[list, str | None]:
    """The sampled episodes of the run's last trace file, or ``([], why not)``."""
    from tunix_agentic.metrics.trace import read_trace

    files = sorted((run_dir / "trace").glob("*.json.gz"))
    if not files:
        return [], f"no trace in {run_dir / 'trace'} (tracing is on with trace.enabled: true)"
    try:
        return plots.episode_tracks(read_trace(files[-1])), None
    except (OSError, ValueError) as exc:
        return [], f"{files[-1]} cannot be read: {exc}"


_CAPTIONS = {
    "reward": "Reward and success per task over RL steps (training rollouts), and the "
    "held-out success (stars).",
    "step_time": "Seconds per RL step. Left: the learner's step (waiting for a batch, the "
    "train step, the weight sync). Right: where the episodes' time went (summed over the "
    "step's episodes).",
    "engine": "The engine's share of its time per RL step (mean over the steps): busy (device calls), "
    "host gap (work was waiting but the host had not launched it) and idle (no work).",
    "latency": "p50 / p95 / p99 seconds per stage, tool and learner part (each RL step's "
    "percentile, averaged over the steps).",
    "episodes": "The run's last sampled episodes (from its trace) on one time axis: INIT "
    "(environment start), RUN (dark green: model calls, black: tool calls) and EVAL (the "
    "reward).",
}


def _markdown(
    metrics: RunMetrics,
    fig: Figures,
    found: Verdict,
    table: dict[str, dict[str, float]],
    pictures: dict[str, Path],
    skipped: dict[str, str],
    learned: LearningVerdict,
) -> str:
    lines = [
        f"# Run report: {metrics.run_dir}",
        "",
        f"## Learning: {learned.kind}",
        "",
        f"What the run shows: **{learned.finding}**.",
        "",
        f"What to do: {learned.advice}.",
        "",
        f"## Verdict: {found.kind}",
        "",
        f"What holds the run back: **{found.finding}**.",
        "",
        f"What to do: {found.advice}.",
        "",
        "## Figures the verdict rests on",
        "",
        f"Per RL step, averaged over {fig.steps - 1 if fig.steps > 1 else 1} of "
        f"{fig.steps} steps (the first, which compiles, left out when there are more).",
        "",
        f"| figure | seconds per RL step | {fig.quantile} per call or episode (s) |",
        "|---|---|---|",
        f"| RL step | {fig.step_s:.3g} | |",
        f"| learner waiting for a batch | {fig.wait_s:.3g} | |",
        f"| train step (median {fig.train_p50_s:.3g} s, longest {fig.train_max_s:.3g} s) | "
        f"{fig.train_s:.3g} | |",
        f"| weight sync | {fig.sync_s:.3g} | |",
        f"| episodes: INIT (environment start) | {fig.init_s:.3g} | {fig.init_p95:.3g} |",
        f"| episodes: model calls | {fig.model_s:.3g} | {fig.model_p95:.3g} |",
        f"| episodes: EVAL (reward) | {fig.reward_s:.3g} | {fig.reward_p95:.3g} |",
    ]
    for label, spans in (("tool", fig.tools), ("environment start-up", fig.startup)):
        lines += [
            f"| episodes: {label} `{s.name}` | {s.seconds_per_step:.3g} | {s.p95:.3g} |"
            for s in spans
        ]
    lines += [
        "",
        f"Engine busy / host gap / idle per RL step: {100 * fig.busy:.0f} / "
        f"{100 * fig.host_gap:.0f} / {100 * fig.idle:.0f} %. Episode figures are summed over "
        "the step's episodes, which run at once.",
    ]
    if table:
        lines += ["", "## Latency (seconds)", "", "| span | p50 | p95 | p99 |", "|---|---|---|---|"]
        lines += [
            f"| `{span}` | {q.get('p50', 0):.4g} | {q.get('p95', 0):.4g} | {q.get('p99', 0):.4g} |"
            for span, q in table.items()
        ]
    lines += _quoted_episodes(metrics.run_dir)
    lines += ["", "## Pictures", ""]
    for name in ("reward", "step_time", "engine", "latency", "episodes"):
        if name in pictures:
            lines += [f"![{name}]({pictures[name].name})", "", _CAPTIONS[name], ""]
        else:
            lines += [f"- `{name}.png` not drawn: {skipped[name]}.", ""]
    return "\n".join(lines).rstrip() + "\n"


def _quoted_episodes(run_dir: Path) -> list[str]:
    """One success (reward > 0) and one failure quoted from each held-out evaluation's
    transcripts (none when the run kept none)."""
    from tunix_agentic.rollout.transcripts import format_episode, read_records, transcript_steps

    steps = transcript_steps(run_dir, "heldout")
    if not steps:
        return []
    lines = [
        "",
        "## What the agent did (held-out episodes)",
        "",
        "One success (reward > 0) and one failure of each held-out evaluation; "
        f"`tunix-agentic show {run_dir} --heldout --step {steps[-1]}` prints all the kept ones "
        "of the last (each evaluation's step: below).",
    ]
    for step in steps:
        records = read_records(run_dir, "heldout", step)
        kinds = {
            "success": [r for r in records if r["reward"] > 0],
            "failure": [r for r in records if r["reward"] <= 0],
        }
        for label, found in kinds.items():
            lines += ["", f"Evaluation at step {step}, a {label}:", ""]
            if not found:
                lines.append(f"(no {label} among the {len(records)} kept episodes)")
            else:
                lines += ["```", format_episode(found[0], limit=600), "```"]
    return lines


def add_report(sub) -> None:
    """Registers ``tunix-agentic report RUN_DIR [--out DIR]`` on the CLI's subparsers."""
    rp = sub.add_parser(
        "report", help="a run's pictures and bottleneck verdict (PNGs and report.md)"
    )
    rp.add_argument("run_dir", help="the run directory (holding tensorboard/metrics.jsonl)")
    rp.add_argument(
        "--out", default=None, metavar="DIR", help="where to write (default: RUN_DIR/report)"
    )
    rp.set_defaults(handler=_report_main)


def _report_main(args: argparse.Namespace) -> int:
    try:
        done = write_report(args.run_dir, args.out)
    except ReportError as exc:
        print(f"tunix-agentic: error: {exc}", file=sys.stderr)
        return 2
    # The docs' order: does it learn, then what holds it back (each with its own label once).
    print(f"does it learn? {done.learning.text}")
    print(f"what holds it back? {done.verdict.text}")
    print(f"wrote {done.markdown} and {len(done.pictures)} pictures")
    for name, why in done.skipped.items():
        print(f"  {name}.png not drawn: {why}")
    return 0
