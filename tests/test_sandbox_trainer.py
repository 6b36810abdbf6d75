"""Nothing of a sandboxed run outlives the trainer: Ctrl-C stops it cleanly with every sandbox
closed, and after SIGKILL its sandboxes die with it and the next sweep removes their files."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tunix_agentic.envs.sandbox import bwrap_problem, sweep_orphans
from tunix_agentic.testing import TINY_RUN_OVERRIDES, cli

ROOT = Path(__file__).parents[1]
CONFIG = str(ROOT / "configs" / "calculator_tiny.yaml")
SANDBOX_UID_BASE = 200_000  # SandboxConfig.uid_base's default


def start_trainer(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A sandboxed run (math_python, a random tiny model) whose TMPDIR is ``tmp_path``, so
    its sandboxes live in a directory of this test's own."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    cmd = cli(
        "train",
        "--quiet",
        "--config",
        CONFIG,
        *TINY_RUN_OVERRIDES,
        "env.name=math_python",
        "sft.steps=0",
        "rl.steps=50",
        "rl.eval_tasks=64",
        "agent.max_new_tokens=24",
        "engine.max_seq_len=512",
        f"run_dir={tmp_path / 'run'}",
    )
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    root = tmp / f"tunix-sandboxes-{os.geteuid()}"
    deadline = time.monotonic() + 240
    while not (root.is_dir() and _sandbox_dirs(root)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"no sandbox appeared (exit {proc.returncode}): {err[-3000:]}")
        time.sleep(0.1)
    return proc, root


def _sandbox_dirs(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]


def _sandboxed_pids(marker: str) -> list[int]:
    """Processes of a sandbox: running as a sandbox uid (under root) or naming ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            uid = os.stat(f"/proc/{entry}").st_uid
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if (os.geteuid() == 0 and uid >= SANDBOX_UID_BASE) or marker.encode() in cmdline:
            pids.append(int(entry))
    return pids


def _wait_until(check, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bwrap: {bwrap_problem()}")


@needs_bwrap
def test_ctrl_c_of_the_trainer_closes_every_sandbox(tmp_path):
    proc, root = start_trainer(tmp_path)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    assert _sandbox_dirs(root) == []  # closed by the run itself, not by a sweep
    assert _wait_until(lambda: _sandboxed_pids(str(root)) == [], 10)


@needs_bwrap
def test_sigkill_of_the_trainer_leaves_nothing_after_a_sweep(tmp_path):
    proc, root = start_trainer(tmp_path)
    proc.kill()
    proc.communicate(timeout=60)
    # --die-with-parent: the kernel ends every sandbox of the killed trainer.
    assert _wait_until(lambda: _sandboxed_pids(str(root)) == [], 10), _sandboxed_pids(str(root))
    left = _sandbox_dirs(root)
    assert left  # a killed process cannot remove its directories...
    swept = sweep_orphans(root)
    assert sorted(swept) == sorted(left) and _sandbox_dirs(root) == []  # ...the sweep does
