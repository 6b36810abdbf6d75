"""Where TensorBoard shows a scalar: its run and its tag, so each line of a chart gets a colour.

TensorBoard colours lines by run, and a run writes one event-file directory. So the
series of a breakdown (the parts of an RL step's time, the engine's busy / host gap /
idle, each task's reward, each latency percentile, each rollout stage's queue) are
written to a directory of their own under the run's, under one tag: a chart of that
tag draws one line per series, each its own colour, named in the legend
(``calculator_tiny/step_time/train``). The SFT warm start gets a run of its own too,
so its steps never share an x axis with the RL steps.

The flat name (``step_time/train_s``, ``latency/model_call/p95_ms``) is what
``metrics.jsonl``, W&B and :func:`~tunix_agentic.metrics.recorder.read_scalars` use;
:func:`place` maps it to ``(run, tag)`` and :func:`flat_name` maps it back. A name no
rule matches stays in the main run (``run == ""``) under its own name.
"""

from __future__ import annotations

import dataclasses
import functools
import re

_FIELD = re.compile(r"\{(\w+)\}")


@dataclasses.dataclass(frozen=True)
class Series:
    """One rule: names matching ``flat`` (``{field}`` parts match ``fields[field]``, else
    one path component) go to run ``run`` under tag ``tag`` (both formatted from the
    fields)."""

    flat: str
    run: str
    tag: str
    fields: tuple[tuple[str, str], ...] = ()

    def _regex(self, template: str) -> re.Pattern:
        patterns = dict(self.fields)
        out, pos = [], 0
        for m in _FIELD.finditer(template):
            out.append(re.escape(template[pos : m.start()]))
            out.append(f"(?P<{m[1]}>{patterns.get(m[1], r'[^/]+')})")
            pos = m.end()
        out.append(re.escape(template[pos:]))
        return re.compile("".join(out))

    @functools.cached_property
    def _flat_re(self) -> re.Pattern:
        return self._regex(self.flat)

    @functools.cached_property
    def _placed_re(self) -> re.Pattern:
        return self._regex(f"{self.run}\0{self.tag}")

    def place(self, name: str) -> tuple[str, str] | None:
        m = self._flat_re.fullmatch(name)
        return (
            None
            if m is None
            else (self.run.format(**m.groupdict()), self.tag.format(**m.groupdict()))
        )

    def flat_name(self, run: str, tag: str) -> str | None:
        m = self._placed_re.fullmatch(f"{run}\0{tag}")
        return None if m is None else self.flat.format(**m.groupdict())


# The step-time parts, in the order they are charted (their sum is step_time/wall_s).
STEP_PARTS = (
    "generation",
    "environment",
    "reward",
    "evaluation",
    "wait",
    "train",
    "weight_sync",
    "other",
)
ENGINE_PARTS = ("busy", "host_gap", "idle")

SERIES: tuple[Series, ...] = (
    Series("sft/{metric}", "sft", "sft/{metric}", (("metric", r".+"),)),
    Series(
        "step_time/{part}_s",
        "step_time/{part}",
        "step_time/part_s",
        (("part", "|".join(STEP_PARTS)),),
    ),
    Series(
        "engine/{part}_fraction",
        "engine/{part}",
        "engine/time_fraction",
        (("part", "|".join(ENGINE_PARTS)),),
    ),
    Series(
        "{source}/{metric}/{task}",
        "task/{task}",
        "{source}/{metric}",
        (("source", "rollout|eval"), ("metric", "reward_mean|success_fraction")),
    ),
    # Each tool's and each environment start-up key's percentiles a run of their own, so the
    # chart of all tools (or of all start-ups) still draws one tag per run.
    Series(
        "latency/tool/{tool}/{q}_ms",
        "tool/{tool}/{q}",
        "latency/tool_ms",
        (("tool", r"[^/]+"), ("q", r"p\d\d")),
    ),
    Series(
        "latency/env/{key}/{q}_ms",
        "env/{key}/{q}",
        "latency/env_start_ms",
        (("key", r".+"), ("q", r"p\d\d")),
    ),
    Series("latency/{span}/{q}_ms", "{q}", "latency/{span}_ms", (("span", r".+"), ("q", r"p\d\d"))),
    Series(
        "gauge/queue/{stage}_{kind}",
        "stage/{stage}",
        "gauge/queue/{kind}",
        (("stage", "init|run|eval"), ("kind", r"(waiting|running)_episodes(_max)?")),
    ),
    Series(
        "gauge/queue/{kind}_groups{max}",
        "groups/{kind}",
        "gauge/queue/groups{max}",
        (("kind", "ready|in_flight"), ("max", "(_max)?")),
    ),
)


def place(name: str) -> tuple[str, str]:
    """``(run, tag)`` for the flat scalar ``name``: ``run`` is a path under the run's event
    directory ("" for that directory itself)."""
    for rule in SERIES:
        placed = rule.place(name)
        if placed is not None:
            return placed
    return "", name


def flat_name(run: str, tag: str) -> str | None:
    """The flat name :func:`place` put at ``(run, tag)``; None for a run no rule writes."""
    if not run:
        return tag
    for rule in SERIES:
        name = rule.flat_name(run, tag)
        if name is not None and place(name) == (run, tag):
            return name
    return None
