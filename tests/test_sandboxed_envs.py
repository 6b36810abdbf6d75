"""The sandboxed environments: math_python (word problems, the Python tool, a sympy verifier)
and swe_lite (a buggy repository, bash and file_edit, judged on unseen arguments in EVAL)."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
from pathlib import Path

import numpy as np
import pytest

from tunix_agentic.agent.chat import ChatTemplate
from tunix_agentic.agent.loop import AgentConfig
from tunix_agentic.data.tasks import heldout_tasks
from tunix_agentic.envs.base import Action, ToolCall
from tunix_agentic.envs.math_problems import FAMILIES, make_problem
from tunix_agentic.envs.math_python import MathPythonEnv, MathTasks
from tunix_agentic.envs.math_verify import answers_equal, normalize_answer
from tunix_agentic.envs.sandbox.host import _sandboxes_root
from tunix_agentic.envs.swe_lite import RepoTasks, SweLiteEnv
from tunix_agentic.envs.swe_repos import (
    MODULE,
    VISIBLE_TESTS,
)
from tunix_agentic.inference import EngineConfig, JaxEngine
from tunix_agentic.models.char_tokenizer import CharTokenizer
from tunix_agentic.rollout import RolloutConfig, RolloutOrchestrator
from tunix_agentic.testing import tiny_model

SANDBOX = {"timeout_s": 20.0, "cpu_s": 20}


def sandbox_dirs() -> set[str]:
    """This process's sandbox directories (other test runs on the host may hold their own)."""
    mine = f"{os.getpid()}."
    return {p.name for p in Path(_sandboxes_root()).iterdir() if p.name.startswith(mine)}


# -------------------------------------------------------------------- verifier
@pytest.mark.parametrize(
    "given,expected,equal",
    [
        ("7/4", "7/4", True),
        ("1.75", "7/4", True),
        ("\\boxed{7/4}", "7/4", True),
        ("\\frac{7}{4}", "7/4", True),
        ("175%", "7/4", True),
        ("$1,250", "1250", True),
        ("1250 dollars", "1250", True),
        ("x = 12", "12", True),
        ("sqrt(8)", "2*sqrt(2)", True),
        ("1.7", "7/4", False),
        ("0.3333", "1/3", False),
        ("__import__('os').getcwd()", "0", False),
        ("9**99999", "1", False),
        ("(((9**64)**64)**64)**64", "1", False),  # a power of a power: refused, not computed
        ("2**3**2", "512", False),
        ("(sqrt(2)+sqrt(3))**4", "49+20*sqrt(6)", True),
        ("1" + " " * 20_000 + "+0", "1", False),  # over the raw length: refused before any regex
        ("lambda: 1", "1", False),
        ("", "1", False),
    ],
    ids=lambda v: str(v)[:12],
)
def test_the_verifier_accepts_equal_forms_only(given, expected, equal):
    assert answers_equal(given, expected) is equal


def test_normalize_strips_the_wrapping():
    assert normalize_answer("\\boxed{\\frac{1}{3}}.") == "(1)/(3)"
    assert normalize_answer("50 %") == "(50)/100"


# -------------------------------------------------------------------- problems
def run_code(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, {})  # noqa: S102 - our own generated solution
    return out.getvalue().strip()


def test_problems_are_deterministic_and_their_code_prints_the_answer():
    source = MathTasks()
    tasks = [source.task(i, seed=3, split="train") for i in range(120)]
    assert tasks == [source.task(i, seed=3, split="train") for i in range(120)]
    assert {t.data["family"] for t in tasks} == set(FAMILIES)
    for task in tasks:
        assert answers_equal(run_code(task.data["code"]), task.answer), task.prompt
        assert run_code(task.data["code"]) == task.answer  # the demo's tool reply, exactly
    held = {t.prompt for t in heldout_tasks(source, 200, seed=3)}
    assert not held & {t.prompt for t in tasks}
    with pytest.raises(ValueError, match="unknown problem families"):
        make_problem(0, seed=0, split="train", families=("poetry",))


