"""The stamp every figure in the docs carries: the command that made it, the date, and the
machine and its state, as an HTML comment beside the figure (invisible when rendered).

    <!-- figure: command="python -m profiling.bench_learner --pairs 5", date=2026-12-04,
         machine="2-core CPU, JAX 0.10.2", state="5 clean pairs, others <= 4% of the CPUs" -->

on the line before the figure's table, paragraph or code block (inside a list item, at the
end of the line before). ``command``, ``date`` (YYYY-MM-DD) and ``machine`` are required;
other keys (``state``, ``note``) are free; fields are separated by commas (or semicolons). ``tests/test_doc_figures.py`` fails on a figure table in README.md or
docs/ without one; ``tunix-agentic compare`` stamps the report it writes.
"""

from __future__ import annotations

import dataclasses
import re

REQUIRED = ("command", "date", "machine")
_STAMP = re.compile(r"<!--\s*figure:(.*?)-->", re.S)
_FIELD = re.compile(r'\s*(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;,\s]+))\s*[;,]?')
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


class StampError(ValueError):
    """A figure stamp that is malformed or misses a required field."""


@dataclasses.dataclass(frozen=True)
class Stamp:
    command: str
    date: str
    machine: str
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        for name in REQUIRED:
            if not getattr(self, name).strip():
                raise StampError(f"figure stamp: {name} is empty")
        if not _DATE.fullmatch(self.date):
            raise StampError(f"figure stamp: date must be YYYY-MM-DD, got {self.date!r}")

    def render(self) -> str:
        fields = [("command", self.command), ("date", self.date), ("machine", self.machine)]
        parts = [
            f"{k}={v}" if k == "date" else f'{k}="{_quote(v)}"'
            for k, v in fields + list(self.extra)
        ]
        return "<!-- figure: " + ", ".join(parts) + " -->"


def _quote(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def parse(comment: str) -> Stamp:
    """The stamp in ``comment`` (one ``<!-- figure: ... -->``); StampError naming the
    field that is missing or bad."""
    m = _STAMP.search(comment)
    if not m:
        raise StampError(f"not a figure stamp: {comment[:80]!r}")
    body, fields, pos = m.group(1).strip(), {}, 0
    while pos < len(body):
        f = _FIELD.match(body, pos)
        if not f or f.end() == pos:
            raise StampError(f"figure stamp: cannot read from {body[pos : pos + 40]!r}")
        value = f.group(2) if f.group(2) is not None else f.group(3)
        fields[f.group(1)] = re.sub(r"\\(.)", r"\1", value)
        pos = f.end()
    missing = [k for k in REQUIRED if k not in fields]
    if missing:
        raise StampError(f"figure stamp misses {', '.join(missing)}: {m.group(0)[:120]!r}")
    extra = tuple((k, v) for k, v in fields.items() if k not in REQUIRED)
    return Stamp(fields["command"], fields["date"], fields["machine"], extra)


def find(text: str) -> list[tuple[int, str]]:
    """Every ``<!-- figure: ... -->`` comment in ``text`` with the line (0-based) it starts on."""
    return [(text.count("\n", 0, m.start()), m.group(0)) for m in _STAMP.finditer(text)]
