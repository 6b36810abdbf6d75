"""Transcripts: what the agent wrote, what its tools answered, and how each episode ended.

A run keeps a bounded sample of its episodes as JSON lines under ``RUN/transcripts/``:

* ``step_000040.jsonl``: training episodes of RL step 40 (:data:`TRAIN_PER_STEP`);
* ``heldout_000040.jsonl``: the held-out evaluation logged at step 40, the policy version
  it measured (:data:`HELDOUT_PER_EVAL`; ``heldout_000000`` is the one before RL).

Which training episodes (:func:`choose`): the best, the worst, the first cut off at the
token limit (status ``max_tokens``), the first attempt lost to infrastructure, then others
spread over the rewards; each record says why it was chosen (``why``). Held-out
evaluations keep the first tasks of the held-out split (:func:`first_tasks`), the same at
every evaluation, so a task's episode before RL sits beside its episode after (``why``:
``success``, ``failure`` or ``infra``). A record
(:func:`episode_record`) holds the prompt, and per turn the text the model wrote, the tool
calls parsed from it (name, arguments, and whether the call failed), the observation the
environment answered (as the model saw it), the step's reward and the policy versions that
sampled it; then the episode's reward, status, error and versions.

``tunix-agentic show RUN`` prints them (:func:`format_episode`); TensorBoard's text plugin
gets a few per step (``transcripts/train``, ``transcripts/heldout``). Host-side: no JAX.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tunix_agentic.agent.tool_parser import get_parser
from tunix_agentic.trajectory import INFRA_STATUSES, Trajectory

if TYPE_CHECKING:
    from tunix_agentic.agent.chat import ChatFormat
    from tunix_agentic.metrics.recorder import MetricsRecorder
    from tunix_agentic.rollout.episode import Group

TRAIN_PER_STEP = 6  # training episodes kept per RL step
HELDOUT_PER_EVAL = 24  # held-out episodes kept per evaluation
TEXT_PER_STEP = 3  # of those, shown in TensorBoard's text plugin
DIRNAME = "transcripts"
Kind = Literal["train", "heldout"]
_PREFIX: dict[str, str] = {"train": "step", "heldout": "heldout"}


def choose(
    trajs: list[Trajectory], dropped: list[Trajectory], k: int
) -> list[tuple[Trajectory, str]]:
    """At most ``k`` episodes, each with why it was chosen: ``best`` (highest reward),
    ``worst`` (lowest), ``max_tokens`` (the first cut off at the token limit), ``infra``
    (the first attempt lost to infrastructure, from ``dropped``), then ``sample``: the
    rest spread evenly over the episodes sorted by reward. Deterministic."""
    picks: list[tuple[Trajectory, str]] = []
    taken: set[int] = set()

    def take(traj: Trajectory | None, why: str) -> None:
        if traj is not None and id(traj) not in taken and len(picks) < k:
            picks.append((traj, why))
            taken.add(id(traj))

    if trajs:
        take(max(trajs, key=lambda t: t.reward), "best")
        # The last of the lowest: a different episode from the best when all rewards tie.
        take(min(reversed(trajs), key=lambda t: t.reward), "worst")
        take(
            next((t for t in trajs if t.status == "max_tokens" and id(t) not in taken), None),
            "max_tokens",
        )
    take(next(iter(dropped), None), "infra")
    rest = sorted((t for t in trajs if id(t) not in taken), key=lambda t: t.reward)
    room = k - len(picks)
    if rest and room > 0:
        n = min(room, len(rest))
        for i in range(n):
            take(rest[(i * len(rest)) // n], "sample")
    return picks


def episode_record(
    traj: Trajectory,
    decode: Callable[[list[int]], str],
    parse: Callable[[str], Any] | None = None,
    *,
    prompt: str | None = None,
    why: str = "",
) -> dict[str, Any]:
    """One episode as a JSON-ready dict (see the module docstring). ``decode`` turns token
    ids into text (the observations, and the prompt unless ``prompt`` is given); ``parse``
    (the agent's tool-call parser) recovers each call's arguments from the turn's text."""
    turns = []
    for step in traj.steps:
        action = parse(step.action_text) if parse is not None else None
        calls = list(action.tool_calls) if action is not None else []
        records = list(step.tool_calls)
        tool_calls = []
        for i in range(max(len(calls), len(records))):
            call = (
                {"name": calls[i].name, "arguments": calls[i].arguments} if i < len(calls) else {}
            )
            if i < len(records):  # what the environment recorded of the call it ran
                rec = records[i]
                call.setdefault("name", rec.get("name", "?"))
                call.update({k: rec[k] for k in ("error", "kind", "seconds") if k in rec})
            tool_calls.append(call)
        turns.append(
            {
                "text": step.action_text,
                "finish_reason": step.finish_reason,
                "tokens": len(step.action_ids),
                "tool_calls": tool_calls,
                "parse_errors": list(action.parse_errors) if action is not None else [],
                "observation": decode(step.observation_ids) if step.observation_ids else "",
                "reward": step.reward,
                "done": step.done,
                "versions": _span(step.versions),
            }
        )
    return {
        "episode_id": traj.episode_id,
        "group_id": traj.group_id,
        "task_id": traj.task_id,
        "task_name": traj.task_name,
        "why": why,
        "reward": traj.reward,
        "status": traj.status,
        "error": traj.error,
        "infra": traj.status in INFRA_STATUSES,
        "versions": _span([v for s in traj.steps for v in s.versions]),
        "generated_tokens": traj.num_generated,
        "prompt": prompt if prompt is not None else decode(traj.token_ids[: traj.prompt_len]),
        "turns": turns,
    }


def _span(versions: Iterable[int]) -> list[int]:
    """``[lowest, highest]`` policy version, or ``[]``."""
    vs = list(versions)
    return [min(vs), max(vs)] if vs else []


def first_tasks(groups: list[Group], k: int) -> list[tuple[Trajectory, str]]:
    """One episode of each of the first ``k`` groups (a scoreable member, else an attempt
    lost to infrastructure), ``why`` its outcome (``success`` / ``failure`` / ``infra``):
    an evaluation's groups come in its task order, the same at every evaluation, so these
    are the same tasks each time, before and after RL."""
    picks = []
    for g in groups:
        if len(picks) == k:
            break
        if g.trajectories:
            traj = g.trajectories[0]
            picks.append((traj, "success" if traj.reward > 0 else "failure"))
        elif g.dropped:
            picks.append((g.dropped[0], "infra"))
    return picks


def group_records(
    groups: list[Group], template: ChatFormat, parser: str, k: int, *, same_tasks: bool = False
) -> list[dict[str, Any]]:
    """:func:`choose` ``k`` episodes of ``groups`` (their scoreable members and the attempts
    lost to infrastructure), or with ``same_tasks`` those of the first ``k`` groups
    (:func:`first_tasks`), and render each with :func:`episode_record`; the prompt is the
    task's ``prompt`` text when it has one, else the decoded prompt tokens."""
    trajs = [t for g in groups for t in g.trajectories]
    dropped = [t for g in groups for t in g.dropped]
    tasks = {id(t): g.task for g in groups for t in [*g.trajectories, *g.dropped]}
    parse = get_parser(parser)
    out = []
    picks = first_tasks(groups, k) if same_tasks else choose(trajs, dropped, k)
    for traj, why in picks:
        prompt = getattr(tasks.get(id(traj)), "prompt", None)
        out.append(
            episode_record(
                traj,
                template.tokenizer.decode,
                parse,
                prompt=prompt if isinstance(prompt, str) else None,
                why=why,
            )
        )
    return out


# ------------------------------------------------------------------ on disk
def transcript_path(run_dir: str | os.PathLike, kind: Kind, step: int) -> Path:
    return Path(run_dir) / DIRNAME / f"{_PREFIX[kind]}_{step:06d}.jsonl"


def write_records(run_dir: str | os.PathLike, kind: Kind, step: int, records: list[dict]) -> Path:
    """Write ``records`` as step ``step``'s file of ``kind`` (replacing one a resumed run
    redoes); each gets ``kind`` and ``step``."""
    path = transcript_path(run_dir, kind, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps({"kind": kind, "step": step, **rec}, default=str) + "\n")
    os.replace(tmp, path)
    return path


def transcript_steps(run_dir: str | os.PathLike, kind: Kind) -> list[int]:
    """The steps with a transcript file of ``kind``, ascending."""
    folder = Path(run_dir) / DIRNAME
    prefix = _PREFIX[kind] + "_"
    return sorted(
        int(p.stem.removeprefix(prefix))
        for p in folder.glob(f"{prefix}*.jsonl")
        if p.stem.removeprefix(prefix).isdigit()
    )


def read_records(run_dir: str | os.PathLike, kind: Kind, step: int) -> list[dict[str, Any]]:
    """The records of step ``step``'s file of ``kind`` (a line cut short by a kill is
    skipped)."""
    out = []
    with transcript_path(run_dir, kind, step).open(encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class TranscriptLog:
    """A run's transcripts: :meth:`write_step` after each RL step, :meth:`write_eval` after
    each held-out evaluation, into ``run_dir/transcripts`` and (a few) TensorBoard text."""

    def __init__(
        self,
        run_dir: str | os.PathLike,
        template: ChatFormat,
        parser: str,
        metrics: MetricsRecorder | None = None,
    ):
        self.run_dir, self.template, self.parser, self.metrics = (
            Path(run_dir),
            template,
            parser,
            metrics,
        )

    def write_step(self, step: int, groups: list[Group]) -> list[dict[str, Any]]:
        records = group_records(groups, self.template, self.parser, TRAIN_PER_STEP)
        self._write("train", step, records)
        return records

    def write_eval(self, step: int, records: list[dict[str, Any]]) -> None:
        """The held-out evaluation's records (:attr:`EvalResult.transcripts`) at ``step``."""
        self._write("heldout", step, records)

    def _write(self, kind: Kind, step: int, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        write_records(self.run_dir, kind, step, records)
        if self.metrics is not None:
            from tensorboard.plugins.text.summary_v2 import text_pb

            shown = "\n\n".join(
                format_episode({"kind": kind, "step": step, **r}) for r in records[:TEXT_PER_STEP]
            )
            # Four-space indentation: a Markdown code block, so the text plugin keeps the layout.
            body = "\n".join("    " + line for line in shown.splitlines())
            self.metrics.write_summaries(list(text_pb(f"transcripts/{kind}", body).value), step)


# ------------------------------------------------------------------ reading
def _versions(vs: list[int]) -> str:
    if not vs:
        return "no policy version"
    return f"policy v{vs[0]}" if vs[0] == vs[-1] else f"policy v{vs[0]}-v{vs[-1]}"


def _indent(text: str, limit: int | None) -> str:
    if limit is not None and len(text) > limit:
        text = text[:limit] + f" [... {len(text) - limit} more characters]"
    return "\n".join("    " + line for line in (text.strip("\n").splitlines() or [""]))


_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def terminal_safe(text: str) -> str:
    """``text`` with every control character but newline and tab (C0, DEL, C1) shown as
    ``\\xNN``: what the model, a tool or a client wrote must not move the cursor, set a
    window title or reach the clipboard (OSC 52) of whoever reads it in a terminal."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def format_episode(record: dict[str, Any], *, limit: int | None = 2000) -> str:
    """One record as text for people: a header (where, task, reward, status, versions, why
    chosen), the prompt, then each turn: the model's text, its tool calls and what the
    environment answered. Texts past ``limit`` characters are cut (``None``: never)."""
    where = "held-out" if record.get("kind") == "heldout" else "train"
    head = (
        f"=== {where} step {record.get('step', '?')} | episode {record['episode_id']} | "
        f"task {record['task_id']} ({record['task_name']}) | reward {record['reward']:.3g} | "
        f"status {record['status']} | {_versions(record.get('versions', []))}"
        + (f" | chosen: {record['why']}" if record.get("why") else "")
    )
    lines = [head]
    if record.get("error"):
        lines.append(f"error: {record['error']}")
    lines += ["prompt:", _indent(record.get("prompt", ""), limit)]
    for i, turn in enumerate(record.get("turns", []), 1):
        lines.append(
            f"turn {i} ({turn['tokens']} tokens, finish {turn['finish_reason']}, "
            f"{_versions(turn.get('versions', []))}, step reward {turn['reward']:.3g}"
            + (", done)" if turn.get("done") else ")")
            + ": model wrote"
        )
        lines.append(_indent(turn["text"], limit))
        for call in turn.get("tool_calls", []):
            args = json.dumps(call.get("arguments", {}), ensure_ascii=False)
            state = f"failed ({call.get('kind', 'error')})" if call.get("error") else "ran"
            lines.append(f"  tool call {call.get('name', '?')}({args}): {state}")
        for error in turn.get("parse_errors", []):
            lines.append(f"  malformed tool call: {error}")
        if turn.get("observation"):
            lines += ["  environment answered:", _indent(turn["observation"], limit)]
    return "\n".join(lines)
