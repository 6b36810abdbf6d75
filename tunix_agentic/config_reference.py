"""The config reference (docs/reference/config.md), generated from the run config's dataclasses.

:func:`config_sections` walks :class:`~tunix_agentic.config.RunConfig`'s tree of dataclasses
and lists every leaf key in dotted form (``learner.micro_batch_rows``; ``tasks[].weight`` for
a field of each item of a list) with its type, its default (``RunConfig()``'s, written as
YAML) and its description: the comment lines directly above the field in its source and a
``# ...`` comment trailing it, else the field's ``name``: entry in its class's docstring.
``python -m tunix_agentic.cli.reference`` rewrites the page; tests/test_reference_docs.py
fails while it is stale.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import json
import re
import textwrap
import tokenize
import types
import typing
from typing import Any

import yaml

from tunix_agentic.config import RunConfig

# Comments that speak to a tool, not to a reader of the config.
_PRAGMA = re.compile(r"^(noqa|type:|pragma|fmt:)")
# Built-in factories whose product is the same on every machine, so it can be shown.
_PLAIN_FACTORIES = (dict, list, tuple, set, frozenset)


@dataclasses.dataclass(frozen=True)
class ConfigKey:
    """One leaf setting of the run config, as the reference page shows it."""

    key: str  # dotted: "learner.micro_batch_rows"; "tasks[].weight" in each item of a list
    type: str  # in YAML's terms: "int", "str | null", "list[str]", '"dense" | "paged"'
    default: str  # markdown: a YAML value in backticks, or what computes it
    description: str  # markdown, from the source's comments; "" when the field has none
    aliases: tuple[str, ...] = ()  # other spellings a config may use: ("env.import",)


@dataclasses.dataclass(frozen=True)
class ConfigSection:
    """A top-level section of the run config (``name`` "" for the top-level keys)."""

    name: str
    cls: type
    keys: tuple[ConfigKey, ...]


def config_sections(root: type = RunConfig) -> list[ConfigSection]:
    """``root``'s leaf keys, grouped by top-level section in field order (top-level keys
    first); defaults are those of ``root()``, the items of a list those of its item class."""
    instance = root()
    hints = typing.get_type_hints(root)
    top, sections = [], []
    for field in dataclasses.fields(root):
        tp, value = hints[field.name], getattr(instance, field.name)
        item = _list_item(tp)
        if dataclasses.is_dataclass(tp):
            sections.append(ConfigSection(field.name, tp, tuple(_leaves(tp, value, field.name))))
        elif item is not None:
            keys = tuple(_leaves(item, item(), f"{field.name}[]"))
            sections.append(ConfigSection(field.name, item, keys))
        else:
            top.append(_leaf(root, field, tp, value, field.name))
    return [ConfigSection("", root, tuple(top)), *sections]


def config_keys(root: type = RunConfig) -> list[ConfigKey]:
    """Every leaf key of ``root``, in the page's order."""
    return [key for section in config_sections(root) for key in section.keys]


def _leaves(cls: type, value: Any, prefix: str) -> list[ConfigKey]:
    hints = typing.get_type_hints(cls)
    out = []
    for field in dataclasses.fields(cls):
        tp, key = hints[field.name], f"{prefix}.{field.name}"
        item = _list_item(tp)
        if dataclasses.is_dataclass(tp):
            out.extend(_leaves(tp, getattr(value, field.name), key))
        elif item is not None:
            out.extend(_leaves(item, item(), f"{key}[]"))
        else:
            out.append(_leaf(cls, field, tp, getattr(value, field.name), key))
    return out


def _list_item(tp: Any) -> type | None:
    """The item class of a list of sections (``tuple[TaskSourceConfig, ...]``), else None."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple and args and dataclasses.is_dataclass(args[0]):
        return args[0]
    return None


def _leaf(cls: type, field: dataclasses.Field, tp: Any, value: Any, key: str) -> ConfigKey:
    factory = field.default_factory
    if factory is not dataclasses.MISSING and factory not in _PLAIN_FACTORIES:
        # Computed where the run starts (the running Python's paths, say): this machine's
        # value would be wrong on the reader's and make the page differ between machines.
        summary = (inspect.getdoc(factory) or "").split("\n\n")[0].replace("\n", " ")
        default = (
            f"computed: {md_text(summary)}" if summary else f"computed by `{factory.__name__}()`"
        )
    else:
        default = f"`{yaml_value(value)}`"
    parent = key.rpartition(".")[0]
    aliases = tuple(
        f"{parent}.{alias}" if parent else alias
        for alias, name in getattr(cls, "config_aliases", {}).items()
        if name == field.name
    )
    description = md_text(field_descriptions(cls)[field.name])
    return ConfigKey(key, type_name(tp), default, description, aliases)


def type_name(tp: Any) -> str:
    """A field's type as a YAML writer reads it: tuples are lists, ``None`` is null."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is type(None):
        return "null"
    if tp is Any:
        return "any"
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"list[{type_name(args[0])}]"
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    if origin in (list, dict):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", str(tp))


