"""The generated reference pages (tunix_agentic.config_reference, tunix_agentic.cli.reference,
.http_reference, .layout_reference): the committed docs/reference/ pages and the layout block
of docs/architecture.md are what the generators write now; every config key, CLI flag, HTTP
route and package is on them; and the comment reader finds what a field's source says of it."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from tunix_agentic.cli.http_reference import (
    ROUTE_BODIES,
    body_model,
    field_groups,
    live_routes,
    stale_notes,
    undescribed_routes,
)
from tunix_agentic.cli.layout_reference import block, render_layout, with_block
from tunix_agentic.cli.main import build_parser
from tunix_agentic.cli.reference import BLOCKS, PAGES, REGENERATE, cli_commands, main
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
    out, docs = tmp_path / "reference", tmp_path / "docs"
    docs.mkdir()
    for name in BLOCKS:  # the hand-written pages, their generated blocks emptied
        text = (ROOT / "docs" / name).read_text()
        (docs / name).write_text(with_block(text, ""))
    args = ["--out", str(out), "--docs", str(docs)]
    assert main(["--check", *args]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(PAGES)
    for name in BLOCKS:
        assert (docs / name).read_text() == (ROOT / "docs" / name).read_text()
    assert main(["--check", *args]) == 0
    (out / "cli.md").write_text("# CLI reference\n")
    (docs / "architecture.md").write_text(with_block((docs / "architecture.md").read_text(), "x"))
    assert main(["--check", *args]) == 1
    err = capsys.readouterr().err
    assert "cli.md is stale" in err and "architecture.md is stale" in err
    (docs / "architecture.md").write_text("# Architecture\n")  # its markers gone
    assert main(["--check", *args]) == 2
    assert "no generated block" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(BLOCKS), ids=sorted(BLOCKS))
def test_the_generated_block_of_a_hand_written_page_is_what_the_generator_writes(name):
    text = (ROOT / "docs" / name).read_text()
    assert text == with_block(text, BLOCKS[name]()), (
        f"the generated block of docs/{name} is stale: run `{REGENERATE}` and commit it"
    )


def _page_routes(page: str) -> dict[str, set[tuple[str, str]]]:
    """Section anchor -> the routes listed in its table (``| `METHOD /path` |`` rows)."""
    sections = re.findall(r"^## .*?\{ #(\S+) \}\n(.*?)(?=^## |\Z)", page, re.M | re.S)
    return {key: set(re.findall(r"^\| `([A-Z]+) (/\S*)` \|", body, re.M)) for key, body in sections}


def _missing_routes(page: str) -> list[str]:
    listed = _page_routes(page)
    return [
        f"{key} {r.method} {r.path}"
        for key, routes in live_routes().items()
        for r in routes
        if (r.method, r.path) not in listed.get(key, set())
    ]


def test_every_live_http_route_is_on_the_http_page_under_its_server():
    page = (PAGE_DIR / "http.md").read_text()
    live = live_routes()
    assert {"serve-engine", "serve-env", "serve-rollout", "openai"} <= set(live)
    assert ("POST", "/generate") in {(r.method, r.path) for r in live["serve-engine"]}
    assert ("POST", "/v1/chat/completions") in {(r.method, r.path) for r in live["openai"]}
    assert not _missing_routes(page), f"not on docs/reference/http.md; run `{REGENERATE}`"
    # The check fails when a route is left out: drop one row and it is named.
    cut = page.replace("| `POST /envs/{episode_id}/step` |", "| `POST /elsewhere` |")
    assert _missing_routes(cut) == ["serve-env POST /envs/{episode_id}/step"]


def test_the_env_server_app_built_here_lists_the_routes_the_page_has():
    """serve-env's app built apart from the generator: its router against the page."""
    import tunix_agentic.envs  # noqa: F401
    from tunix_agentic.serving.env_server import EnvServerConfig, build_env_app

    app = build_env_app(EnvServerConfig("countdown"))
    routes = {(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"}
    page = _page_routes((PAGE_DIR / "http.md").read_text())
    assert len(routes) >= 6 and routes == page["serve-env"]


def test_every_http_route_is_described_and_every_note_names_a_live_route():
    assert not undescribed_routes(), (
        "these routes' handlers have no docstring and tunix_agentic/cli/http_reference.py "
        f"no note: {undescribed_routes()}"
    )
    assert not stale_notes(), f"notes or bodies for routes no server has: {stale_notes()}"


def test_every_request_body_model_resolves_and_its_fields_are_on_the_page():
    page = (PAGE_DIR / "http.md").read_text()
    for bodies in ROUTE_BODIES.values():
        for body in (b for entry in bodies.values() for b in entry):
            model = body_model(body)
            for name, info in model.model_fields.items():
                assert f"`{info.alias or name}`" in page, (body.model, name)


def test_a_body_models_fields_are_grouped_by_the_public_class_declaring_them():
    from pydantic import BaseModel

    class Shared(BaseModel):
        """Fields many bodies take. More words."""

        hint: str = ""

    class _Base(BaseModel):
        input: str

    class _Body(_Base, Shared):
        n: int = 1

    groups = [(cls.__name__, fields) for cls, fields in field_groups(_Body)]
    assert groups == [("_Body", [("input", True), ("n", False)]), ("Shared", [("hint", False)])]


def test_every_package_is_in_the_layout_with_its_docstring():
    text = (ROOT / "docs" / "architecture.md").read_text()
    layout = block(text, "docs/architecture.md")
    folders = sorted(
        str(init.parent.relative_to(ROOT)) + "/"
        for root in ("tunix_agentic", "envs", "learners")
        for init in (ROOT / root).rglob("__init__.py")
    )
    assert "tunix_agentic/aot/" in folders and "tunix_agentic/cluster/" in folders
    missing = [f for f in folders if not re.search(rf"^\| `{re.escape(f)}`", layout, re.M)]
    assert not missing, f"not in the layout of docs/architecture.md: {missing}; run `{REGENERATE}`"
    assert "Ahead-of-time compilation of a run for a TPU topology" in render_layout()


def test_a_block_is_replaced_between_its_markers_only():
    page = "# T\n\n<!-- layout:start: a note\n  on two lines -->\nold\n<!-- layout:end -->\nafter\n"
    new = with_block(page, "new")
    assert (
        new
        == "# T\n\n<!-- layout:start: a note\n  on two lines -->\n\nnew\n\n<!-- layout:end -->\nafter\n"
    )
    assert block(new) == "new" and with_block(new, "new") == new
    with pytest.raises(ValueError, match="no generated block"):
        with_block("# T\n", "new", where="T.md")


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
