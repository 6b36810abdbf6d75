"""The package layout of docs/architecture.md, generated from the packages' docstrings.

Every package (``tunix_agentic/`` and each folder under it, and ``envs/`` and ``learners/``,
which install as ``tunix_agentic.envs`` and ``tunix_agentic.learners``) with the first
paragraph of its ``__init__`` docstring and its modules; then the modules at the top of
``tunix_agentic/`` with theirs. The docstrings are read from the source (``ast``), so no
package is imported (and no JAX loaded).

The block sits between :data:`START` and :data:`END` in a hand-written page: :func:`block`
reads it, :func:`with_block` replaces it (tunix_agentic/cli/reference.py writes and checks it).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

from tunix_agentic.config_reference import md_table, md_text

# Packages whose folder is not their import path (pyproject.toml: [tool.setuptools.package-dir]).
FOLDERS = {"tunix_agentic.envs": "envs", "tunix_agentic.learners": "learners"}
ROOTS = ("tunix_agentic", *FOLDERS)


@dataclasses.dataclass(frozen=True)
class Package:
    """One package: its import ``name``, the ``folder`` it lives in in the source tree,
    the first paragraph of its docstring and its modules' file names."""

    name: str
    folder: str
    summary: str
    modules: tuple[str, ...]


def _docstring(path: Path) -> str:
    """The first paragraph of the docstring of the file at ``path`` ("" without one)."""
    doc = ast.get_docstring(ast.parse(path.read_text()))
    return doc.split("\n\n")[0] if doc else ""


def _folder(name: str) -> str:
    for prefix, folder in FOLDERS.items():
        if name == prefix or name.startswith(prefix + "."):
            return folder + name[len(prefix) :].replace(".", "/") + "/"
    return name.replace(".", "/") + "/"


def _source_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name} is not an installed package")
    return Path(next(iter(spec.submodule_search_locations)))


def _walk(name: str, path: Path) -> list[Package]:
    modules = tuple(sorted(p.name for p in path.glob("*.py") if p.name != "__init__.py"))
    out = [Package(name, _folder(name), _docstring(path / "__init__.py"), modules)]
    subpackages = (p for p in sorted(path.iterdir()) if (p / "__init__.py").is_file())
    for sub in subpackages:
        if f"{name}.{sub.name}" not in FOLDERS:  # those are roots of their own
            out += _walk(f"{name}.{sub.name}", sub)
    return out


def packages() -> list[Package]:
    """Every package of the project, each one's subpackages after it."""
    return [package for root in ROOTS for package in _walk(root, _source_dir(root))]


def top_level_modules() -> list[tuple[str, str]]:
    """``(file name, first paragraph of its docstring)`` of the modules at the top of
    ``tunix_agentic/``."""
    root = _source_dir("tunix_agentic")
    return [
        (path.name, _docstring(path))
        for path in sorted(root.glob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
    ]


def render_layout() -> str:
    """The markdown of the generated block (without its markers)."""
    rows = []
    for package in packages():
        folder = f"`{package.folder}`"
        if package.name in FOLDERS:
            folder += f" (`{package.name}`)"
        modules = ", ".join(m.removesuffix(".py") for m in package.modules if m != "__main__.py")
        if package.name == "tunix_agentic":
            modules = "the modules below"
        rows.append([folder, md_text(package.summary), md_text(modules)])
    top = [[f"`{name}`", md_text(summary)] for name, summary in top_level_modules()]
    return "\n".join(
        [
            "Every package, with the first paragraph of its docstring and its modules",
            "(`envs/` and `learners/` install inside the package, as `tunix_agentic.envs` and",
            "`tunix_agentic.learners`):",
            "",
            *md_table(["Folder", "What it holds", "Modules"], rows),
            "",
            "The modules at the top of `tunix_agentic/`:",
            "",
            *md_table(["Module", "What it is"], top),
        ]
    )


START = "<!-- layout:start"
END = "<!-- layout:end -->"


def _bounds(text: str, where: str) -> tuple[int, int]:
    """Where the block's text begins (after the start marker, a comment that may span
    lines) and ends (at the end marker); ValueError naming ``where`` without them."""
    start = text.find(START)
    opened = text.find("-->", start) if start >= 0 else -1
    end = text.find(END, opened) if opened >= 0 else -1
    if end < 0:
        raise ValueError(f"{where} has no generated block ({START} ... --> then {END})")
    return opened + len("-->"), end


def block(text: str, where: str = "the page") -> str:
    """The generated block of a page's ``text`` (between the markers)."""
    begin, end = _bounds(text, where)
    return text[begin:end].strip("\n")


def with_block(text: str, body: str, where: str = "the page") -> str:
    """``text`` with its block replaced by ``body`` (a blank line either side)."""
    begin, end = _bounds(text, where)
    return text[:begin] + "\n\n" + body.strip("\n") + "\n\n" + text[end:]
