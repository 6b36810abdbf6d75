"""Every figure table in README.md and docs/ carries a figure stamp
(``tunix_agentic.compare.stamp``): the command, the date and the machine that made it.

A figure table is a markdown table with a measured figure in it: a ratio written as a
number and an ``x`` (``1.43x``, ``18x``; ``8 x 8`` is a shape, not a ratio) or a rate or
time unit (tok/s, s/step, ms/step, GFLOP/s, traj/s, steps/s). Its stamp is a
``<!-- figure: ... -->`` comment between the table and what comes before it (the
previous heading or table), or on the line right after it. Figures in prose are held
more loosely: a section (the text under one heading) with a figure in it carries at
least one stamp.
"""

import re
from pathlib import Path

import pytest

from tunix_agentic.compare.stamp import StampError, find, parse

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|tok/s|s/step|ms/step|GFLOP/s|traj/s|steps/s")
# Reports a command writes, kept as examples: their command and date are on the page
# that shows them (docs/compare/README.md; the report names its run), and a new
# `tunix-agentic compare` report stamps its own headline table.
GENERATED = {"docs/report/report.md", "docs/compare/compare.md"}


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if f.exists() and str(f.relative_to(ROOT)) not in GENERATED]


def figure_tables(text: str) -> list[tuple[int, int]]:
    """(first, last) 0-based lines of each markdown table with a figure in it."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            j = i
            while j + 1 < len(lines) and lines[j + 1].lstrip().startswith("|"):
                j += 1
            if FIGURE.search("\n".join(lines[i : j + 1])):
                out.append((i, j))
            i = j + 1
        else:
            i += 1
    return out


def unstamped(text: str) -> list[int]:
    """1-based first lines of the figure tables in ``text`` that carry no stamp."""
    lines = text.splitlines()
    stamps = {line for line, _ in find(text)}
    missing, boundary = [], -1
    for first, last in figure_tables(text):
        above = first - 1
        while above > boundary and not lines[above].startswith("#"):
            above -= 1
        window = set(range(above + 1, first)) | {last + 1}
        if not stamps & window:
            missing.append(first + 1)
        boundary = last
    return missing


def unstamped_sections(text: str) -> list[str]:
    """Headings of the sections in ``text`` with a figure in them and no stamp (``#``
    lines inside code fences are not headings)."""
    out, heading, body, fenced = [], "(top of the page)", [], False

    def close():
        chunk = "\n".join(body)
        if FIGURE.search(chunk) and not find(chunk):
            out.append(heading)

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if line.startswith("#") and not fenced:
            close()
            heading, body = line, []
        else:
            body.append(line)
    close()
    return out


def test_the_detector_finds_an_unstamped_table_and_accepts_a_stamped_one():
    stamp = '<!-- figure: command="python x.py", date=2026-12-04, machine="2 CPUs" -->'
    table = "| side | s/step |\n|---|---|\n| ours | 0.70 |\n"
    shape = "| shape |\n|---|\n| 8 x 8 |\n"
    text = f"# A\n\n{table}\n## B\n\n{stamp}\n\n{table}\n## C\n\n{shape}\n{table}{stamp}\n"
    assert [first for first, _ in figure_tables(text)] == [2, 10, 20]  # the shape table is none
    assert unstamped(text) == [3]
    # A stamp above the previous heading does not count for the next section's table.
    assert unstamped(f"{stamp}\n# A\n\n{table}") == [4]
    prose = "It ran at 1,234 tok/s, 1.5x the peer.\n"
    fence = "```bash\n# not a heading\n```\n"
    assert unstamped_sections(f"# A\n{stamp}\n{prose}# B\n{fence}{prose}# C\nNo figure.\n") == [
        "# B"
    ]


@pytest.mark.parametrize(
    "comment,error",
    [
        ('<!-- figure: command="x", machine="m" -->', "misses date"),
        ('<!-- figure: command="x", date=4 Dec, machine="m" -->', "cannot read"),
        ('<!-- figure: command="x", date=2026-13, machine="m" -->', "YYYY-MM-DD"),
        ('<!-- figure: command="", date=2026-12-04, machine="m" -->', "command is empty"),
    ],
    ids=["no-date", "loose-words", "bad-date", "empty-command"],
)
def test_a_bad_stamp_names_what_is_wrong(comment, error):
    with pytest.raises(StampError, match=error):
        parse(comment)


def test_a_stamp_round_trips_with_quotes_and_extra_fields():
    comment = (
        '<!-- figure: command="python a.py --x \\"y\\"", date=2026-12-04, '
        'machine="2 CPUs, KVM"; state="busy: 2 of 3 pairs" -->'
    )
    s = parse(comment)
    assert (s.command, s.date, s.machine) == ('python a.py --x "y"', "2026-12-04", "2 CPUs, KVM")
    assert dict(s.extra) == {"state": "busy: 2 of 3 pairs"}
    assert parse(s.render()) == s


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_table_in_the_docs_carries_a_stamp(path):
    text = path.read_text()
    for _, comment in find(text):
        parse(comment)  # StampError names the field and shows the comment
    missing = unstamped(text)
    fmt = '<!-- figure: command="...", date=YYYY-MM-DD, machine="..." -->'
    assert not missing, (
        f"{path.relative_to(ROOT)}: figure table(s) at line(s) {missing} carry no {fmt} stamp"
    )
    sections = unstamped_sections(text)
    assert not sections, f"{path.relative_to(ROOT)}: figures without a {fmt} stamp in {sections}"
