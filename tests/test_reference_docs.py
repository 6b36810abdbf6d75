"""The generated reference pages (tunix_agentic.config_reference, tunix_agentic.cli.reference):
the committed docs/reference/ pages are what the generators write now, every config key and
every CLI flag is on them, and the comment reader finds what a field's source says of it."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from tunix_agentic.cli.main import build_parser
from tunix_agentic.cli.reference import PAGES, REGENERATE, cli_commands, main
from tunix_agentic.config import RunConfig
from tunix_agentic.config_reference import config_keys, config_sections, md_text

ROOT = Path(__file__).resolve().parents[1]
PAGE_DIR = ROOT / "docs" / "reference"


@pytest.mark.parametrize("name", sorted(PAGES), ids=sorted(PAGES))
def test_the_committed_page_is_what_the_generator_writes(name):
    committed = (PAGE_DIR / name).read_text() if (PAGE_DIR / name).is_file() else ""
    assert committed == PAGES[name](), (
        f"docs/reference/{name} is stale (a config field, comment or CLI flag changed): "
        f"run `{REGENERATE}` and commit the result"
    )


def _leaf_keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key under ``cls``, walked apart from the generator's own walk."""
    keys = []
    hints = typing.get_type_hints(cls)
    for name, tp in ((f.name, hints[f.name]) for f in dataclasses.fields(cls)):
        args = typing.get_args(tp)
        if dataclasses.is_dataclass(tp):
            keys += _leaf_keys(tp, f"{prefix}{name}.")
        elif typing.get_origin(tp) is tuple and args and dataclasses.is_dataclass(args[0]):
            keys += _leaf_keys(args[0], f"{prefix}{name}[].")
        else:
            keys.append(prefix + name)
    return keys


def test_every_leaf_config_key_is_on_the_config_page():
    page = (PAGE_DIR / "config.md").read_text()
    keys = _leaf_keys(RunConfig)
    assert len(keys) > 150 and "learner.micro_batch_rows" in keys
    assert [k.key for k in config_keys()] == keys
    missing = [k for k in keys if not re.search(rf"^\| `{re.escape(k)}`", page, re.M)]
    assert not missing, f"not on docs/reference/config.md: {missing}; run `{REGENERATE}`"