def yaml_value(value: Any) -> str:
    """``value`` as one line of YAML (tuples as lists): what a config file would hold."""
    text = yaml.safe_dump(_plain(value), default_flow_style=True, width=10**6).strip()
    return text.removesuffix("...").strip()


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@functools.cache
def field_descriptions(cls: type) -> dict[str, str]:
    """Each field of dataclass ``cls`` -> its description ("" for none), as plain text.

    The comment lines directly above the field (no blank line between) and a comment on
    the field's own lines after its code, joined; a field with neither gets the text after
    ``name``: in the class docstring (up to the next field's entry or the paragraph's end).
    """
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    rows = source.splitlines()
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, alone on its line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row, col = tok.start
            text = tok.string.lstrip("#").strip()
            if not _PRAGMA.match(text):
                comments[row] = (text, not rows[row - 1][:col].strip())
    (classdef,) = [n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)]
    found = {}
    for node in classdef.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above, row = [], node.lineno - 1
        while row in comments and comments[row][1]:
            above.insert(0, comments[row][0])
            row -= 1
        trailing = [
            comments[r][0]
            for r in range(node.lineno, node.end_lineno + 1)
            if r in comments and not comments[r][1]
        ]
        found[node.target.id] = " ".join(t for t in [*above, *trailing] if t)
    names = [f.name for f in dataclasses.fields(cls)]
    documented = _docstring_entries(inspect.getdoc(cls) or "", names)
    return {name: found.get(name) or documented.get(name, "") for name in names}


def _docstring_entries(doc: str, names: list[str]) -> dict[str, str]:
    """``name``: entries of a docstring (SandboxConfig's, RayConfig's) -> their text.

    An entry opens a line or follows a sentence's ``.`` or ``;`` (one inside parentheses
    belongs to the entry around it)."""
    marks = [
        m
        for m in re.finditer(r"``(\w+)``:\s", doc)
        if m.group(1) in names and _opens_entry(doc[: m.start()].rstrip(" "))
    ]
    out = {}
    for i, mark in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(doc)
        text = doc[mark.end() : end].split("\n\n")[0]
        out.setdefault(mark.group(1), " ".join(text.split()).rstrip(";"))
    return out


def _opens_entry(before: str) -> bool:
    return not before or before.endswith(("\n", ".", ";"))


_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):`(~?)([^`]+)`")
# Characters a markdown table cell's prose must escape: emphasis, links, the cell's
# border, and HTML (a comment naming <think> is not a tag).
_ESCAPE = {c: "\\" + c for c in "\\*_[]|"} | {"<": "&lt;"}


def md_text(text: str) -> str:
    """Docstring or comment text as one line of markdown for a table cell: Sphinx roles
    and ````code```` become ``code`` spans, and the prose between them is escaped."""
    text = _ROLE.sub(
        lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text
    )
    parts = " ".join(text.replace("``", "`").split()).split("`")
    if len(parts) % 2 == 0:  # an odd number of backticks: no code spans
        return "\\`".join(_escape(part) for part in parts)
    return "`".join(part if i % 2 else _escape(part) for i, part in enumerate(parts))


def _escape(prose: str) -> str:
    return "".join(_ESCAPE.get(c, c) for c in prose)


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """The lines of a markdown table in the reference pages' frame (docs/stylesheets/extra.css:
    its first column stays on one line)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return ['<div class="reference-table" markdown>', "", *lines, "", "</div>"]


def _summary(cls: type) -> str:
    """The first paragraph of ``cls``'s own docstring ("" without one)."""
    doc = cls.__dict__.get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes when none
        return ""
    return md_text(inspect.cleandoc(doc).split("\n\n")[0])


def _key_cell(key: ConfigKey) -> str:
    aliases = ", ".join(f"`{a}`" for a in key.aliases)
    return f"`{key.key}` (or {aliases})" if aliases else f"`{key.key}`"


def render_config_reference(root: type = RunConfig) -> str:
    """The markdown of docs/reference/config.md."""
    sections = config_sections(root)
    out = [
        "# Config reference",
        "",
        "<!-- Generated by `python -m tunix_agentic.cli.reference` from the dataclasses under",
        "     RunConfig: edit their comments and run it again, not this page. -->",
        "",
        "Every key of a run config, in the dotted form an override takes",
        "(`tunix-agentic train learner.micro_batch_rows=4`); in a YAML file each dot is a level",
        "of nesting. `tasks` is a list: `tasks[].weight` is the `weight` of each of its items.",
        "The defaults are those of `RunConfig()`, written as YAML; a config file replaces",
        "some (`tunix-agentic train` without `--config` reads `configs/calculator_tiny.yaml`).",
        "An unknown key or a value of the wrong type stops the run with an error naming the key.",
        "[Recipes in the config](../recipes.md) shows the keys at work.",
    ]
    for section in sections:
        title = f"`{section.name}`" if section.name else "Top level"
        where = f"`{section.cls.__name__}` in `{section.cls.__module__}`"
        summary = _summary(section.cls)
        out += ["", f"## {title}", "", f"{where}: {summary}" if summary else f"{where}."]
        rows = [[_key_cell(k), f"`{k.type}`", k.default, k.description] for k in section.keys]
        out += ["", *md_table(["Key", "Type", "Default", "Description"], rows)]
    return "\n".join(out) + "\n"
