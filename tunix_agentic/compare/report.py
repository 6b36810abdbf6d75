"""``compare.json``, ``compare.md`` and (with matplotlib) ``compare.png`` of a comparison."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tunix_agentic.compare.machine import BUSY_SUMMARY
from tunix_agentic.compare.mapping import TRLMapping
from tunix_agentic.compare.parity import LossParity
from tunix_agentic.compare.stamp import Stamp

# A float32 engine against float32 torch on the same weights: summation order only.
SAMPLER_TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class CompareResult:
    """What ``compare`` measured; ``to_dict()`` is ``compare.json``."""

    config: str
    model: str
    steps: int
    mapping: TRLMapping
    ours: dict[str, Any]  # steps (per-step figures), peak_rss_mb, wall_s, ...
    trl: dict[str, Any]
    parity: dict[str, LossParity]  # "as_trained", "probe" (see parity_batches)
    multi_turn: bool
    out_dir: str
    ours_fixed: dict[str, str] = dataclasses.field(default_factory=dict)  # key: "value (why)"
    heldout: int = 0  # held-out tasks per evaluation (0: none)
    # Each side's machine state, threads and the verdict (run.machine_record); {}: unknown.
    machine: dict[str, Any] = dataclasses.field(default_factory=dict)
    command: str = ""  # the command line that made it, for the report's figure stamp

    @property
    def busy(self) -> bool:
        """Whether other work shared the machine: timing ratios are then no comparison."""
        return self.machine.get("verdict", "ok") != "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "model": self.model,
            "steps": self.steps,
            "against": "trl",
            "mapping": self.mapping.to_dict(),
            "ours": self.ours,
            "trl": self.trl,
            "loss_parity": {name: p.to_dict() for name, p in self.parity.items()},
            "trl_plays_single_turn": self.multi_turn,
            "ours_fixed": self.ours_fixed,
            "heldout_tasks": self.heldout,
            "machine": self.machine,
            "command": self.command,
        }


def _mean(steps: list[dict[str, Any]], key: str, *, skip_first: bool = False) -> float:
    """Mean of ``key`` over steps (without the first, which compiles, when asked and
    there are others); NaN when absent."""
    rows = steps[1:] if skip_first and len(steps) > 1 else steps
    values = [float(s[key]) for s in rows if key in s and not math.isnan(float(s[key]))]
    return sum(values) / len(values) if values else math.nan


def heldout(side: dict[str, Any]) -> dict[int, float]:
    """Held-out success by step (0: before RL), keys as ints (JSON makes them strings),
    in step order (sorted as numbers: as strings "10" came before "2" and the chart's line
    went back and forth)."""
    return dict(sorted((int(k), float(v)) for k, v in side.get("heldout_success", {}).items()))


def summary(side: dict[str, Any]) -> dict[str, float]:
    """Per-side headline figures: step seconds (mean over steps after the first) and their
    parts, generated tokens per second, final and mean reward, held-out success before RL
    and at the last step evaluated, peak RSS."""
    steps = side["steps"]
    held = heldout(side)
    return {
        "heldout_before": held.get(0, math.nan),
        "heldout_last": held[max(held)] if len(held) > 1 else math.nan,
        "generation_s": _mean(steps, "generation_s", skip_first=True),
        "train_s": _mean(steps, "train_s", skip_first=True),
        "weight_sync_s": _mean(steps, "weight_sync_s", skip_first=True),
        "step_s": _mean(steps, "step_s", skip_first=True),
        "first_step_s": float(steps[0]["step_s"]) if steps else math.nan,
        "tokens_per_s": _mean(steps, "tokens_per_s", skip_first=True),
        "reward_mean": _mean(steps, "reward_mean"),
        "reward_last": float(steps[-1]["reward_mean"]) if steps else math.nan,
        "peak_rss_mb": float(side["peak_rss_mb"]),
        "wall_s": float(side["wall_s"]),
    }


def _f(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _ratio(a: float, b: float) -> str:
    return "n/a" if math.isnan(a) or math.isnan(b) or b == 0 else f"{a / b:.2f}x"


def markdown(result: CompareResult) -> str:
    ours, trl = summary(result.ours), summary(result.trl)
    lines = [
        "# tunix-agentic vs TRL (GRPOTrainer)",
        "",
        f"Config `{result.config}`, model `{result.model}`, {result.steps} steps each, "
        "each side in its own process, one after the other.",
    ]
    if result.multi_turn:
        lines += [
            "",
            "**TRL plays the single-turn form of this multi-turn task**: one completion per "
            "prompt, scored by our environment's reward for that completion.",
        ]
        if result.trl.get("single_turn_why"):
            lines.append(f"Why: {result.trl['single_turn_why']}.")
    lines += [
        "",
        "## Loss parity (first batch, initial weights)",
        "",
        *(f"- {name}: {p.line()}" for name, p in result.parity.items()),
        "",
        "`as_trained`: the batch with its own advantages; `probe`: the same rows with "
        "advantages +1, -1, +1, ... (a batch without reward spread has a loss of 0).",
        *sampler_lines(result.trl.get("sampler_logprob_gap")),
        "",
        "## Headline figures",
        "",
        *machine_lines(result),
        stamp(result),
        "| | ours (JAX) | TRL (PyTorch) | ours / TRL |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("step_s", "seconds per step (after the first)"),
        ("first_step_s", "first step s (ours compiles)"),
        ("tokens_per_s", "generated tokens per second"),
        ("reward_mean", "mean reward over steps"),
        ("reward_last", "reward, last step"),
        ("heldout_before", "held-out success before RL"),
        ("heldout_last", "held-out success, last evaluation"),
        ("generation_s", "generation s per step (ours: engine busy, overlapping)"),
        ("train_s", "training s per step"),
        ("weight_sync_s", "weight sync s per step"),
        ("peak_rss_mb", "peak RSS MB"),
        ("wall_s", "process wall s"),
    ):
        ratio = "busy" if result.busy and key in TIMING else _ratio(ours[key], trl[key])
        lines.append(f"| {label} | {_f(ours[key])} | {_f(trl[key])} | {ratio} |")
    held_ours, held_trl = heldout(result.ours), heldout(result.trl)
    if result.heldout:
        lines += [
            "",
            f"Held-out success: {result.heldout} held-out tasks per task source, the same on "
            "both sides, one completion each at `rl.eval_temperature` (0: greedy), success = "
            "reward > 0 by our environment; step 0 is before RL. Ours evaluates beside "
            "training (`rl.eval_every=1`): an evaluation holds the next weights back and "
            "pauses admission while it runs, so ours' step seconds include that; TRL's "
            "evaluation runs between steps, outside its step seconds. A step missing on "
            "ours was superseded on the engine before an evaluation could measure it.",
        ]
    lines += [
        "",
        "## Per step",
        "",
        "Ours: asynchronous (generation overlaps training; `wait` is what the step waited "
        "for its batch, `engine` the engine's busy seconds in the step, held-out evaluation's "
        "included; a device call counts when collected, so a step's figure may hold the "
        "previous step's calls, the sum over steps is exact). TRL: generation, "
        "reward and training in turn; `train` includes its old/reference logprob passes; "
        "no separate engine, so no weight sync.",
        "",
        "| step | reward ours | reward TRL | held-out ours | held-out TRL | step s ours | "
        "wait | engine | train | sync | step s TRL | gen | reward fn | train |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    if held_ours or held_trl:
        lines.append(
            f"| 0 | | | {_f(held_ours.get(0, math.nan))} | {_f(held_trl.get(0, math.nan))} "
            "| | | | | | | | | |"
        )
    for a, b in zip(result.ours["steps"], result.trl["steps"], strict=False):
        step = a["step"]
        lines.append(
            f"| {step} | {_f(a['reward_mean'])} | {_f(b['reward_mean'])} | "
            f"{_f(held_ours.get(step, math.nan))} | {_f(held_trl.get(step, math.nan))} | "
            f"{_f(a['step_s'], 2)} | {_f(a['wait_for_batch_s'], 2)} | "
            f"{_f(a.get('generation_s', math.nan), 2)} | {_f(a['train_s'], 2)} | "
            f"{_f(a['weight_sync_s'], 2)} | {_f(b['step_s'], 2)} | {_f(b['generation_s'], 2)} | "
            f"{_f(b['reward_s'], 2)} | {_f(b['train_s'], 2)} |"
        )
    lines += ["", "## Settings mapped to TRL's GRPOConfig", "", "```"]
    lines += result.mapping.lines()
    lines += ["```", ""]
    if result.ours_fixed:
        lines += ["Settings of ours fixed for the comparison:", ""]
        lines += [f"- `{k}={v}`" for k, v in result.ours_fixed.items()]
        lines.append("")
    lines += ["## Known differences for these settings", ""]
    diffs = result.mapping.to_dict()["differences"]
    lines += [f"- **{k}**: {v}" for k, v in diffs.items()] or ["- none"]
    if result.trl.get("prompt_ids_identical") is False:
        lines += [
            "- **prompt_tokens**: TRL's tokenizer does not give back our prompt ids for "
            "every prompt (it re-tokenises the rendered text)"
        ]
    return "\n".join(lines) + "\n"


# Headline rows that are times or rates: no ratio of them stands on a busy machine.
TIMING = frozenset(
    {"step_s", "first_step_s", "tokens_per_s", "generation_s", "train_s", "weight_sync_s", "wall_s"}
)


def machine_lines(result: CompareResult) -> list[str]:
    """The machine's state over each side's run, the threads each had, and the verdict."""
    m = result.machine
    if not m:
        return []
    lines = []
    if result.busy:
        lines += [f"**{BUSY_SUMMARY}** for the timing rows: {m['why']}.", ""]
    sides = []
    for name, state in m["sides"].items():
        threads = (m.get("side_threads") or {}).get(name) or {}
        sides.append(
            f"{name}: others used {100 * state['other_share']:.0f}% of {state['cpus']} CPUs over "
            f"its {state['wall_s']:.0f} s, load {state['load_start']:.2f}->{state['load_end']:.2f}, "
            f"{threads.get('intra_op', '?')} intra-op threads"
        )
    lines += [
        f"Machine: {m['machine']}; both sides {m['threads']} threads, OpenMP wait policy "
        f"{m['omp_wait_policy']}; " + "; ".join(sides) + ".",
        "",
    ]
    return lines


def stamp(result: CompareResult) -> str:
    """The figure stamp of the headline table (``tunix_agentic.compare.stamp``)."""
    import datetime

    m = result.machine
    state = "; ".join(
        f"{n} others {100 * s['other_share']:.0f}%" for n, s in m.get("sides", {}).items()
    )
    return Stamp(
        command=result.command or f"tunix-agentic compare --config {result.config}",
        date=datetime.date.today().isoformat(),
        machine=m.get("machine", "unknown"),
        extra=(("state", f"{m.get('verdict', 'not recorded')}; {state}".strip("; ")),),
    ).render()


def sampler_lines(gap: dict[str, float] | None) -> list[str]:
    """The sampler check in words: the logprobs our engine sampled the first batch's
    tokens with, against TRL's logprobs of the same tokens on the same initial weights."""
    if not gap:
        return []
    same = gap["max"] <= SAMPLER_TOLERANCE
    verdict = (
        "both sides sample from the same distribution"
        if same
        else f"over {SAMPLER_TOLERANCE:g}: the two models' distributions differ"
    )
    return [
        "",
        f"Sampler check: the logprobs our engine sampled the first batch's {gap['tokens']} "
        f"trained tokens with, against TRL's of the same tokens at its temperature: "
        f"max |gap| {gap['max']:.2e}, mean {gap['mean']:.2e} ({verdict}).",
    ]


