"""The swe_lite judge: cases that expose every bug, fresh random arguments, a strict reader
of the harness's values line, the comparison, and the reward for the reference itself."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest

from tunix_agentic.envs import swe_harness
from tunix_agentic.envs.sandbox import SandboxConfig
from tunix_agentic.envs.swe_judge import (
    RANDOM_CASES,
    canonical,
    judge_module,
    make_cases,
    parse_values,
)
from tunix_agentic.envs.swe_lite import RepoTasks, SweLiteEnv
from tunix_agentic.envs.swe_repos import FUNCTIONS, compile_function, reference

SANDBOX = {"timeout_s": 20.0, "cpu_s": 20}


def answers(function, args_list) -> list:
    return [canonical(swe_harness.call(function, list(args))) for args in args_list]


@pytest.mark.parametrize("f", FUNCTIONS, ids=[f.name for f in FUNCTIONS])
def test_swe_judge_fixed_cases_and_visible_tests_each_expose_every_bug(f):
    right = reference(f.name)
    draws = [f.draw(random.Random(i)) for i in range(300)]
    assert ("unsupported",) not in {a[:1] for a in answers(right, (*f.visible, *f.hidden, *draws))}
    assert all(a[0] != "raised" for a in answers(right, draws))  # random draws are valid input
    for line, bad in f.bugs:
        source = list(f.source)
        source[line] = bad
        buggy = compile_function(f.name, source)
        for cases in (f.visible, f.hidden):
            assert answers(buggy, cases) != answers(right, cases), (bad, cases)


def test_swe_judge_draws_new_arguments_for_each_judgement():
    names = [f.name for f in FUNCTIONS]
    first, second = make_cases(names, random.Random(1)), make_cases(names, random.Random(2))
    assert (
        len(first)
        == len(second)
        == sum(len(f.visible) + len(f.hidden) + RANDOM_CASES for f in FUNCTIONS)
    )
    assert first != second and first == make_cases(names, random.Random(1))
    with pytest.raises(ValueError, match=r"task.data\['functions'\]"):
        make_cases(["clamp", "os.system"], random.Random(0))


def values_line(*values) -> str:
    return swe_harness.MARKER + json.dumps(list(values))


@pytest.mark.parametrize(
    "output,expected,error",
    [
        ("Ran 3 tests\nOK", None, "0 values lines"),
        (values_line(["int", "1"]) + "\n" + values_line(["int", "1"]), None, "2 values lines"),
        (values_line(["int", "1"], ["int", "2"]), None, "does not hold 1"),
        (swe_harness.MARKER + "[NaN]", None, "NaN"),
        (swe_harness.MARKER + "{not json", None, "Expecting"),
        (values_line(["int", "1", "2"]), None, "one payload"),
        (values_line(["int", "1e3"]), None, "not a tagged value"),
        (values_line(["eval", "1"]), None, "not a tagged value"),
        (
            values_line(["dict", [[["str", "a"], ["int", "1"]], [["str", "a"], ["int", "2"]]]]),
            None,
            "repeated key",
        ),
        (swe_harness.MARKER + "[" * 100_000 + "]" * 100_000, None, "deep|tagged"),
        ("noise" + values_line(["int", "1"]), None, "0 values lines"),  # glued: not a line
        ("noise\n" + values_line(["float", "2.0"]) + "\nmore", [("num", 2)], None),
        (values_line(["tuple", [["int", "1"]]]), [("tuple", (("num", 1),))], None),
    ],
    ids=[
        "none",
        "two",
        "count",
        "nan",
        "json",
        "payloads",
        "int-text",
        "tag",
        "dict-keys",
        "deep",
        "glued",
        "noise",
        "tuple",
    ],
)
def test_swe_judge_reads_exactly_one_well_formed_values_line(output, expected, error):
    if error is None:
        assert parse_values(output, len(expected)) == expected
    else:
        with pytest.raises(ValueError, match=error):
            parse_values(output, 1)


@pytest.mark.parametrize(
    "got,want,equal",
    [
        (2.0, 2, True),
        (True, 1, False),
        ((1, 2), [1, 2], False),
        ({"a": 1, "b": 2}, {"b": 2, "a": 1.0}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        (float("nan"), float("nan"), False),
        (ZeroDivisionError(), 0, False),
    ],
    ids=["int-float", "bool-int", "tuple-list", "dict-order", "dict-size", "nan", "raised"],
)
def test_swe_judge_compares_values_as_assert_equal_does_but_types_exactly(got, want, equal):
    def returns(value):
        def function():
            if isinstance(value, Exception):
                raise value
            return value

        return function

    assert (answers(returns(got), [()]) == answers(returns(want), [()])) is equal


async def test_swe_judge_gives_the_reward_to_every_reference_and_checks_task_data():
    source = "\n\n".join("\n".join(f.source) for f in FUNCTIONS) + "\n"
    names = [f.name for f in FUNCTIONS]
    verdict = await judge_module(source, names, SandboxConfig(**SANDBOX), timeout=20.0)
    assert (verdict.reward, verdict.matched) == (1.0, verdict.total), verdict.report
    env = SweLiteEnv(sandbox=SANDBOX)
    task = RepoTasks().task(0, seed=0, split="train")
    for functions in ([], ["clamp", "clamp"], ["nope"], "clamp", None):
        bad = dataclasses.replace(task, data={**task.data, "functions": functions})
        with pytest.raises(ValueError, match=r"task.data\['functions'\]"):
            await env.reset(bad)
    assert env.sandbox is None  # refused before any sandbox started
