"""Math word problems generated from a seed, each with its exact answer and a Python solution.

Eight problem families (change, mean, discount, proportion, a range's sum, two
pipes, a power's remainder, counting multiples) with random numbers: the answers
are exact (integers or fractions, from :class:`fractions.Fraction`), and each
problem carries a short Python program that prints its answer, used by the
``math_python`` environment's demonstrations. The families that are tedious by
hand (remainders of large powers, counting) are where the Python tool pays.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from fractions import Fraction

import numpy as np

from tunix_agentic.envs.base import Task

Problem = tuple[str, Fraction, str]  # (text, answer, python code printing the answer)


def _change(rng: np.random.Generator) -> Problem:
    n, price = int(rng.integers(2, 20)), int(rng.integers(5, 95))
    paid = -(-n * price // 100) + int(rng.integers(0, 5))
    return (
        f"Tom buys {n} pencils at {price} cents each and pays with {paid} dollars. "
        "How many cents of change does he get?",
        Fraction(paid * 100 - n * price),
        f"print({paid} * 100 - {n} * {price})",
    )


def _mean(rng: np.random.Generator) -> Problem:
    xs = [int(v) for v in rng.integers(40, 100, size=int(rng.integers(3, 6)))]
    return (
        f"The test scores are {', '.join(map(str, xs))}. What is their mean?",
        Fraction(sum(xs), len(xs)),
        f"from fractions import Fraction\nxs = {xs}\nprint(Fraction(sum(xs), len(xs)))",
    )


def _discount(rng: np.random.Generator) -> Problem:
    price, pct = int(rng.integers(20, 400)), int(rng.choice([5, 10, 15, 20, 25, 30, 40, 50]))
    return (
        f"A jacket costs {price} dollars and is discounted by {pct}%. "
        "What is the sale price in dollars?",
        Fraction(price * (100 - pct), 100),
        f"from fractions import Fraction\nprint(Fraction({price} * (100 - {pct}), 100))",
    )


def _proportion(rng: np.random.Generator) -> Problem:
    dist, hours, later = (
        int(rng.integers(50, 500)),
        int(rng.integers(2, 9)),
        int(rng.integers(1, 12)),
    )
    return (
        f"A train travels {dist} km in {hours} hours. "
        f"How many km does it travel in {later} hours at the same speed?",
        Fraction(dist * later, hours),
        f"from fractions import Fraction\nprint(Fraction({dist} * {later}, {hours}))",
    )


def _range_sum(rng: np.random.Generator) -> Problem:
    a = int(rng.integers(1, 200))
    b = a + int(rng.integers(10, 500))
    return (
        f"What is the sum of all integers from {a} to {b}?",
        Fraction(sum(range(a, b + 1))),
        f"print(sum(range({a}, {b} + 1)))",
    )


def _pipes(rng: np.random.Generator) -> Problem:
    a, b = (int(v) for v in rng.integers(2, 13, size=2))
    return (
        f"One pipe fills a tank in {a} hours and another in {b} hours. "
        "How many hours do they take to fill it together?",
        Fraction(a * b, a + b),
        f"from fractions import Fraction\nprint(1 / (Fraction(1, {a}) + Fraction(1, {b})))",
    )


def _power_mod(rng: np.random.Generator) -> Problem:
    base, exp, mod = int(rng.integers(2, 30)), int(rng.integers(20, 200)), int(rng.integers(7, 100))
    return (
        f"What is the remainder when {base}**{exp} is divided by {mod}?",
        Fraction(pow(base, exp, mod)),
        f"print(pow({base}, {exp}, {mod}))",
    )


def _multiples(rng: np.random.Generator) -> Problem:
    n = int(rng.integers(100, 2000))
    a, b = (int(v) for v in rng.choice(np.arange(2, 14), size=2, replace=False))
    count = sum(1 for k in range(1, n + 1) if k % a == 0 or k % b == 0)
    return (
        f"How many integers from 1 to {n} are divisible by {a} or by {b}?",
        Fraction(count),
        f"print(sum(1 for k in range(1, {n} + 1) if k % {a} == 0 or k % {b} == 0))",
    )


FAMILIES: dict[str, Callable[[np.random.Generator], Problem]] = {
    "change": _change,
    "mean": _mean,
    "discount": _discount,
    "proportion": _proportion,
    "range_sum": _range_sum,
    "pipes": _pipes,
    "power_mod": _power_mod,
    "multiples": _multiples,
}
INSTRUCTION = " Give the exact answer (an integer or a fraction a/b) as <answer>...</answer>."


def format_answer(value: Fraction) -> str:
    """``12`` or ``7/4``: how answers are written."""
    return (
        str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"
    )


def make_problem(index: int, *, seed: int, split: str, families: tuple[str, ...] = ()) -> Task:
    """The ``index``-th problem of ``split``; held-out and train problems differ in text
    (by a stable hash). ``families`` restricts the kinds (default: all)."""
    names = families or tuple(FAMILIES)
    unknown = set(names) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown problem families {sorted(unknown)}; known: {list(FAMILIES)}")
    rng = np.random.default_rng([int(seed), zlib.crc32(split.encode()), int(index), 29])
    while True:
        family = names[int(rng.integers(0, len(names)))]
        text, answer, code = FAMILIES[family](rng)
        if ("heldout" if zlib.crc32(text.encode()) % 10 == 0 else "train") == split:
            break
    return Task(
        task_id=f"math-{split}-{seed}-{index}",
        prompt=text + INSTRUCTION,
        answer=format_answer(answer),
        data={"family": family, "code": code},
    )
