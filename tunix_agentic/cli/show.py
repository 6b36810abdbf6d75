"""``tunix-agentic show RUN [--step N] [--heldout] [--task ID] [--all]``: read what the agent did.

Prints the episodes a run kept in ``RUN/transcripts/`` (see
:mod:`tunix_agentic.rollout.transcripts`): those of RL step ``N`` (default: the last
step with transcripts), or with ``--heldout`` those of the held-out evaluation logged at
``N`` (default: the last). ``--task ID`` keeps the episodes of that task. Each episode
shows its reward, status and policy versions, then turn by turn the text the model
wrote, its tool calls and what the environment answered. Host-side: imports no JAX.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunix_agentic.rollout.transcripts import (
    DIRNAME,
    format_episode,
    read_records,
    terminal_safe,
    transcript_steps,
)


class ShowError(ValueError):
    """Nothing to show: the message names the path or the step, and what there is."""


def add_show(sub) -> None:
    """Register ``show`` on the CLI's sub-parsers."""
    sp = sub.add_parser("show", help="print the episodes a run kept (what the agent wrote)")
    sp.add_argument("run_dir", help="the run directory (holding transcripts/)")
    sp.add_argument(
        "--step", type=int, default=None, metavar="N", help="the RL step (default: the last)"
    )
    sp.add_argument(
        "--heldout",
        action="store_true",
        help="the held-out evaluation logged at --step instead of the training episodes",
    )
    sp.add_argument("--task", default=None, metavar="ID", help="only the episodes of this task")
    sp.add_argument(
        "--full", action="store_true", help="never cut long texts (default: 2,000 characters)"
    )
    sp.set_defaults(handler=show_command)


def select(
    run_dir: str | Path, *, step: int | None = None, heldout: bool = False, task: str | None = None
) -> tuple[int, list[dict]]:
    """The step shown and its records (see the module docstring); :class:`ShowError` when
    the run kept none there, naming the steps it has."""
    run = Path(run_dir)
    kind = "heldout" if heldout else "train"
    what = "held-out evaluations" if heldout else "RL steps"
    if not run.is_dir():
        raise ShowError(f"{run} is not a directory (give a run directory, e.g. runs/X)")
    steps = transcript_steps(run, kind)
    if not steps:
        raise ShowError(
            f"{run / DIRNAME} holds no transcripts of {what} (a run writes them from this "
            "version on; is it a run directory?)"
        )
    if step is None:
        step = steps[-1]
    elif step not in steps:
        raise ShowError(
            f"--step {step}: no transcripts of it; {what} with transcripts: {_ranges(steps)}"
        )
    records = read_records(run, kind, step)
    if task is not None:
        kept = list(dict.fromkeys(str(r.get("task_id")) for r in records))
        records = [r for r in records if str(r.get("task_id")) == task]
        if not records:
            shown = ", ".join(kept[:24]) + (f", ... ({len(kept)} in all)" if len(kept) > 24 else "")
            raise ShowError(
                f"--task {task}: no kept episode of that task at step {step}; kept there: "
                f"{shown or 'none'}"
            )
    return step, records


def _ranges(steps: list[int]) -> str:
    """``0-3, 5, 7-9``."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def show_command(args: argparse.Namespace) -> int:
    """The ``show`` handler: the episodes on stdout and 0, or an error on stderr and 2."""
    try:
        step, records = select(args.run_dir, step=args.step, heldout=args.heldout, task=args.task)
    except ShowError as exc:
        print(f"tunix-agentic show: error: {exc}", file=sys.stderr)
        return 2
    where = "held-out evaluation at step" if args.heldout else "RL step"
    print(f"{len(records)} episodes kept of {where} {step}\n")
    limit = None if args.full else 2000
    # What the model, tools and clients wrote, with their control characters shown, not run.
    print(terminal_safe("\n\n".join(format_episode(r, limit=limit) for r in records)))
    return 0
