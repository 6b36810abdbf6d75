"""The weights directories of HTTP engine clients: removed on close, at exit, and after a
crash by the next writer, never while their writer lives (real processes, real flocks)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tunix_agentic.serving.weights_dir import WeightsDirs, sweep_dead_writers

BOUND_S = 60  # a bound against hangs, never a timing assertion

# A writer in its own process: it writes one version under ROOT (or a temporary directory
# of its own), prints the directory, then ends as told: killed, or a plain exit.
_WRITER = """
import os, signal, sys
from tunix_agentic.serving.weights_dir import WeightsDirs
root, end = sys.argv[1] or None, sys.argv[2]
w = WeightsDirs(root, "dead" + str(os.getpid()))
path = w.path_for(7)
path.mkdir()
(path / "params").write_text("x")
print(path, flush=True)
if end == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _writer(root: Path | None, end: str, tmpdir: Path) -> Path:
    env = {**os.environ, "TMPDIR": str(tmpdir)}
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(root or ""), end],
        capture_output=True,
        text=True,
        timeout=BOUND_S,
        env=env,
    )
    assert done.stdout.strip(), done.stderr[-2000:]
    return Path(done.stdout.strip())


@pytest.fixture
def tmpdir_here(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


@pytest.mark.parametrize("shared", [True, False], ids=["shared-weights-dir", "own-temp-dir"])
def test_a_killed_writers_directory_is_removed_by_the_next_writer_a_live_ones_kept(
    tmp_path, tmpdir_here, shared
):
    root = tmp_path / "weights" if shared else None
    live = WeightsDirs(root, "live")
    live_path = live.path_for(3)
    live_path.mkdir()
    try:
        dead = _writer(root, "kill", tmpdir_here)
        assert dead.is_dir()  # SIGKILL: nothing of the writer ran after it
        removed = sweep_dead_writers(root)
        assert dead in removed and not dead.exists()
        assert live_path.is_dir()  # its writer holds the lock
        if not shared:
            assert not dead.parent.exists()  # the dead writer's own temp dir, whole
        # The next client's first write sweeps too (no sweep called by hand).
        dead = _writer(root, "kill", tmpdir_here)
        nxt = WeightsDirs(root, "next")
        nxt.path_for(1)
        assert not dead.exists() and live_path.is_dir()
        nxt.close()
    finally:
        live.close()
    assert not live_path.exists()
    if shared:
        assert not any(root.iterdir())  # directories and locks: every writer closed


def test_a_writer_that_exits_without_close_leaves_nothing(tmp_path, tmpdir_here):
    for root in (tmp_path / "weights", None):
        path = _writer(root, "exit", tmpdir_here)
        assert not path.exists()
    assert not any(tmpdir_here.iterdir())
