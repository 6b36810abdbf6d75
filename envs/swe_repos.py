"""Small generated Python repositories with one bug, failing tests and hidden tests.

A repository is a package ``lib/`` of two or three utility functions picked from
a library below, one of them with a single-line bug (an off-by-one, a wrong
operator or comparison), ``tests/test_visible.py`` (unittest) of which at least
one test fails because of the bug, and hidden tests kept outside the repository
that the EVAL stage copies in and runs. Everything is deterministic in
``(seed, split, index)``; each bug is a one-line replacement, so a demonstration
can fix it with one file edit.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from tunix_agentic.envs.base import Task


@dataclasses.dataclass(frozen=True)
class Function:
    """One library function: its source lines, the bugs that can be put in a line, and
    visible and hidden test lines (``self.assertEqual(...)`` statements)."""

    name: str
    source: tuple[str, ...]
    bugs: tuple[tuple[int, str], ...]  # (line index in source, the buggy line)
    visible: tuple[str, ...]
    hidden: tuple[str, ...]


FUNCTIONS = (
    Function(
        "clamp",
        (
            "def clamp(x, lo, hi):",
            "    if x < lo:",
            "        return lo",
            "    if x > hi:",
            "        return hi",
            "    return x",
        ),
        ((1, "    if x > lo:"), (4, "        return lo"), (3, "    if x > hi + 1:")),
        (
            "self.assertEqual(clamp(5, 0, 10), 5)",
            "self.assertEqual(clamp(-3, 0, 10), 0)",
            "self.assertEqual(clamp(11, 0, 10), 10)",
        ),
        (
            "self.assertEqual(clamp(15, 0, 10), 10)",
            "self.assertEqual(clamp(10.5, 0, 10), 10)",
            "self.assertEqual(clamp(0, 0, 10), 0)",
        ),
    ),
    Function(
        "mean",
        (
            "def mean(xs):",
            "    if not xs:",
            "        raise ValueError('mean of nothing')",
            "    return sum(xs) / len(xs)",
        ),
        ((3, "    return sum(xs) / (len(xs) - 1)"), (3, "    return sum(xs) // len(xs)")),
        ("self.assertEqual(mean([1, 2, 3, 4]), 2.5)",),
        ("self.assertEqual(mean([5]), 5)", "self.assertEqual(mean([1, 2]), 1.5)"),
    ),
    Function(
        "count_vowels",
        (
            "def count_vowels(text):",
            "    return sum(1 for ch in text.lower() if ch in 'aeiou')",
        ),
        (
            (1, "    return sum(1 for ch in text if ch in 'aeiou')"),
            (1, "    return sum(1 for ch in text.lower() if ch in 'aeio')"),
        ),
        ("self.assertEqual(count_vowels('Education'), 5)",),
        ("self.assertEqual(count_vowels('UNIQUE'), 4)", "self.assertEqual(count_vowels('xyz'), 0)"),
    ),
    Function(
        "last_n",
        ("def last_n(xs, n):", "    if n <= 0:", "        return []", "    return list(xs[-n:])"),
        ((3, "    return list(xs[-n + 1:])"), (1, "    if n < 0:")),
        (
            "self.assertEqual(last_n([1, 2, 3, 4], 2), [3, 4])",
            "self.assertEqual(last_n([1, 2, 3], 0), [])",
        ),
        ("self.assertEqual(last_n([1], 3), [1])", "self.assertEqual(last_n([4, 5], 1), [5])"),
    ),
    Function(
        "is_palindrome",
        (
            "def is_palindrome(text):",
            "    s = ''.join(ch.lower() for ch in text if ch.isalnum())",
            "    return s == s[::-1]",
        ),
        (
            (1, "    s = ''.join(ch for ch in text if ch.isalnum())"),
            (2, "    return s == s[1:][::-1]"),
        ),
        ("self.assertTrue(is_palindrome('Never odd or even'))",),
        (
            "self.assertTrue(is_palindrome('A man, a plan, a canal: Panama'))",
            "self.assertFalse(is_palindrome('abca'))",
        ),
    ),
    Function(
        "running_max",
        (
            "def running_max(xs):",
            "    out, best = [], None",
            "    for x in xs:",
            "        if best is None or x > best:",
            "            best = x",
            "        out.append(best)",
            "    return out",
        ),
        ((3, "        if best is None or x < best:"), (5, "        out.append(x)")),
        ("self.assertEqual(running_max([3, 1, 4, 1, 5]), [3, 3, 4, 4, 5])",),
        ("self.assertEqual(running_max([]), [])", "self.assertEqual(running_max([2, 2]), [2, 2])"),
    ),
    Function(
        "word_lengths",
        (
            "def word_lengths(text):",
            "    return {w: len(w) for w in text.split()}",
        ),
        ((1, "    return {w: len(w) - 1 for w in text.split()}"),),
        ("self.assertEqual(word_lengths('to be'), {'to': 2, 'be': 2})",),
        (
            "self.assertEqual(word_lengths(''), {})",
            "self.assertEqual(word_lengths('abc'), {'abc': 3})",
        ),
    ),
)

MODULE = "lib/utils.py"
VISIBLE_TESTS = "tests/test_visible.py"
HIDDEN_TESTS = "tests/test_hidden.py"
PROMPT = (
    "The repository in the current directory has a bug: its tests fail. Run them with "
    "`python -m unittest discover -s tests -t .`, find the bug in lib/utils.py and fix it "
    "with the file_edit tool. Reply <answer>done</answer> when the tests pass."
)


def _test_module(functions: list[Function], lines_of: str) -> str:
    names = ", ".join(f.name for f in functions)
    out = ["import unittest", "", f"from lib.utils import {names}", "", ""]
    for f in functions:
        out.append(f"class Test{f.name.title().replace('_', '')}(unittest.TestCase):")
        for i, line in enumerate(getattr(f, lines_of)):
            out += [f"    def test_{f.name}_{i}(self):", f"        {line}", ""]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def make_repo_task(index: int, *, seed: int, split: str) -> Task:
    """The ``index``-th repository of ``split``: ``data`` holds ``files`` (path -> text, the
    repository the agent gets), ``hidden`` (path -> text, copied in at EVAL), and the fix
    (``bug_line``: 1-based line number in lib/utils.py, ``fixed``: the correct line)."""
    rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index), 43])
    while True:
        count = int(rng.integers(2, 4))
        picks = [FUNCTIONS[int(i)] for i in rng.permutation(len(FUNCTIONS))[:count]]
        buggy = int(rng.integers(0, count))
        line, bad = picks[buggy].bugs[int(rng.integers(0, len(picks[buggy].bugs)))]
        key = f"{[f.name for f in picks]}:{picks[buggy].name}:{bad}"
        if ("heldout" if zlib.crc32(key.encode()) % 10 == 0 else "train") == split:
            break
    lines: list[str] = []
    bug_line = fixed = None
    for k, f in enumerate(picks):
        for i, text in enumerate(f.source):
            if k == buggy and i == line:
                bug_line, fixed = len(lines) + 1, text
                text = bad
            lines.append(text)
        lines += ["", ""]
    module = "\n".join(lines).rstrip() + "\n"
    files = {
        "lib/__init__.py": "",
        MODULE: module,
        "tests/__init__.py": "",
        VISIBLE_TESTS: _test_module(picks, "visible"),
    }
    hidden = {HIDDEN_TESTS: _test_module(picks, "hidden")}
    return Task(
        task_id=f"swe-{split}-{seed}-{index}",
        prompt=PROMPT,
        answer=None,
        data={"files": files, "hidden": hidden, "bug_line": bug_line, "fixed": fixed},
    )