# ----------------------------------------------------------------- math_python
async def test_math_python_episode_in_a_sandbox():
    task = make_problem(0, seed=0, split="train", families=("power_mod",))
    before = sandbox_dirs()
    env = MathPythonEnv(sandbox=SANDBOX, max_python_calls=2)
    assert [s["function"]["name"] for s in env.tool_schemas()] == ["python"]
    try:
        assert await env.reset(task) == task.prompt
        assert env.timings["sandbox_start"] > 0 and len(sandbox_dirs() - before) == 1
        demo = MathTasks().demonstration(task, rng=np.random.default_rng(0), use_tools=True)
        call = ToolCall(**demo[0]["tool_calls"][0])
        first = await env.step(Action(text="", tool_calls=(call,)))
        assert first.messages == [{"role": "tool", "content": demo[1]["content"]}]
        state = ToolCall("python", {"code": "y = 6 * 7\nprint(y)"})
        assert (await env.step(Action(text="", tool_calls=(state,)))).messages[0]["content"] == "42"
        capped = await env.step(Action(text="", tool_calls=(state,)))
        assert "error" in capped.messages[0]["content"]  # the third call is over the cap
        done = await env.step(Action(text="", answer=f"\\boxed{{{task.answer}}}"))
        assert done.done and done.reward == 1.0 and await env.evaluate() == 1.0
    finally:
        await env.close()
    assert sandbox_dirs() == before  # the sandbox is gone with the episode
    await env.close()  # idempotent


async def test_math_python_wrong_answer_and_errors_are_observations():
    env = MathPythonEnv(sandbox=SANDBOX)
    task = make_problem(1, seed=0, split="train")
    try:
        await env.reset(task)
        bad = ToolCall("python", {"code": "1/0"})
        obs = await env.step(Action(text="", tool_calls=(bad,), parse_errors=("not JSON",)))
        assert [m["content"] for m in obs.messages] == [
            "ZeroDivisionError: division by zero",
            "error: not JSON",
        ]
        wrong = await env.step(Action(text="", answer="-1"))
        assert wrong.done and wrong.reward == 0.0
    finally:
        await env.close()


# -------------------------------------------------------------------- swe_lite
async def test_swe_lite_demonstration_replays_exactly_and_fixes_the_bug():
    source = RepoTasks()
    for index in range(3):
        task = source.task(index, seed=0, split="train")
        demo = source.demonstration(task, rng=np.random.default_rng(0), use_tools=True)
        env = SweLiteEnv(sandbox=SANDBOX)
        try:
            await env.reset(task)
            assert await env.evaluate() == 0.0  # the bug is there: the tests fail
            assert "expected" in env.test_output  # the judge says which value was wrong
            for turn, reply in zip(demo[0:4:2], demo[1:4:2], strict=True):
                call = ToolCall(**turn["tool_calls"][0])
                result = await env.step(Action(text="", tool_calls=(call,)))
                assert result.messages == [{"role": "tool", "content": reply["content"]}]
            done = await env.step(Action(text="", answer="done"))
            assert done.done
            assert await env.evaluate() == 1.0, env.test_output[-2000:]
        finally:
            await env.close()


