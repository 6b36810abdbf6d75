"""The wheel: every package of the tree inside ``tunix_agentic``, nothing at the top level.

The folders ``envs/`` and ``learners/`` install as ``tunix_agentic.envs`` and
``tunix_agentic.learners``; a top-level ``envs`` or ``learners`` (both exist
on PyPI) installed beside us must not touch them, nor we them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tree_packages() -> set[str]:
    """Import names of the source tree's packages (folders with an ``__init__.py``)."""
    names = set()
    for top, prefix in (("tunix_agentic", "tunix_agentic"), ("envs", "tunix_agentic.envs")):
        names |= {
            ".".join([prefix, *p.parent.relative_to(ROOT / top).parts])
            for p in (ROOT / top).rglob("__init__.py")
        }
    names |= {
        ".".join(["tunix_agentic.learners", *p.parent.relative_to(ROOT / "learners").parts])
        for p in (ROOT / "learners").rglob("__init__.py")
    }
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Built from a copy: a build writes build/ and *.egg-info beside the sources.
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("tunix_agentic", "envs", "learners"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(src)],
        check=True,
        cwd=out,
    )
    (path,) = out.glob("tunix_agentic-*.whl")
    return path


def test_the_wheel_holds_every_package_under_tunix_agentic(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert all(t == "tunix_agentic" or t.endswith(".dist-info") for t in tops), tops
    packages = {
        n.removesuffix("/__init__.py").replace("/", ".") for n in names if n.endswith("__init__.py")
    }
    assert packages == _tree_packages()  # pyproject's package list matches the tree
    assert "tunix_agentic/envs/calculator.py" in names
    assert "tunix_agentic/learners/grpo.py" in names
    assert "tunix_agentic/py.typed" in names


def test_installs_beside_top_level_envs_and_learners_packages(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
        + [str(wheel)],
        check=True,
    )
    for other in ("envs", "learners"):  # stand-ins for the PyPI packages of these names
        (target / other).mkdir()
        (target / other / "__init__.py").write_text(f"WHO = 'the other {other}'\n")
    probe = (
        "import envs, learners, tunix_agentic.envs as e, tunix_agentic.learners.grpo as g\n"
        "print(envs.WHO, '|', learners.WHO, '|', e.__file__, '|', g.__file__)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    # -I would drop PYTHONPATH; -P keeps the current directory off sys.path instead.
    out = subprocess.run(
        [sys.executable, "-P", "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    ).stdout.strip()
    theirs_envs, theirs_learners, ours_envs, ours_grpo = (s.strip() for s in out.split("|"))
    assert theirs_envs == "the other envs" and theirs_learners == "the other learners"
    assert ours_envs.startswith(str(target / "tunix_agentic" / "envs"))
    assert ours_grpo.startswith(str(target / "tunix_agentic" / "learners"))
