"""The fault soaks of rollout as a service, as tests.

tests/soak_rollout.py at a small scale: two engine servers and two rollout nodes as real
processes, tool calls that crash and hang in real sandboxes, an engine server and a node
SIGKILLed and restarted. tests/soak_engine_kill.py at full scale (heavy: the default
recipe's 40 RL steps through a node whose only engine is SIGKILLed after step 8). Both
scripts also run by hand at any scale (``python tests/soak_rollout.py --help``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BOUND_S = 600  # a bound against hangs, never a timing assertion


def _run_bounded(argv: list[str], env: dict[str, str], bound_s: float):
    """Run ``argv`` in the repository root in its own session: past ``bound_s`` the script
    and the servers it started are killed. The process, its stdout and its stderr."""
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "JAX_PLATFORMS": "cpu"},
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=bound_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return proc, out, err


@pytest.mark.slow  # five processes, ~50 s on 2 quiet cores
def test_the_fault_soak_loses_no_group_and_leaves_nothing_behind():
    argv = [sys.executable, str(REPO / "tests" / "soak_rollout.py")]
    # 48 episodes are too few for the memory check (its baseline comes after the restarts,
    # by when most of the span has passed): left out, and the result must say so.
    argv += ["--episodes", "48", "--rss-from", "24", "--node-kill-at", "0.25"]
    argv += ["--no-memory-check"]
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    proc, out, err = _run_bounded(argv, env, BOUND_S)
    lines = out.strip().splitlines()
    assert lines and lines[-1].startswith("{"), out[-2000:] + err[-3000:]
    result = json.loads(lines[-1])
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed and proc.returncode == 0, (failed, result, err[-3000:])
    assert result["groups"] == 12 and result["episodes"] == 48
    assert "node_rss_within_10pct" not in result["checks"]
    assert "not checked" in result["rss_note"]
    # The faults were met: the node was killed with groups running, which the client
    # placed again; tool calls crashed or hung.
    assert result["faults"]["node"]["groups_running"] >= 1
    assert result["resubmissions"] >= 1 and result["nodes_taken_out"] >= 1
    assert result["tool_calls"] >= result["scored"]  # turns end, and run the tool
    assert result["tool_crashes"] + result["hangs_cut"] >= 1
    assert not result["leftovers"]["idle"][0] and not result["leftovers"]["after_stop"][1]


@pytest.mark.parametrize(
    "taken_at, on_time",
    [(24, True), (36, True), (37, False), (47, False)],
    ids=["at-the-planned-episode", "half-the-span-left", "past-half", "next-to-last"],
)
def test_the_soaks_memory_check_fails_when_its_baseline_came_too_late(taken_at, on_time):
    import soak_rollout  # tests/, beside this module

    # Memory flat from baseline to end: the check passes only when it measured a span.
    got = soak_rollout.rss_verdict(24, taken_at, 48, [1000, 2000], [1000, 2000])
    assert got["on_time"] is on_time and got["within_10pct"] is on_time
    assert (got["note"] is None) is on_time
    if not on_time:
        assert f"taken at {taken_at} of 48" in got["note"] and "not checked" in got["note"]
    grown = soak_rollout.rss_verdict(24, 24, 48, [1000, 2000], [1000, 2300])
    assert grown["change"] == [0.0, 0.15] and not grown["within_10pct"]


@pytest.mark.heavy  # the default recipe's 40 RL steps and three servers: 3-10 min on 2 cores
def test_a_run_survives_its_only_engine_killed_and_still_learns():
    env = {k: v for k, v in os.environ.items() if k != "TUNIX_AGENTIC_API_KEY"}
    argv = [sys.executable, str(REPO / "tests" / "soak_engine_kill.py"), "--timeout-s", "1500"]
    proc, out, err = _run_bounded(argv, env, 3 * BOUND_S)
    lines = out.strip().splitlines()
    results = [ln for ln in lines if ln.startswith("{")]
    assert results and lines[-1] in ("PASS", "FAIL"), out[-2000:] + err[-3000:]
    result = json.loads(results[-1])
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed and proc.returncode == 0, (failed, result, err[-3000:])
    # The fault was met mid-run, and the engine came back before the run ended.
    assert result["fault"]["killed_after_step"] >= 8 and result["fault"]["engine_back_after_s"] > 0
    assert not result["steps_not_once"] and not result["steps_beyond_n"]
