"""Small generated Python repositories with one bug, failing tests, and what the judge checks.

A repository is a package ``lib/`` of two or three utility functions picked from
a library below (``train`` repositories from :data:`TRAIN_FUNCTIONS`, ``heldout`` ones from
:data:`HELDOUT_FUNCTIONS`, which no training task shows), one of them with a single-line bug (an off-by-one, a wrong
operator or comparison), and ``tests/test_visible.py`` (unittest) of which at least
one test fails because of the bug. Each function's source is its reference
implementation; the judge (:mod:`tunix_agentic.envs.swe_judge`) calls the agent's
functions on the visible tests' arguments, fixed edge cases and fresh random
arguments, and compares with what the reference returns. Repositories are
deterministic in ``(seed, split, index)``; each bug is a one-line replacement, so a
demonstration can fix it with one file edit.
"""

from __future__ import annotations

import dataclasses
import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tunix_agentic.envs.base import SPLITS, Task


@dataclasses.dataclass(frozen=True)
class Function:
    """One library function: its source lines (the reference implementation), the bugs that
    can be put in a line, the argument tuples of its visible tests, the argument tuples the
    judge always adds (edge cases that between them expose every bug), and ``draw``, which
    makes fresh random arguments for each judgement (so answers cannot be hard-coded)."""

    name: str
    source: tuple[str, ...]
    bugs: tuple[tuple[int, str], ...]  # (line index in source, the buggy line)
    visible: tuple[tuple[Any, ...], ...]
    hidden: tuple[tuple[Any, ...], ...]
    draw: Callable[[random.Random], tuple[Any, ...]]


_LETTERS = "abcdefghijklmnopqrstuvwxyzAEIOUaeiouXYZ"


def _text(rng: random.Random, n: int, alphabet: str = _LETTERS + " ,.!") -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _ints(rng: random.Random, n: int, lo: int = -50, hi: int = 50) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _draw_clamp(rng: random.Random) -> tuple[Any, ...]:
    lo = rng.randint(-50, 50)
    hi = lo + rng.randint(0, 40)
    x = rng.choice([rng.randint(lo - 20, hi + 20), round(rng.uniform(lo - 3, hi + 3), 2)])
    return (x, lo, hi)


def _draw_palindrome(rng: random.Random) -> tuple[Any, ...]:
    half = _text(rng, rng.randint(0, 6), "abcdefgxyzABCDEFG")
    word = half + rng.choice(["", "q", "Q"]) + half[::-1]
    word = "".join(ch.swapcase() if rng.random() < 0.3 else ch for ch in word)
    noisy = "".join(ch + rng.choice(["", "", " ", ",", "!"]) for ch in word)
    return (noisy if rng.random() < 0.6 else _text(rng, rng.randint(1, 9)),)


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
        ((5, 0, 10), (-3, 0, 10), (11, 0, 10)),
        ((15, 0, 10), (10.5, 0, 10), (0, 0, 10), (-7, -9, -2)),
        _draw_clamp,
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
        (([1, 2, 3, 4],),),
        (([5],), ([1, 2],), ([],)),
        # Lengths 1, 2, 4, 8: every mean is exact in binary, however it is computed.
        lambda rng: (_ints(rng, rng.choice([1, 2, 4, 8]), -100, 100),),
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
        (("Education",),),
        (("UNIQUE",), ("xyz",), ("",)),
        lambda rng: (_text(rng, rng.randint(0, 24)),),
    ),
    Function(
        "last_n",
        ("def last_n(xs, n):", "    if n <= 0:", "        return []", "    return list(xs[-n:])"),
        ((3, "    return list(xs[-n + 1:])"), (1, "    if n < 0:")),
        (([1, 2, 3, 4], 2), ([1, 2, 3], 0)),
        (([1], 3), ([4, 5], 1), ([7, 8], 0), ([6], -1)),
        lambda rng: (_ints(rng, rng.randint(0, 8)), rng.randint(-2, 10)),
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
        (("Never odd or even",),),
        (("A man, a plan, a canal: Panama",), ("abca",), ("Abba",)),
        _draw_palindrome,
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
        (([3, 1, 4, 1, 5],),),
        (([],), ([2, 2],), ([1, 3, 2],)),
        lambda rng: (_ints(rng, rng.randint(0, 9), -20, 20),),
    ),
    Function(
        "word_lengths",
        (
            "def word_lengths(text):",
            "    return {w: len(w) for w in text.split()}",
        ),
        ((1, "    return {w: len(w) - 1 for w in text.split()}"),),
        (("to be",),),
        (("",), ("abc",), ("  ab  c ",)),
        lambda rng: (
            " ".join(_text(rng, rng.randint(1, 7), "abcdefxyz") for _ in range(rng.randint(0, 5))),
        ),
    ),
)
# Held-out repositories use only these: functions (and bugs) no training task shows, so
# held-out success measures finding a bug, not recalling the training functions' fixes.
HELDOUT_FUNCTIONS = (
    Function(
        "dedupe",
        (
            "def dedupe(xs):",
            "    seen, out = set(), []",
            "    for x in xs:",
            "        if x not in seen:",
            "            seen.add(x)",
            "            out.append(x)",
            "    return out",
        ),
        ((3, "        if x in seen:"), (4, "            pass")),
        (([1, 2, 1, 3, 2],),),
        (([],), ([5, 5, 5],), ([2, 1, 2],)),
        lambda rng: (_ints(rng, rng.randint(0, 10), -3, 3),),
    ),
    Function(
        "digit_sum",
        (
            "def digit_sum(n):",
            "    n = abs(n)",
            "    total = 0",
            "    while n > 0:",
            "        total += n % 10",
            "        n //= 10",
            "    return total",
        ),
        ((1, "    n = n"), (3, "    while n > 9:")),
        ((1234,), (-56,)),
        ((0,), (9,), (-7,), (1000,)),
        lambda rng: (rng.randint(-(10**6), 10**6),),
    ),
    Function(
        "chunk",
        (
            "def chunk(xs, size):",
            "    if size < 1:",
            "        raise ValueError('size must be positive')",
            "    return [list(xs[i:i + size]) for i in range(0, len(xs), size)]",
        ),
        (
            (3, "    return [list(xs[i:i + size]) for i in range(0, len(xs) - 1, size)]"),
            (3, "    return [list(xs[i:i + size - 1]) for i in range(0, len(xs), size)]"),
        ),
        (([1, 2, 3, 4, 5], 2),),
        (([], 3), ([1], 1), ([1, 2, 3], 5), ([1, 2, 3], 0)),
        lambda rng: (_ints(rng, rng.randint(0, 9)), rng.randint(1, 4)),
    ),
    Function(
        "title_case",
        (
            "def title_case(text):",
            "    words = text.split(' ')",
            "    return ' '.join(w[:1].upper() + w[1:].lower() for w in words)",
        ),
        (
            (2, "    return ' '.join(w[:1].upper() + w[1:] for w in words)"),
            (1, "    words = text.split()"),
        ),
        (("hello wORLD",), ("the  cat",)),
        (("",), ("  x",), ("ABC dEF",)),
        lambda rng: (_text(rng, rng.randint(0, 16), "abcXYZ  "),),
    ),
    Function(
        "second_largest",
        (
            "def second_largest(xs):",
            "    best = second = None",
            "    for x in xs:",
            "        if best is None or x > best:",
            "            best, second = x, best",
            "        elif x != best and (second is None or x > second):",
            "            second = x",
            "    return second",
        ),
        (
            (4, "            best, second = x, second"),
            (5, "        elif second is None or x > second:"),
        ),
        (([2, 5, 5, 1],),),
        (([],), ([7],), ([3, 3],), ([1, 2],)),
        lambda rng: (_ints(rng, rng.randint(0, 8), -9, 9),),
    ),
)
TRAIN_FUNCTIONS = FUNCTIONS
FUNCTIONS = TRAIN_FUNCTIONS + HELDOUT_FUNCTIONS
BY_NAME = {f.name: f for f in FUNCTIONS}


