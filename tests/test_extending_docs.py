"""The Extending pages' examples run as written (docs/extending/*.md): each
``<!-- example: NAME -->`` python block is saved as NAME, and the pages' files are
imported in order in one fresh interpreter (a page may import an earlier page's module, as
the group runner's imports the custom engine), printing what their comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("environment.md", "engine.md", "group_runner.md", "algorithms.md")
# What each page's scripts print (their comments say so).
PRINTS = {
    "environment.md": ["Shout gamma.", "[{'role': 'tool', 'content': 'GAMMA'}]", "1.0 True 1.0"],
    "engine.md": ["[1. 1.]"],
    "group_runner.md": ["[1. 1.] {0: "],
    "algorithms.md": ["[ 0.  -1.  -0.5]", "-0.75 0.0"],
}
_EXAMPLE = re.compile(r"<!-- example: (\S+\.py)[^>]*-->\n```python\n(.*?)```", re.S)
# Imported, not run as __main__: a module a later example imports is then the same module
# (an environment registered twice under two module names would be refused).
_DRIVER = """
import importlib, sys
for page, names in {order!r}:
    print(f"=== {{page}}", flush=True)
    for name in names:
        importlib.import_module(name.removesuffix(".py"))
    sys.stdout.flush()
"""


def examples(page: str) -> list[tuple[str, str]]:
    """``(file name, code)`` of each example block of ``docs/extending/<page>``."""
    return _EXAMPLE.findall((ROOT / "docs" / "extending" / page).read_text())


def test_every_extending_page_is_listed_and_has_an_example():
    assert sorted(PAGES) == sorted(p.name for p in (ROOT / "docs" / "extending").glob("*.md"))
    for page in PAGES:
        assert examples(page), f"docs/extending/{page} has no <!-- example: NAME --> block"


def test_the_extending_examples_run_and_print_what_they_say(tmp_path):
    order = []
    for page in PAGES:
        for name, code in examples(page):
            (tmp_path / name).write_text(code)
        order.append((page, [name for name, _ in examples(page)]))
    (tmp_path / "configs").symlink_to(ROOT / "configs")  # as run from the repository root
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER.format(order=order)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    printed = dict(re.findall(r"^=== (\S+)\n(.*?)(?=^=== |\Z)", done.stdout, re.M | re.S))
    for page, expected in PRINTS.items():
        for text in expected:
            assert text in printed[page], (page, text, printed[page])
