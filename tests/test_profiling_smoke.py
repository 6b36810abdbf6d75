"""Smoke tests of the benchmarks at a tiny scale: structure only, never timings. And the
``profiling`` package's shape: every module imports as part of it, none edits
``sys.path``, and every benchmark command the docs give names a module or script that
exists."""

import ast
import importlib
import json
import math
import os
import re
import sys
from pathlib import Path

import pytest

from tunix_agentic.testing import TINY_RUN_OVERRIDES

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(p.stem for p in (ROOT / "profiling").glob("*.py") if p.stem != "__init__")


@pytest.fixture
def bench(monkeypatch):
    """A module of the ``profiling`` package by its name (``bench_rollout``)."""
    for name in list(os.environ):
        if name.startswith("BENCH_"):
            monkeypatch.delenv(name)
    return lambda name: importlib.import_module(f"profiling.{name}")


def _check_latencies(figures: dict) -> None:
    p50, p95, p99 = (figures[f"latency_p{q}_s"] for q in (50, 95, 99))
    assert 0 <= p50 <= p95 <= p99


def test_bench_rollout_returns_both_modes(bench):
    mod = bench("bench_rollout")
    figures = mod.main(
        [
            "--trajectories=8",
            "--group-size=2",
            "--groups-per-batch=2",
            "--sft-steps=1",
            "--sft-batch=2",
            "--min-tool-use=0",
            # One slot and one prefill length: the fewest compiles.
            "--set=engine.max_slots=1",
            "--set=engine.min_prefill_len=128",
            "--pool=4",
            "--no-warmup",
            "--reset-s=0",
            "--tool-mean-s=0",
            "--eval-s=0",
            "--train-s=0",
        ]
    )
    assert {"sync", "async", "ratio", "tool_use_after_sft", "sft_steps"} <= set(figures)
    for mode in ("sync", "async"):
        f = figures[mode]
        assert f["mode"].split()[0] == mode
        assert f["trajectories"] >= 8
        assert f["wall_s"] > 0 and f["traj_per_s"] > 0
        assert f["engine_busy"] >= 0 and f["trainer_wait_s"] >= 0
        assert 0 <= f["tool_use"] <= 1 and 0 <= f["success"] <= 1
        _check_latencies(f)
    assert figures["ratio"] > 0 and math.isfinite(figures["ratio"])
    assert [r["extra"]["max_staleness"] for r in figures["sweep"]] == [1]
    for f in (figures["sync"], figures["async"]):  # the engine's time: busy, host gaps, idle
        # (Reported, never checked against the wall here: at this size a mode lasts a few
        # device calls, and a call is accounted when collected; test_engine checks the sum.)
        parts = [f["engine_busy"], f["extra"]["engine_sched_gap"], f["extra"]["engine_idle"]]
        assert all(p >= 0 for p in parts)
    assert figures["sync"]["extra"]["batches"] == 2
    assert figures["async"]["extra"]["orchestrator"]["groups_emitted"] >= 4


def test_bench_overhead_counts_every_episode(bench):
    mod = bench("bench_overhead")
    figures = mod.main(["--episodes=64", "--group-size=4"])
    assert figures["episodes"] == 64
    # The instant engine plays a calculator call, then an answer: two steps an episode.
    assert figures["steps"] == 128 and figures["statuses"] == {"ok": 64}
    assert figures["wall_s"] > 0 and figures["per_episode_us"] > 0 and figures["per_step_us"] > 0
    assert figures["retained_bytes_per_trajectory"] > 0
    assert figures["tracemalloc_peak_mb"] > 0 and figures["rss_peak_mb"] > 0


def test_bench_seeds_runs_each_seed(bench, capsys):
    tiny = [*TINY_RUN_OVERRIDES, "sft.steps=5", "sft.batch_size=4", "rl.steps=1", "rl.eval_tasks=2"]
    rows = bench("bench_seeds").main(["--seeds", "0,1", *tiny])
    assert [r["seed"] for r in rows] == [0, 1]
    assert all(0 <= r["before"] <= 1 and 0 <= r["after"] <= 1 for r in rows)
    out = capsys.readouterr().out
    assert "seed 0: held-out success" in out and "over 2 seeds" in out


def test_bench_engine_qwen3_runs_at_a_tiny_depth(bench, monkeypatch):
    for name, value in {
        "QWEN3_LAYERS": "1",
        "QWEN3_VOCAB": "2048",
        "QWEN3_BATCHES": "1,2",
        "QWEN3_PROMPT": "8",
        "QWEN3_NEW": "4",
        "QWEN3_REPEATS": "1",
    }.items():
        monkeypatch.setenv(name, value)
    import asyncio

    figures = asyncio.run(bench("bench_engine_qwen3").main())
    assert set(figures["batches"]) == {1, 2}
    for f in figures["batches"].values():
        assert f["tok_per_s"] > 0 and f["host_rss_gib"] > 0
        assert all(f[f"sampler_{m}_s"] > 0 for m in ("greedy", "temperature 1", "top-k/top-p"))
    assert figures["ratio"] > 0


_FAKE_SIDE = """
import pathlib, sys
log, side = pathlib.Path(sys.argv[1]), sys.argv[2]
runs = log.read_text().split() if log.exists() else []
log.write_text(" ".join([*runs, side]))
value = {"ours": [300, 300, 300, 300], "theirs": [100, 200, None, 600]}[side][runs.count(side)]
print(f"RESULT {side} B=16: {value:,} gen tok/s" if value else "Traceback: crashed")
"""


