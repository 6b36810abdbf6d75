"""The docs site builds with --strict (broken links, missing anchors and pages left out of the
nav fail), and the README stays a front door: the two set-up commands first, at most 300 lines,
its links to the docs pages resolving."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
HAS_MKDOCS = all(
    importlib.util.find_spec(name) is not None
    for name in ("mkdocs", "material", "mkdocstrings_handlers.python")
)
needs_mkdocs = pytest.mark.skipif(
    not HAS_MKDOCS, reason="mkdocs / mkdocs-material / mkdocstrings-python not installed"
)


def build(root: Path, out: Path) -> subprocess.CompletedProcess:
    # No -q: a quiet build does not count warnings, so --strict would pass them.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(out)]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)


@needs_mkdocs
def test_the_docs_site_builds_with_strict(tmp_path):
    done = build(ROOT, tmp_path / "site")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for page in ("index", "getting_started", "performance", "compare", "changelog"):
        assert (tmp_path / "site" / f"{page}.html").is_file(), page
    # The API pages hold the seams' docstrings, their Sphinx roles turned into links
    # (tools/griffe_sphinx_roles.py): none is left as written.
    api = (tmp_path / "site" / "reference" / "api" / "environments.html").read_text()
    assert "register_env" in api and "client_kwargs" in api
    assert ":class:" not in api and ":func:" not in api
    assert 'href="#envs.base.StepResult"' in api
    # The compare page and the example run's folder live side by side.
    assert (tmp_path / "site" / "compare" / "index.html").is_file()
    assert (tmp_path / "site" / "report" / "reward.png").is_file()


@needs_mkdocs
def test_a_page_left_out_of_the_nav_or_a_broken_link_fails_the_build(tmp_path):
    site = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", site / "docs")
    for name in ("mkdocs.yml", "CHANGELOG.md"):
        shutil.copy(ROOT / name, site / name)
    for name in ("tunix_agentic", "envs", "learners", "tools"):  # what the API pages read
        (site / name).symlink_to(ROOT / name)
    (site / "docs" / "orphan.md").write_text("# Orphan\n\nSee [nowhere](nowhere.md).\n")
    done = build(site, tmp_path / "site")
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "orphan.md" in out and "nowhere.md" in out, out[-3000:]


def setup_section() -> str:
    text = README.read_text()
    first = re.search(r"^## (.*)$", text, re.MULTILINE)
    assert first and first.group(1) == "Set-up: two commands", "README: set-up must come first"
    return text[first.end() : text.index("\n## ", first.end())]


def test_the_readme_is_a_front_door_with_the_two_commands_first():
    assert len(README.read_text().splitlines()) <= 300
    block = re.search(r"```bash\n(.*?)```", setup_section(), re.DOTALL)
    assert block, "README: the set-up section has no bash block"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    # The first installs what a user needs, no contributor tools; the second adds them.
    assert commands == [
        "pip install -e . && tunix-agentic train",
        "pip install -e '.[dev]' && python -m pytest -q",
    ]
    # CI runs the README's test command.
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = re.escape(commands[1])
    assert re.search(rf"^{test_command}$", ci, re.MULTILINE), ".ci/run no longer runs it"


def test_the_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to missing files: {missing}"


BROWSER = next(
    (shutil.which(b) for b in ("chromium-headless-shell", "chromium") if shutil.which(b)), None
)
# Injected into a copy of a built page: once it has laid out, what reaches past the window
# (the page itself, and each code block, table or picture cut behind a scrollbar) is
# written into the DOM, which the browser then prints.
_PROBE = """<script>
window.addEventListener('load', () => setTimeout(() => {
  const out = {page: document.documentElement.scrollWidth - window.innerWidth, cut: []};
  for (const el of document.querySelectorAll('pre, code, table, .md-typeset__scrollwrap, img')) {
    if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible')
      out.cut.push(el.tagName + ': ' + (el.innerText || el.src || '').slice(0, 80));
  }
  const d = document.createElement('pre'); d.id = 'overflow-report';
  d.textContent = JSON.stringify(out); document.body.appendChild(d);
}, 100));
</script>"""


def _overflow(page: Path, width: int = 1280, extra: str = "") -> dict:
    """What of ``page`` (a built HTML file) a ``width`` px window cuts: ``page``, how far
    the page reaches past it (px), and ``cut``, the elements with a horizontal scrollbar."""
    html = page.read_text().replace("</body>", extra + _PROBE + "</body>")
    probe = page.with_name(f"_probe_{page.name}")
    probe.write_text(html)
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={width},900"]
    cmd += ["--virtual-time-budget=3000", "--dump-dom", probe.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="overflow-report">(.*?)</pre>', dom, re.S)
    assert found, f"no report from the browser for {page.name}: {dom[-500:]}"
    text = found.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">")
    return json.loads(text.replace("&amp;", "&"))


@needs_mkdocs
@pytest.mark.skipif(
    BROWSER is None, reason="no headless Chromium (apt-get install chromium-headless-shell)"
)
def test_the_key_pages_read_at_1280_px_without_a_horizontal_scrollbar(tmp_path):
    """Home, Getting started, Before you book a TPU, the reference pages' wide tables and an
    API page's signatures, as a laptop's browser lays them out: no code block, table or
    picture cut behind a scrollbar, and no page wider than the window; the site loads no web
    font (it reads offline)."""
    site = tmp_path / "site"
    done = build(ROOT, site)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in (
        "index",
        "getting_started",
        "before_you_book_a_tpu",
        "reference/config",
        "reference/cli",
        "reference/http",
        "reference/api/engines",
    ):
        report = _overflow(site / f"{name}.html")
        assert report["page"] <= 0 and not report["cut"], (name, report)
    assert "fonts.googleapis" not in (site / "index.html").read_text()
    # The probe sees a cut when there is one: a table wider than its scrolling frame, as
    # mkdocs-material frames every table.
    wide = '<div class="md-typeset__scrollwrap" style="overflow-x:auto;width:600px"><table>'
    wide += (
        '<tr><td style="white-space:nowrap">' + "a wide column " * 80 + "</td></tr></table></div>"
    )
    (cut,) = _overflow(site / "index.html", extra=wide)["cut"]
    assert cut.startswith("DIV: a wide column")
