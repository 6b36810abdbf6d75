"""The Colab quickstart notebook, executed top to bottom on CPU (nbclient), at a tiny scale."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tunix_agentic.testing import TINY_RUN_OVERRIDES

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "quickstart.ipynb"


@pytest.mark.slow
def test_the_quickstart_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    nbclient = pytest.importorskip("nbclient")
    nbformat = pytest.importorskip("nbformat")
    # A working copy of what the notebook reads (it finds the package installed, so the
    # install cell clones and installs nothing).
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    overrides = [*TINY_RUN_OVERRIDES, "engine.max_seq_len=128", "rl.steps=2"]
    monkeypatch.setenv("TUNIX_AGENTIC_DEMO_OVERRIDES", " ".join(overrides))
    monkeypatch.setenv("TUNIX_AGENTIC_REPO", "")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()
    text = "\n".join(
        out.get("text", "")
        for cell in notebook.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    assert "held-out success:" in text and "(2 steps" in text
    assert "eval/success_fraction" in text
    assert "'config.json'" in text and "'tokenizer.json'" in text
    assert "set RUN_REAL = True" in text
    assert (tmp_path / "runs" / "colab_tiny_hf" / "model.safetensors").is_file()
    assert os.environ.get("TUNIX_AGENTIC_REPO") == ""