def compile_function(name: str, source: Sequence[str]) -> Callable[..., Any]:
    """The function ``name`` defined by ``source`` lines: only ever this module's own
    sources (the reference and its bugs), never text from a task or an agent."""
    namespace: dict[str, Any] = {}
    exec(compile("\n".join(source) + "\n", f"<{name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


_REFERENCES = {f.name: compile_function(f.name, f.source) for f in FUNCTIONS}


def reference(name: str) -> Callable[..., Any]:
    """The correct implementation of library function ``name`` (KeyError if unknown)."""
    return _REFERENCES[name]


MODULE = "lib/utils.py"
VISIBLE_TESTS = "tests/test_visible.py"
PROMPT = (
    "The repository in the current directory has a bug: its tests fail. Run them with "
    "`python -m unittest discover -s tests -t .`, find the bug in lib/utils.py and fix it "
    "with the file_edit tool. Reply <answer>done</answer> when the tests pass."
)


def _test_line(f: Function, args: tuple[Any, ...]) -> str:
    call = f"{f.name}({', '.join(map(repr, args))})"
    want = reference(f.name)(*args)
    if isinstance(want, bool):
        return f"self.assert{want}({call})"
    return f"self.assertEqual({call}, {want!r})"


def _test_module(functions: list[Function]) -> str:
    names = ", ".join(f.name for f in functions)
    out = ["import unittest", "", f"from lib.utils import {names}", "", ""]
    for f in functions:
        out.append(f"class Test{f.name.title().replace('_', '')}(unittest.TestCase):")
        for i, args in enumerate(f.visible):
            out += [f"    def test_{f.name}_{i}(self):", f"        {_test_line(f, args)}", ""]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def make_repo_task(index: int, *, seed: int, split: str) -> Task:
    """The ``index``-th repository of ``split``: ``data`` holds ``files`` (path -> text, the
    repository the agent gets), ``functions`` (the names of :data:`FUNCTIONS` it holds, in
    order: what the judge checks) and the fix (``bug_line``: 1-based line number in
    lib/utils.py, ``fixed``: the correct line)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index), 43])
    pool = HELDOUT_FUNCTIONS if split == "heldout" else TRAIN_FUNCTIONS
    while True:
        count = int(rng.integers(2, 4))
        picks = [pool[int(i)] for i in rng.permutation(len(pool))[:count]]
        buggy = int(rng.integers(0, count))
        line, bad = picks[buggy].bugs[int(rng.integers(0, len(picks[buggy].bugs)))]
        key = f"{[f.name for f in picks]}:{picks[buggy].name}:{bad}"
        # Training tasks are those of the days when both splits drew from one library
        # (a tenth, by hash, was held out), so a training run's tasks did not change.
        if split == "heldout" or zlib.crc32(key.encode()) % 10 != 0:
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
        VISIBLE_TESTS: _test_module(picks),
    }
    return Task(
        task_id=f"swe-{split}-{seed}-{index}",
        prompt=PROMPT,
        answer=None,
        data={
            "files": files,
            "functions": [f.name for f in picks],
            "bug_line": bug_line,
            "fixed": fixed,
        },
    )