def plot(result: CompareResult, path: Path) -> Path | None:
    """Three panels: reward (solid) and held-out success (dashed) per step for both sides
    on one chart; each step's seconds split into their parts; generated tokens per second
    with each process's peak RSS. None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5))
    sides = (("ours (JAX)", result.ours, "tab:blue"), ("TRL (PyTorch)", result.trl, "tab:orange"))
    for name, side, color in sides:
        steps = [s["step"] for s in side["steps"]]
        ax1.plot(
            steps,
            [s["reward_mean"] for s in side["steps"]],
            "o-",
            color=color,
            label=f"{name}: train reward",
        )
        held = heldout(side)
        if held:
            ax1.plot(
                list(held),
                list(held.values()),
                "s--",
                color=color,
                label=f"{name}: held-out success",
            )
        ax3.plot(
            steps,
            [s["tokens_per_s"] for s in side["steps"]],
            "o-",
            color=color,
            label=f"{name}: peak RSS {float(side['peak_rss_mb']) / 1024:.2f} GB",
        )
    ax1.set(
        xlabel="step (0: before RL)",
        ylabel="mean reward / success rate",
        title="reward and held-out success per step",
        ylim=(-0.05, 1.05),
    )
    ax1.legend(fontsize=8)
    _step_bars(ax2, result)
    ax3.set(xlabel="step", ylabel="generated tokens / s", title="generation throughput")
    ax3.set_ylim(bottom=0)
    ax3.legend(fontsize=8)
    from matplotlib.ticker import MaxNLocator

    for ax in (ax1, ax2, ax3):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _step_bars(ax, result: CompareResult) -> None:
    """Each step's seconds as stacked parts, ours (left bar) beside TRL (right bar)."""
    width = 0.38
    parts = {
        "ours": (
            ("wait_for_batch_s", "ours: wait for batch", "#9ecae1"),
            ("train_s", "ours: train", "#3182bd"),
            ("weight_sync_s", "ours: weight sync", "#08306b"),
        ),
        "trl": (
            ("generation_s", "TRL: generation", "#fdd0a2"),
            ("reward_s", "TRL: reward fn", "#fd8d3c"),
            ("train_s", "TRL: train", "#a63603"),
        ),
    }
    for offset, key, side in ((-width / 2, "ours", result.ours), (width / 2, "trl", result.trl)):
        steps = side["steps"]
        x = [s["step"] + offset for s in steps]
        bottom = [0.0] * len(steps)
        for field, label, color in parts[key]:
            h = [
                0.0 if math.isnan(float(s.get(field, math.nan))) else float(s[field]) for s in steps
            ]
            ax.bar(x, h, width, bottom=bottom, color=color, label=label)
            bottom = [b + v for b, v in zip(bottom, h, strict=True)]
        rest = [max(float(s["step_s"]) - b, 0.0) for s, b in zip(steps, bottom, strict=True)]
        ax.bar(
            x, rest, width, bottom=bottom, color="#d9d9d9", label="other" if key == "trl" else None
        )
        if key == "ours":
            ax.plot(
                x,
                [float(s.get("generation_s", math.nan)) for s in steps],
                "k_",
                markersize=12,
                label="ours: engine busy (overlaps)",
            )
    ax.set(xlabel="step", ylabel="seconds", title="seconds per step, by part")
    ax.legend(fontsize=7)


def write_report(result: CompareResult, out: Path) -> dict[str, Path]:
    """Write the comparison's files under ``out``; returns them by kind."""
    data = result.to_dict()
    data["summary"] = {"ours": summary(result.ours), "trl": summary(result.trl)}
    written = {
        "json": out / "compare.json",
        "md": out / "compare.md",
    }
    written["json"].write_text(json.dumps(data, indent=1, default=float))
    written["md"].write_text(markdown(result))
    png = plot(result, out / "compare.png")
    if png is not None:
        written["png"] = png
    return written