def test_every_cli_flag_is_on_the_cli_page_under_its_command():
    page = (PAGE_DIR / "cli.md").read_text()
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    sections = dict(re.findall(r"^## (\S+)\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    assert list(sections) == list(sub.choices)
    missing = [
        f"{name} {flag}"
        for name, parser in sub.choices.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
        for flag in action.option_strings or [action.dest]
        if not re.search(rf"^\| `{re.escape(flag)}[ ,`]", sections[name], re.M)
    ]
    assert not missing, f"not on docs/reference/cli.md: {missing}; run `{REGENERATE}`"


def test_the_command_writes_the_pages_and_check_finds_them_stale_or_not(tmp_path, capsys):
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(PAGES)
    assert main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "cli.md").write_text("# CLI reference\n")
    assert main(["--check", "--out", str(tmp_path)]) == 1
    assert "cli.md is stale" in capsys.readouterr().err


# A small config tree whose source holds each kind of comment the reader must tell apart.
def _computed_paths() -> tuple[str, ...]:
    """Paths of this machine."""
    return ("/usr",)


@dataclasses.dataclass(frozen=True)
class _Inner:
    """An inner section.

    ``limit``: the most there may be (``mode``: not an entry here). ``name``: what it is
    called.
    """

    limit: int = 3
    name: str | None = None
    mode: Literal["a", "b"] = "a"  # noqa: E501

    config_aliases = {"title": "name"}


@dataclasses.dataclass(frozen=True)
class _Outer:
    # Above,
    # on two lines.
    steps: int = 10  # and trailing
    # Cut off by the blank line below.

    plain: float = 0.5
    paths: tuple[str, ...] = dataclasses.field(default_factory=_computed_paths)
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # a mapping
    schedule: tuple[tuple[int, int], ...] = ((0, 8),)
    inner: _Inner = _Inner(limit=5)
    items: tuple[_Inner, ...] = ()


_KEYS = {k.key: k for k in config_keys(_Outer)}


@pytest.mark.parametrize(
    ("key", "type_", "default", "description"),
    [
        ("steps", "int", "`10`", "Above, on two lines. and trailing"),
        ("plain", "float", "`0.5`", ""),
        ("paths", "list[str]", "computed: Paths of this machine.", ""),
        ("kwargs", "dict[str, any]", "`{}`", "a mapping"),
        ("schedule", "list[[int, int]]", "`[[0, 8]]`", ""),
        ("inner.limit", "int", "`5`", "the most there may be (`mode`: not an entry here)."),
        ("inner.name", "str | null", "`null`", "what it is called."),
        ("inner.mode", '"a" | "b"', "`a`", ""),
        ("items[].limit", "int", "`3`", "the most there may be (`mode`: not an entry here)."),
    ],
    ids=[
        "comment-above-and-trailing",
        "blank-line-cuts-the-comment-off",
        "computed-default-factory",
        "dict-factory",
        "nested-tuples",
        "nested-instance-default-and-docstring-entry",
        "optional",
        "literal-and-pragma-ignored",
        "list-of-sections",
    ],
)
def test_a_field_reads_its_type_default_and_description_from_its_source(
    key, type_, default, description
):
    found = _KEYS[key]
    assert (found.type, found.default, found.description) == (type_, default, description)


def test_sections_group_the_keys_by_top_level_field():
    sections = config_sections(_Outer)
    assert [(s.name, s.cls) for s in sections] == [
        ("", _Outer),
        ("inner", _Inner),
        ("items", _Inner),
    ]
    assert [k.key for k in sections[0].keys] == ["steps", "plain", "paths", "kwargs", "schedule"]


def test_an_alias_a_config_may_use_is_shown_beside_its_key():
    assert _KEYS["inner.name"].aliases == ("inner.title",)
    assert _KEYS["items[].name"].aliases == ("items[].title",)
    assert "| `env.imports` (or `env.import`) |" in (PAGE_DIR / "config.md").read_text()


@pytest.mark.parametrize(
    ("text", "markdown"),
    [
        (":class:`~a.b.Config` and :func:`load`", "`Config` and `load`"),
        ("``x | y`` stays code", "`x | y` stays code"),
        (
            "k*k rows, <think>, a|b, [0, 1], snake_case",
            r"k\*k rows, &lt;think>, a\|b, \[0, 1\], snake\_case",
        ),
        ("a lone ` backtick", r"a lone \` backtick"),
        ("two\n   lines", "two lines"),
    ],
    ids=["sphinx-roles", "code-span", "escaped-prose", "unbalanced-backtick", "one-line"],
)
def test_md_text_makes_one_safe_table_cell(text, markdown):
    assert md_text(text) == markdown


def test_a_parser_reads_as_commands_with_usage_and_arguments():
    parser = argparse.ArgumentParser(prog="tool")
    sub = parser.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run it")
    run.add_argument("--n", type=int, required=True, metavar="N", help="how many")
    run.add_argument("--mode", choices=["a", "b"], default="a", help="%(default)s or b")
    run.add_argument("--quiet", action="store_true", help="say less")
    run.add_argument("overrides", nargs="*", help="key=value")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command")
    (command,) = cli_commands(parser)
    assert (command.name, command.help) == ("run", "run it")
    assert command.usage == "tool run --n N [--mode {a,b}] [--quiet] [overrides ...] [-- CMD ...]"
    rows = [(a.invocation, a.default, a.help) for a in command.arguments]
    assert rows == [
        ("--n N", "", "(required) how many"),
        ("--mode {a,b}", "`a`", "a or b"),
        ("--quiet", "", "say less"),
        ("overrides", "", "key=value"),
        ("cmd", "", "the command"),
    ]
