"""``compare.json``, ``compare.md`` and (with matplotlib) ``compare.png`` of a comparison."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from tunix_agentic.compare.mapping import TRLMapping
from tunix_agentic.compare.parity import LossParity


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
        }


def _mean(steps: list[dict[str, Any]], key: str, *, skip_first: bool = False) -> float:
    """Mean of ``key`` over steps (without the first, which compiles, when asked and
    there are others); NaN when absent."""
    rows = steps[1:] if skip_first and len(steps) > 1 else steps
    values = [float(s[key]) for s in rows if key in s and not math.isnan(float(s[key]))]
    return sum(values) / len(values) if values else math.nan


def summary(side: dict[str, Any]) -> dict[str, float]:
    """Per-side headline figures: step seconds (mean over steps after the first),
    generated tokens per second, final and mean reward, peak RSS."""
    steps = side["steps"]
    return {
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
    lines += [
        "",
        "## Loss parity (first batch, initial weights)",
        "",
        *(f"- {name}: {p.line()}" for name, p in result.parity.items()),
        "",
        "`as_trained`: the batch with its own advantages; `probe`: the same rows with "
        "advantages +1, -1, +1, ... (a batch without reward spread has a loss of 0).",
        "",
        "## Headline figures",
        "",
        "| | ours (JAX) | TRL (PyTorch) | ours / TRL |",
        "|---|---|---|---|",
    ]
    for key, label in (
        ("step_s", "seconds per step (after the first)"),
        ("first_step_s", "first step s (ours compiles)"),
        ("tokens_per_s", "generated tokens per second"),
        ("reward_mean", "mean reward over steps"),
        ("reward_last", "reward, last step"),
        ("peak_rss_mb", "peak RSS MB"),
        ("wall_s", "process wall s"),
    ):
        lines.append(
            f"| {label} | {_f(ours[key])} | {_f(trl[key])} | {_ratio(ours[key], trl[key])} |"
        )
    lines += [
        "",
        "## Per step",
        "",
        "Ours: asynchronous (generation overlaps training; `wait` is what the step waited "
        "for its batch). TRL: generation, reward and training in turn; `train` includes "
        "its old/reference logprob passes; no separate engine, so no weight sync.",
        "",
        "| step | reward ours | reward TRL | step s ours | wait | train | sync | "
        "step s TRL | gen | reward fn | train |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a, b in zip(result.ours["steps"], result.trl["steps"], strict=False):
        lines.append(
            f"| {a['step']} | {_f(a['reward_mean'])} | {_f(b['reward_mean'])} | "
            f"{_f(a['step_s'], 2)} | {_f(a['wait_for_batch_s'], 2)} | {_f(a['train_s'], 2)} | "
            f"{_f(a['weight_sync_s'], 2)} | {_f(b['step_s'], 2)} | {_f(b['generation_s'], 2)} | "
            f"{_f(b['reward_s'], 2)} | {_f(b['train_s'], 2)} |"
        )
    lines += ["", "## Settings mapped to TRL's GRPOConfig", "", "```"]
    lines += result.mapping.lines()
    lines += ["```", "", "## Known differences for these settings", ""]
    diffs = result.mapping.to_dict()["differences"]
    lines += [f"- **{k}**: {v}" for k, v in diffs.items()] or ["- none"]
    if result.trl.get("prompt_ids_identical") is False:
        lines += [
            "- **prompt_tokens**: TRL's tokenizer does not give back our prompt ids for "
            "every prompt (it re-tokenises the rendered text)"
        ]
    return "\n".join(lines) + "\n"


def plot(result: CompareResult, path: Path) -> Path | None:
    """Reward and seconds per step of both sides; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for name, side in (("ours (JAX)", result.ours), ("TRL (PyTorch)", result.trl)):
        steps = [s["step"] for s in side["steps"]]
        ax1.plot(steps, [s["reward_mean"] for s in side["steps"]], marker="o", label=name)
        ax2.plot(steps, [s["step_s"] for s in side["steps"]], marker="o", label=name)
    ax1.set(xlabel="step", ylabel="mean reward", title="reward per step")
    ax2.set(xlabel="step", ylabel="seconds", title="seconds per step")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


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
