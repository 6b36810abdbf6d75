"""A Griffe extension for the docs site's API pages (mkdocs.yml: mkdocstrings' python handler).

The project's docstrings cross-reference in Sphinx's roles (``:class:`~tunix_agentic.envs.tools.Tool```,
``:meth:`evaluate```); mkdocstrings reads Markdown. Each role becomes an optional
cross-reference: a link when the target is documented on some page of the site, plain code
otherwise (mkdocs-autorefs leaves an unresolved optional reference as text, so a strict build
stays clean). A name is resolved where the docstring stands (its class, then its module), and
``tunix_agentic.envs`` / ``tunix_agentic.learners`` become ``envs`` / ``learners``, the
folders the site's pages load them from. An RST ``::`` before a code block becomes ``:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):`(~?)([^`<>]+)`")
_FOLDERS = {"tunix_agentic.envs": "envs", "tunix_agentic.learners": "learners"}


def _identifier(obj: griffe.Object, target: str, loader: griffe.GriffeLoader | None) -> str:
    """The dotted path of ``target`` as the site knows it, seen from ``obj``."""
    if target.startswith("."):  # relative to the package: ``.api``, ``~.schema``
        package = obj.module if obj.module.is_package else obj.module.parent
        for _ in range(len(target) - len(target.lstrip(".")) - 1):
            package = package.parent or package
        target = f"{package.path}.{target.lstrip('.')}"
    else:  # a name in scope (a member, an import), or one followed by attributes
        head, dot, rest = target.partition(".")
        try:
            target = obj.resolve(head) + dot + rest
        except griffe.NameResolutionError:
            pass
    target = _in_folders(target)
    if loader is not None:  # a re-export (``envs.ToolEnvironment``): where it is defined
        try:
            found = loader.modules_collection[target]
            target = _in_folders(found.target_path if found.is_alias else found.path)
        except Exception:  # not loaded (yet), or not an object: keep the path as written
            pass
    return target


def _in_folders(path: str) -> str:
    for prefix, folder in _FOLDERS.items():
        if path == prefix or path.startswith(prefix + "."):
            return folder + path[len(prefix) :]
    return path


def markdown_roles(obj: griffe.Object, text: str, loader: griffe.GriffeLoader | None = None) -> str:
    """``text`` with its Sphinx roles as optional cross-references (see the module doc)."""

    def link(match: re.Match) -> str:
        short, target = match.group(1), match.group(2).strip()
        shown = target.lstrip(".").rsplit(".", 1)[-1] if short else target.lstrip(".")
        return (
            f'<autoref identifier="{_identifier(obj, target, loader)}" optional>'
            f"<code>{shown}</code></autoref>"
        )

    text = _ROLE.sub(link, text)
    return re.sub(r"(\S)::\n\n", r"\1:\n\n", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring's Sphinx roles once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        obj.docstring.value = markdown_roles(obj, obj.docstring.value, loader)
