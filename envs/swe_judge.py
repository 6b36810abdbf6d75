"""The swe_lite judge: the agent's functions against the reference, on arguments it never saw.

:func:`judge_module` puts the agent's ``lib/utils.py`` (and nothing else of the agent's) into a
fresh sandbox with the harness (:mod:`tunix_agentic.envs.swe_harness`), sends it the cases
(function name and arguments: each function's visible-test arguments, its fixed edge cases
and :data:`RANDOM_CASES` fresh random ones drawn for this judgement), and reads back the values
returned as data. The expected values are computed here, in this process, from the reference
implementations in :mod:`tunix_agentic.envs.swe_repos`, and never enter the sandbox. Reward
1.0 needs exactly one well-formed values line with one value per case, each equal to the
reference's (numbers by value, as ``assertEqual`` does, ``int`` vs ``float`` alike; every
other type exactly; exceptions by type name).

Why this holds against the code under test: it runs in the harness's process and can print
anything, patch anything, exit at any point, but all it can produce is a claim of values for
arguments it sees only when called, and a claim earns the reward only when every value is the
right one, which for fresh random arguments takes computing the functions right: fixing the
bug. Files it writes beside the module never leave the agent's sandbox, and the judge's
sandbox (own directory, uid, PID namespace) is gone after the one run. The harness's
interpreter runs isolated (``-I``) and without ``site`` (``-S``): the standard library only,
so no installed package (this one's reference implementations included) can be imported, and
every sandbox sees this package's folders empty (:mod:`tunix_agentic.envs.sandbox`), so its
sources cannot be read either, even from a regular install's ``site-packages``. The
interpreter is the sandbox's own, by absolute path (never a bare ``python`` looked up on a
``PATH`` that could miss it and score every module 0).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tunix_agentic.envs import swe_harness
from tunix_agentic.envs.sandbox import Sandbox, SandboxConfig, SandboxError
from tunix_agentic.envs.swe_repos import BY_NAME, MODULE, reference

RANDOM_CASES = 12  # per function and judgement
MAX_MODULE_BYTES = 1 << 20  # a lib/utils.py larger than this scores 0 unread
MAX_OUTPUT_CHARS = 2_000_000  # of the harness run kept; a longer values line is cut, scores 0
HARNESS = "swe_harness.py"
_HARNESS_SOURCE = Path(swe_harness.__file__).read_text()


@dataclasses.dataclass(frozen=True)
class Case:
    """One call the judge makes: ``function(*args)``; ``args`` are plain JSON data."""

    function: str
    args: tuple[Any, ...]

    def shown(self) -> str:
        return f"{self.function}({', '.join(map(repr, self.args))})"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`judge_module`: ``reward`` (1.0 or 0.0), how many of ``total``
    cases returned the reference's value (``matched``; 0 when no values came back), and
    ``report``: what went wrong, for logs (it shows expected values: never give it to the
    agent)."""

    reward: float
    matched: int
    total: int
    report: str


def check_functions(names: Any) -> list[str]:
    """``names`` as a list of known library function names; ValueError naming the problem."""
    if (
        not isinstance(names, (list, tuple))
        or not names
        or not all(isinstance(n, str) and n in BY_NAME for n in names)
        or len(set(names)) != len(names)
    ):
        raise ValueError(
            "task.data['functions'] must be a non-empty list of distinct names among "
            f"{', '.join(BY_NAME)}, got {names!r:.200}"
        )
    return list(names)


def make_cases(names: Sequence[str], rng: random.Random) -> list[Case]:
    """Each function's visible-test and fixed arguments, then :data:`RANDOM_CASES` drawn with
    ``rng``; arguments go through JSON here, so the reference sees what the harness will."""
    cases = []
    for name in check_functions(names):
        f = BY_NAME[name]
        drawn = [f.draw(rng) for _ in range(RANDOM_CASES)]
        for args in (*f.visible, *f.hidden, *drawn):
            cases.append(Case(name, tuple(json.loads(json.dumps(list(args))))))
    return cases


def expected_value(case: Case) -> Any:
    """The reference's answer to ``case``, in :func:`canonical` form."""
    return canonical(swe_harness.call(reference(case.function), list(case.args)))