async def test_swe_lite_bash_runs_the_tests_and_deleting_tests_earns_nothing():
    task = RepoTasks().task(5, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        run = ToolCall(
            "bash", {"command": "python -m unittest discover -s tests -t . 2>&1 | tail -1"}
        )
        out = (await env.step(Action(text="", tool_calls=(run,)))).messages[0]["content"]
        assert "FAILED" in out
        wipe = ToolCall(
            "bash",
            {"command": f"rm {VISIBLE_TESTS} && echo 'raise SystemExit(0)' > tests/__init__.py"},
        )
        await env.step(Action(text="", tool_calls=(wipe,)))
        assert await env.evaluate() == 0.0  # the original tests are back, and still fail
        module = env.sandbox.read_file(MODULE)
        fixed = module.splitlines()
        fixed[task.data["bug_line"] - 1] = task.data["fixed"]
        env.sandbox.write_file(MODULE, "\n".join(fixed) + "\n")
        assert await env.evaluate() == 1.0
    finally:
        await env.close()


CHEATS = {
    "shadow-unittest": (
        "mkdir -p unittest && printf 'print(\"Ran 12 tests in 0.0s\")\\n' > unittest/__main__.py"
        " && touch unittest/__init__.py"
    ),
    "forged-exit": (
        'printf \'import os\\nprint("Ran 12 tests in 0.0s")\\nprint("OK")\\nos._exit(0)\\n\''
        " > lib/__init__.py"
    ),
    "patched-asserts": (
        "printf 'import unittest\\nunittest.TestCase.assertEqual = lambda *a, **k: None\\n"
        "unittest.TestCase.assertTrue = lambda *a, **k: None\\n"
        "unittest.TestCase.assertFalse = lambda *a, **k: None\\n' >> lib/utils.py"
    ),
    "tests-replaced-by-a-file": "rm -r tests && echo x > tests",
    "module-removed": "rm lib/utils.py",
}


@pytest.mark.parametrize("command", list(CHEATS.values()), ids=list(CHEATS))
async def test_swe_lite_cannot_be_cheated(command):
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        await env.step(Action(text="", tool_calls=(ToolCall("bash", {"command": command}),)))
        assert await env.evaluate() == 0.0, env.test_output[-1500:]
    finally:
        await env.close()


# Code an agent appends to task 0's lib/utils.py (is_palindrome, a buggy mean, count_vowels):
# each earned 1.0 from a judge that ran the tests in the process of the code under test.
FORGERIES = {
    # Read the judge's one-time token from its __main__, print a verdict, leave before it can.
    "main-token": """
import __main__, glob, os
_token = getattr(__main__, "token", None)
if _token:
    _tests = sum(open(p).read().count("    def test_") for p in glob.glob("tests/test_*.py"))
    print(_token, _tests, 0, 1, flush=True)
    os._exit(0)
""",
    # Rewrite whatever the judge prints.
    "builtins-print": """
import builtins
_print = builtins.print
def _forged(*args, **kwargs):
    if len(args) == 4:
        args = (args[0], args[1], 0, 1)
    return _print(*args, **kwargs)
builtins.print = _forged
""",
    # An object equal to everything instead of a number.
    "always-equal": """
class _Same:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def mean(xs):
    return _Same()
""",
    # The same object, with builtins.type and isinstance lying about it.
    "builtins-type": """
import builtins
class _Same(float):
    def __eq__(self, other):
        return True
    __hash__ = float.__hash__
_type, _isinstance = builtins.type, builtins.isinstance
builtins.type = lambda *a: float if len(a) == 1 and _isinstance(a[0], _Same) else _type(*a)
def mean(xs):
    return _Same(0.5)
""",
    # The judge's comparison: every test passes without running.
    "patched-testcase-run": """
import unittest
def _run(self, result=None):
    result.startTest(self)
    result.addSuccess(self)
    result.stopTest(self)
unittest.TestCase.run = _run
""",
    # The same through sys.modules: failures are never recorded.
    "sys-modules": """
import sys
for _name in ("unittest", "unittest.result"):
    _module = sys.modules.get(_name)
    if _module is not None and hasattr(_module, "TestResult"):
        _module.TestResult.addFailure = lambda self, test, err: None
        _module.TestResult.addError = lambda self, test, err: None
""",
    # A results line in any format the judge might read, for whatever it asked, then exit.
    "forged-results-line": """
import __main__, json, os, sys
_marker = getattr(__main__, "MARKER", "")
_frame, _asked = sys._getframe(), 0
while _frame is not None:
    for _value in list(_frame.f_locals.values()):
        if isinstance(_value, list) and _value and isinstance(_value[0], list):
            _asked = max(_asked, len(_value))
    _frame = _frame.f_back
print(_marker + json.dumps([["unsupported", "any"]] * _asked), flush=True)
os._exit(0)
""",
}


async def append_to_module(env: SweLiteEnv, task, code: str) -> None:
    """Appends ``code`` to lib/utils.py through the agent's file_edit tool."""
    end = task.data["files"][MODULE].count("\n")
    edit = {"command": "replace", "path": MODULE, "start_line": end + 1, "end_line": end}
    call = ToolCall("file_edit", {**edit, "text": code})
    reply = await env.step(Action(text="", tool_calls=(call,)))
    assert "replaced 0 line(s)" in reply.messages[0]["content"], reply.messages


@pytest.mark.parametrize("code", list(FORGERIES.values()), ids=list(FORGERIES))
async def test_swe_lite_code_under_test_cannot_forge_the_verdict(code):
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        await append_to_module(env, task, code)
        assert await env.evaluate() == 0.0, env.test_output[-1500:]
    finally:
        await env.close()


FORGED_MODULE = FORGERIES["main-token"] + FORGERIES["forged-results-line"]
OUTSIDE_THE_MODULE = {
    # Python start-up hooks and path files beside and inside the package.
    "startup-hooks": " && ".join(
        f"printf %s {shlex.quote(FORGED_MODULE)} > {path}"
        for path in (
            "sitecustomize.py",
            "usercustomize.py",
            "lib/sitecustomize.py",
            "zz.pth",
            "lib/zz.pth",
            "tests/__init__.py",
        )
    ),
    "tests-edited": "printf 'import unittest\\n' > tests/test_visible.py && rm -f tests/__init__.py",
    "module-fifo": "rm lib/utils.py && mkfifo lib/utils.py",
    "module-symlink": "ln -sf /etc/passwd lib/utils.py",
    # A process left running keeps swapping a forgery in while the judge runs.
    "leftover-process": (
        f"printf %s {shlex.quote(FORGED_MODULE)} > /tmp/forged.py && (nohup sh -c "
        "'while :; do cp /tmp/forged.py lib/utils.py; for f in /proc/[0-9]*/fd/[12]; do "
        "echo forged > $f; done; sleep 0.02; done' >/dev/null 2>&1 &) && sleep 0.2"
    ),
}


@pytest.mark.parametrize("command", list(OUTSIDE_THE_MODULE.values()), ids=list(OUTSIDE_THE_MODULE))
async def test_swe_lite_files_and_processes_beside_the_module_earn_nothing(command):
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        await env.step(Action(text="", tool_calls=(ToolCall("bash", {"command": command}),)))
        assert await env.evaluate() == 0.0, env.test_output[-1500:]
        assert await env.evaluate() == 0.0, env.test_output[-1500:]  # and a later judge run
    finally:
        await env.close()


async def test_swe_lite_an_oversized_module_is_not_read_whole():
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        fill = ToolCall(
            "bash", {"command": "head -c 3000000 /dev/zero | tr '\\0' '#' >> lib/utils.py"}
        )
        await env.step(Action(text="", tool_calls=(fill,)))
        assert await env.evaluate() == 0.0
        assert "too large" in env.test_output, env.test_output[-500:]
    finally:
        await env.close()


# A right fix that prints at import and in every call (to stdout without a newline, to
# stderr) and mutates its arguments: still 1.0. It also checks that the judge's interpreter
# reaches no installed package (where the reference implementations could be imported from).
NOISY_FIX = """
import sys
if [p for p in sys.path if "-packages" in p]:  # the judge: the standard library only
    raise SystemExit("installed packages are reachable")
print("loading", end="")
print("on stderr", file=sys.stderr)
def mean(xs):
    print("mean of", xs, end="")
    total = sum(xs) if xs else None
    if total is None:
        raise ValueError("empty")
    n = len(xs)
    xs.clear()
    return total / n
"""


async def test_swe_lite_a_right_fix_that_prints_still_earns_the_reward():
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        await append_to_module(env, task, NOISY_FIX)
        assert await env.evaluate() == 1.0, env.test_output[-1500:]
    finally:
        await env.close()


# A module that answers the visible tests' inputs from a table and is wrong elsewhere.
HARD_CODED = """
_real_mean = mean
def mean(xs):
    return {(1, 2, 3, 4): 2.5, (5,): 5, (1, 2): 1.5}.get(tuple(xs)) or _real_mean(xs)
"""


async def test_swe_lite_answers_hard_coded_for_known_inputs_earn_nothing():
    task = RepoTasks().task(0, seed=0, split="train")
    env = SweLiteEnv(sandbox=SANDBOX)
    try:
        await env.reset(task)
        await append_to_module(env, task, HARD_CODED)
        assert await env.evaluate() == 0.0, env.test_output[-1500:]
    finally:
        await env.close()


# ------------------------------------------------------- through the orchestrator
@pytest.mark.parametrize("env_cls", [MathPythonEnv, SweLiteEnv], ids=["math_python", "swe_lite"])
async def test_sandboxed_envs_run_through_the_orchestrator(env_cls, tmp_path):
    from tunix_agentic.metrics import MetricsRecorder, read_scalars

    source = MathTasks() if env_cls is MathPythonEnv else RepoTasks()
    template = ChatTemplate(CharTokenizer(128))
    engine = JaxEngine(tiny_model(seed=3), EngineConfig(max_slots=8, max_seq_len=512))
    metrics = MetricsRecorder(tmp_path / "tb")
    before = sandbox_dirs()
    try:
        orch = RolloutOrchestrator.in_process(
            engine,
            lambda: env_cls(sandbox=SANDBOX),
            template,
            AgentConfig(max_turns=2, max_new_tokens=16),
            RolloutConfig(group_size=2, groups_per_batch=1, filter_uniform_groups=False),
            metrics=metrics,
        )
        (group,) = await orch.run_tasks([source.task(0, seed=0, split="train")], group_size=2)
        metrics.write_step(1)
    finally:
        await engine.close()
        metrics.close()
    # Sandbox start-up reaches TensorBoard, one start per episode.
    scalars = read_scalars(tmp_path / "tb")
    assert scalars["time/env/sandbox_start_count"] == [(1, 2.0)]
    assert scalars["time/env/sandbox_start_s"][0][1] > 0
    assert len(group.trajectories) == 2 and not group.dropped
    for traj in group.trajectories:
        assert traj.status in ("ok", "max_turns", "max_tokens") and traj.reward == 0.0
    assert sandbox_dirs() == before
    assert not [p for p in os.listdir("/proc") if p.isdigit() and _is_sandbox_process(p)]


def _is_sandbox_process(pid: str) -> bool:
    """A process of a sandbox uid that this process started or that was orphaned (another
    test run's sandboxes on the host are neither)."""
    try:
        if os.stat(f"/proc/{pid}").st_uid < 200_000:
            return False
        chain = [pid]
        while chain[-1] not in ("0", "1", str(os.getpid())):
            chain.append(Path(f"/proc/{chain[-1]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return chain[-1] == str(os.getpid()) or chain[1] == "1"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
