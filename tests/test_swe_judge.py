"""The swe_lite judge: cases that expose every bug, fresh random arguments, a strict reader
of the harness's values line, the comparison, and the reward for the reference itself."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys

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
from tunix_agentic.envs.swe_repos import (
    FUNCTIONS,
    HELDOUT_FUNCTIONS,
    TRAIN_FUNCTIONS,
    compile_function,
    reference,
)

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


async def test_swe_judge_held_out_tasks_use_functions_no_training_task_shows():
    # One file with the training library's functions, written without reading any task,
    # must not solve held-out tasks: they are built from other functions.
    train = {f.name for f in TRAIN_FUNCTIONS}
    source = RepoTasks()
    heldout = [source.task(i, seed=0, split="heldout") for i in range(50)]
    assert all(not set(t.data["functions"]) & train for t in heldout)
    assert {n for t in heldout for n in t.data["functions"]} == {f.name for f in HELDOUT_FUNCTIONS}
    memorised = "\n\n".join("\n".join(f.source) for f in TRAIN_FUNCTIONS) + "\n"
    config = SandboxConfig(**SANDBOX)
    for task in heldout[:2]:
        verdict = await judge_module(memorised, task.data["functions"], config, timeout=20.0)
        assert verdict.reward == 0.0 and verdict.matched == 0, verdict.report
    right = await judge_module(
        "\n\n".join("\n".join(f.source) for f in HELDOUT_FUNCTIONS) + "\n",
        heldout[0].data["functions"],
        config,
        timeout=20.0,
    )
    assert right.reward == 1.0, right.report


_RELATIVE = r"""
import asyncio, sys
from tunix_agentic.envs.sandbox import SandboxConfig
from tunix_agentic.envs.swe_judge import judge_module
from tunix_agentic.envs.swe_lite import RepoTasks
from tunix_agentic.envs.swe_repos import FUNCTIONS

task = RepoTasks().task(0, seed=0, split="train")
source = "\n\n".join("\n".join(f.source) for f in FUNCTIONS) + "\n"
config = SandboxConfig(timeout_s=20.0, cpu_s=20)
verdict = asyncio.run(judge_module(source, task.data["functions"], config, timeout=20.0))
print(sys.executable, verdict.reward)
"""


def test_swe_judge_scores_the_reference_when_python_was_started_by_a_relative_path(tmp_path):
    # `../venv/bin/python`: the interpreter's path keeps its "..", which once dropped the
    # venv from the judge's PATH (and "python" from it): even the reference scored 0.0.
    python = os.path.abspath(sys.executable)
    relative = os.path.relpath(python, tmp_path)
    assert relative.startswith("..")
    done = subprocess.run(
        [relative, "-c", _RELATIVE],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    executable, reward = done.stdout.split()
    assert ".." in executable  # as Python reports it: not normalised
    assert reward == "1.0"
