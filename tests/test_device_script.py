"""profiling/device/run.sh, the prepared accelerator check, run here with --cpu at tiny sizes:
structure only, never timings."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DEVICE = Path(__file__).resolve().parents[1] / "profiling" / "device"


def _driver():
    spec = importlib.util.spec_from_file_location("device_check", DEVICE / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--sections", "decode,bogus"], "--sections: unknown ['bogus']"),
        (["--models", "qwen3-7b"], "--models: unknown ['qwen3-7b']"),
    ],
    ids=["section", "model"],
)
def test_the_driver_names_a_bad_option(argv, message, capsys):
    with pytest.raises(SystemExit):
        _driver().parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_driver_defaults_are_the_issue_s_sizes():
    args = _driver().parse_args([])
    assert args.batches == [1, 16, 64, 256] and (args.prompt, args.new) == (128, 64)
    assert args.sections == "decode,grpo,rl" and args.models.split(",")[0] == "qwen3-0.6b"
    cpu = _driver().parse_args(["--cpu"])
    assert cpu.batches == [1, 2] and cpu.new < args.new


@pytest.mark.slow  # ~1 minute on 2 cores: two engines, transformers, a learner step, a run
def test_run_sh_cpu_runs_every_section(tmp_path):
    out = tmp_path / "figures.json"
    argv = ["--cpu", "--models", "smollm2", "--batches", "1", "--repeats", "1"]
    argv += ["--rl-steps", "1", "--out", str(out)]
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE_WHEELS": str(tmp_path / "none")}
    proc = subprocess.run(
        ["bash", str(DEVICE / "run.sh"), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["cpu"] and report["backend"] == "cpu"
    assert report["failed"] == [] and report["skipped"] == []
    decode = report["decode"]["smollm2"]
    for side in ("ours", "transformers"):
        assert decode[side]["1"]["tok_per_s"] > 0
    assert report["grpo"]["rows"] == 4 and report["grpo"]["micro_batch_rows"] == 2
    assert report["rl"]["steps"] == 1 and 0 <= report["rl"]["success_after"] <= 1
    for line in ("RESULT decode smollm2 ours B=1", "RESULT grpo", "RESULT rl"):
        assert line in proc.stdout