def test_bench_engine_floor_writes_a_row_per_model_and_batch(bench, tmp_path, capsys):
    """``--floor --json``: ours beside the bare loop; the same greedy tokens on both sides,
    no compile in a timed call (the engine was warmed up), and the row's fields."""
    out = tmp_path / "floor.json"
    bench("bench_engine").cli(
        ["--floor", "--models", "peers", "--batches", "1"] + ["--repeats", "1", "--json", str(out)]
    )
    rows = json.loads(out.read_text())
    assert [(r["model"], r["batch"]) for r in rows] == [("peers", 1)]
    row = rows[0]
    assert set(row) >= {
        "model",
        "batch",
        "ours_tok_s",
        "floor_tok_s",
        "ratio",
        "roofline_tok_s",
        "compiles_in_timed_calls",
    }
    assert row["compiles_in_timed_calls"] == 0 and row["ours_tok_s"] > 0 and row["ratio"] > 0
    printed = capsys.readouterr().out
    assert "greedy tokens equal to the floor's on 1/1 rows" in printed and "RESULT floor" in printed


def test_pairs_interleave_and_summarise(bench, tmp_path, capsys):
    # Real fresh processes for each side, as the peers' scripts run; their figures are fixed.
    mod = bench("pairs")
    script, log = tmp_path / "side.py", tmp_path / "order.log"
    script.write_text(_FAKE_SIDE)
    ours, theirs = (
        mod.process_measure(
            [sys.executable, str(script), str(log), side], {}, rf"{mod.NUMBER} gen tok/s"
        )
        for side in ("ours", "theirs")
    )
    c = mod.paired("ours / fake", ours, theirs, 4, unit="gen tok/s", higher_is_better=True)
    # The side that goes first alternates pair by pair.
    assert log.read_text().split() == ["ours", "theirs", "theirs", "ours"] * 2
    assert c.ratios == (3.0, 1.5, 0.5) and c.dropped == 1  # pair 3's peer printed no figure
    assert c.median == 1.5
    mod.emit_json("fake", 4, [c])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    s = last["comparisons"]["ours / fake"]
    assert (s["median_ratio"], s["min_ratio"], s["max_ratio"]) == (1.5, 0.5, 3.0)
    assert s["ours"] == [300, 300, 300] and s["theirs"] == [100, 200, 600]
    assert s["pairs"] == 3 and last["pairs_requested"] == 4
    # Times: above 1 still means ours is faster.
    assert mod.from_pairs("t", [(2.0, 3.0)], unit="s", higher_is_better=False).ratios == (1.5,)


def test_compare_peers_skips_missing_peers_and_still_prints_json(bench, monkeypatch, capsys):
    mod = bench("compare_peers")
    missing = {
        name: ("/nonexistent/python", script) for name, (_, script) in mod.PEER_SCRIPTS.items()
    }
    monkeypatch.setattr(mod, "PEER_SCRIPTS", missing)
    out = mod.main(["--pairs", "1"])
    assert out["skipped"] == ["tunix_sampler", "hf_generate"] and out["comparisons"] == {}
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == out


@pytest.mark.parametrize(
    "argv",
    [["--pairs", "0"], ["--modes", "beam"], ["--peers", "vllm"], ["--repeats", "0"]],
    ids=["zero-pairs", "unknown-mode", "unknown-peer", "zero-repeats"],
)
def test_compare_peers_rejects_bad_flags(bench, argv, capsys):
    with pytest.raises(SystemExit):
        bench("compare_peers").main(argv)
    assert argv[0] in capsys.readouterr().err


@pytest.mark.parametrize("name", MODULES, ids=MODULES)
def test_every_benchmark_imports_as_part_of_the_package(name):
    """``python -m profiling.NAME`` from the repository root: no module finds another
    through a ``sys.path`` edit or by sitting beside it."""
    importlib.import_module(f"profiling.{name}")


def _edits_sys_path(tree: ast.AST) -> bool:
    """Whether ``tree`` calls a method of ``sys.path`` or assigns to it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if ast.unparse(node.func.value) == "sys.path":
                return True
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(ast.unparse(t) == "sys.path" for t in targets):
                return True
    return False


def test_no_script_outside_the_library_edits_sys_path():
    """Benchmarks import ``profiling.common``; the peers' scripts, the soaks, the example
    agent and the docs tools find their neighbours as scripts do (their folder comes first
    on ``sys.path``)."""
    paths = [
        *(ROOT / "profiling").rglob("*.py"),
        *(ROOT / "examples").rglob("*.py"),
        *(ROOT / "tools").rglob("*.py"),
        *(ROOT / "tests").glob("soak_*.py"),
    ]
    assert len(paths) > 20  # the walk sees the benchmarks, the peers and the soaks
    editing = [str(p.relative_to(ROOT)) for p in paths if _edits_sys_path(ast.parse(p.read_text()))]
    assert not editing, editing
    assert _edits_sys_path(ast.parse("import sys\nsys.path.insert(0, 'x')\n"))  # it can fail


COMMAND = re.compile(r"python\s+(?:-m\s+(profiling(?:\.[a-z_0-9]+)+)|([\w./-]+\.py))")


def test_every_command_in_the_docs_names_what_exists():
    """``python -m profiling.X`` and ``python PATH.py`` in README.md and docs/ (figure
    stamps included) name a module of the package or a script in the repository."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found, missing = 0, []
    for doc in docs:
        for module, script in COMMAND.findall(doc.read_text()):
            found += 1
            path = ROOT / (module.replace(".", "/") + ".py" if module else script)
            if not path.is_file():
                missing.append(f"{doc.relative_to(ROOT)}: {module or script}")
    assert found > 20 and not missing, missing