def canonical(tree: Any, depth: int = 0) -> Any:
    """An :func:`~tunix_agentic.envs.swe_harness.encode`-d value as plain hashable tuples
    that compare by ``==`` as the judge means it (``("num", 5) == ("num", 5.0)``, lists and
    tuples apart, dicts unordered). ValueError for anything malformed."""
    if depth > swe_harness.MAX_DEPTH + 1 or not isinstance(tree, list) or not tree:
        raise ValueError("not a tagged value")
    tag, rest = tree[0], tree[1:]
    if tag == "none" and not rest:
        return ("none",)
    if len(rest) != 1:
        raise ValueError(f"a {tag!r:.20} value takes one payload")
    payload = rest[0]
    if tag == "bool" and isinstance(payload, bool):
        return ("bool", payload)
    if tag == "int" and isinstance(payload, str) and payload.lstrip("-").isdigit():
        return ("num", int(payload))
    if tag == "float" and isinstance(payload, str) and len(payload) < 40:
        return ("num", float(payload))
    if tag in ("str", "raised", "unsupported") and isinstance(payload, str):
        return (tag, payload)
    if tag in ("list", "tuple") and isinstance(payload, list):
        return (tag, tuple(canonical(v, depth + 1) for v in payload))
    if tag == "dict" and isinstance(payload, list):
        if not all(isinstance(p, list) and len(p) == 2 for p in payload):
            raise ValueError("dict items must be [key, value] pairs")
        items = frozenset((canonical(k, depth + 1), canonical(v, depth + 1)) for k, v in payload)
        if len({k for k, _ in items}) != len(payload):
            raise ValueError("a dict with a repeated key")
        return ("dict", items)
    raise ValueError(f"not a tagged value: {tag!r:.20}")


def parse_values(output: str, count: int) -> list[Any]:
    """The one values line in the harness's ``output``, as ``count`` canonical values.

    ValueError when there is no such line or more than one, or it is not a JSON list of
    ``count`` well-formed values (NaN and infinities as JSON constants refused)."""
    lines = [ln for ln in output.splitlines() if ln.startswith(swe_harness.MARKER)]
    if len(lines) != 1:
        raise ValueError(f"{len(lines)} values lines in the harness's output, not 1")
    text = lines[0][len(swe_harness.MARKER) :]
    if len(text) > MAX_OUTPUT_CHARS:
        raise ValueError("the values line is too long")

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} in the values line")

    try:
        values = json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise ValueError("the values line is nested too deeply") from None
    if not isinstance(values, list) or len(values) != count:
        raise ValueError(f"the values line does not hold {count} values")
    try:
        return [canonical(v) for v in values]
    except RecursionError:
        raise ValueError("a value is nested too deeply") from None


def read_module(sandbox: Sandbox, path: str = MODULE) -> str:
    """The text of the agent's module, read without following links, refusing anything but a
    regular file and reading at most :data:`MAX_MODULE_BYTES` (ValueError / OSError)."""
    dir_fd, name = sandbox.resolve(path)
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = f.read(MAX_MODULE_BYTES + 1)
    if len(data) > MAX_MODULE_BYTES:
        raise ValueError(f"{path} is too large (over {MAX_MODULE_BYTES} bytes)")
    return data.decode("utf-8", "replace")


async def judge_module(
    source: str,
    functions: Sequence[str],
    config: SandboxConfig,
    *,
    timeout: float,
    rng: random.Random | None = None,
) -> Verdict:
    """Judges ``source`` (the agent's ``lib/utils.py``) on ``functions`` (see the module
    docstring) in a fresh sandbox of ``config``, the run bounded by ``timeout`` seconds.

    ``rng`` draws the random arguments (default: seeded from :mod:`secrets`, new every call).
    Raises :class:`~tunix_agentic.envs.sandbox.SandboxError` when the sandbox cannot start
    (an infrastructure fault, not the agent's)."""
    rng = rng if rng is not None else random.Random(secrets.randbits(64))
    cases = make_cases(functions, rng)
    expected = [expected_value(c) for c in cases]
    request = json.dumps([[c.function, list(c.args)] for c in cases]) + "\n"
    async with Sandbox(config) as judge:
        judge.write_file("lib/__init__.py", "")
        judge.write_file(MODULE, source)
        judge.write_file(HARNESS, _HARNESS_SOURCE)
        if judge.python is None:  # a bare "python" could miss and score every module 0
            raise SandboxError("no Python interpreter can run in the judge's sandbox")
        result = await judge.run(
            [judge.python, "-I", "-S", "-B", HARNESS, judge.cwd or "."],
            timeout=timeout,
            input=request,
            max_output=MAX_OUTPUT_CHARS,
        )
    tail = result.output[-3000:]
    if result.timed_out:
        return Verdict(0.0, 0, len(cases), f"timed out after {timeout:g}s\n{tail}")
    try:
        got = parse_values(result.output, len(cases))
    except ValueError as exc:
        return Verdict(0.0, 0, len(cases), f"no values: {exc}\n{tail}")
    wrong = [(c, g, w) for c, g, w in zip(cases, got, expected, strict=True) if g != w]
    report = "".join(
        f"{c.shown():.200}: got {g!r:.200}, expected {w!r:.200}\n" for c, g, w in wrong[:5]
    )
    matched = len(cases) - len(wrong)
    summary = f"{matched}/{len(cases)} cases returned the expected value\n"
    return Verdict(0.0 if wrong else 1.0, matched, len(cases), summary + report + tail)
