"""The house's structure: imports run one way between packages, every module says what it is
for, and the top-level API is curated, lazy and resolvable."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import tunix_agentic

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> import name (envs/ and learners/ install inside the package).
FOLDERS = {
    "tunix_agentic": "tunix_agentic",
    "envs": "tunix_agentic.envs",
    "learners": "tunix_agentic.learners",
}


def _modules() -> list[tuple[str, Path]]:
    out = []
    for folder, prefix in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts]
            parts = [p for p in parts if p != "__init__"]
            out.append((".".join([prefix, *parts]), path))
    return out


def _room(module: str) -> str:
    """The package (or top-level module) of ``tunix_agentic`` that ``module`` lives in."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "tunix_agentic"


def _import_graph(room=_room, prefix: str = "tunix_agentic.") -> dict[str, set[str]]:
    """Room -> rooms it imports anywhere in its files: at module level, inside functions
    and under ``TYPE_CHECKING`` alike (a lazy or typing import is still a dependency).
    ``room``: a module's room; ``prefix``: the modules looked at, on both ends."""
    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        if not module.startswith(prefix):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.startswith(prefix) and room(name) != room(module):
                    graph.setdefault(room(module), set()).add(room(name))
    return graph


def _cycle(graph: dict[str, set[str]]) -> str | None:
    """One import cycle of ``graph`` (``a -> b -> a``), or None."""
    state: dict[str, str] = {}

    def visit(room: str, path: list[str]) -> str | None:
        if state.get(room) == "done":
            return None
        if state.get(room) == "open":
            return " -> ".join([*path[path.index(room) :], room])
        state[room] = "open"
        for nxt in sorted(graph.get(room, ())):
            found = visit(nxt, [*path, room])
            if found:
                return found
        state[room] = "done"
        return None

    return next(filter(None, (visit(room, []) for room in sorted(graph))), None)


def test_imports_between_packages_form_no_cycle():
    graph = _import_graph()
    assert graph["trainer"] >= {"rollout", "learners", "inference"}  # the walk sees real edges
    assert "trainer" in graph["cli"]  # and lazy ones: the CLI imports the trainer on first use
    state: dict[str, str] = {}

    def visit(room: str, path: list[str]) -> None:
        if state.get(room) == "done":
            return
        assert state.get(room) != "open", f"import cycle: {' -> '.join([*path, room])}"
        state[room] = "open"
        for nxt in sorted(graph.get(room, ())):
            visit(nxt, [*path, room])
        state[room] = "done"

    for room in sorted(graph):
        visit(room, [])
    # The leaves stay leaves: a trajectory, an environment and the model know no engine
    # (an environment scores a trajectory: that record is all it knows of the rest).
    for leaf, known in (("trajectory", {"models"}), ("envs", {"models", "trajectory"})):
        assert not graph.get(leaf, set()) - known, (leaf, graph.get(leaf))
    assert not graph.get("models", set()), graph.get("models")


# Rollout's subpackages, each a room of its own; rollout's top-level modules are one more.
ROLLOUT_ROOMS = ("service", "client", "openai_endpoint")


def _rollout_room(module: str) -> str:
    """``service``, ``client`` or ``openai_endpoint`` for a module of that subpackage of
    ``tunix_agentic.rollout``; ``rollout`` for the top-level ones (``rollout.wire``...)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[2] in ROLLOUT_ROOMS else "rollout"


def test_rollout_subpackages_import_each_other_without_cycles():
    """The node, its OpenAI endpoint and the trainer's client import one another one way
    only; the wire format both sides speak is rollout's own (``rollout.wire``), not one
    side's."""
    graph = _import_graph(_rollout_room, prefix="tunix_agentic.rollout.")
    # The walk sees real edges: the node runs the endpoint and the episode runner, the
    # client speaks the wire format.
    assert graph["service"] >= {"openai_endpoint", "rollout"}, graph
    assert "rollout" in graph["client"], graph
    cycle = _cycle(graph)
    assert cycle is None, f"import cycle: {cycle}"


def test_every_module_opens_with_a_docstring():
    missing = [
        str(path.relative_to(ROOT))
        for _, path in _modules()
        if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not missing, missing


def test_the_public_api_resolves_to_its_defining_modules():
    assert tunix_agentic.__all__ and "Trainer" in tunix_agentic.__all__
    for name in tunix_agentic.__all__:
        obj = getattr(tunix_agentic, name)
        module = importlib.import_module(tunix_agentic._API[name])
        assert obj is getattr(module, name), name
    assert set(tunix_agentic.__all__) <= set(dir(tunix_agentic))
    try:
        tunix_agentic.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_importing_the_package_imports_no_jax():
    probe = (
        "import sys, tunix_agentic\n"
        "assert 'jax' not in sys.modules, 'jax imported eagerly'\n"
        "tunix_agentic.JaxEngine\n"
        "print(sorted(m for m in ('jax', 'flax') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert out.strip() == "['flax', 'jax']"  # and a name's use imports what it needs


# Host-side code: a CPU-only rollout node or environment server runs it without JAX.
HOST_SIDE = (
    "tunix_agentic.inference",
    "tunix_agentic.inference.base",
    "tunix_agentic.inference.pool",
    "tunix_agentic.inference.cross_policy",
    "tunix_agentic.agent.loop",
    "tunix_agentic.rollout.orchestrator",
    "tunix_agentic.serving.client",
    "tunix_agentic.serving.env_server",
    "tunix_agentic.cli.main",
)
DEVICE_LIBRARIES = ("jax", "flax", "optax", "orbax")


def test_host_side_modules_import_no_jax():
    """The engine contract, the agent loop, the HTTP client, ``serve-env`` and the CLI up to
    ``serve-env --help`` load none of JAX, Flax, Optax or Orbax."""
    probe = (
        "import sys\n"
        f"for name in {HOST_SIDE!r}: __import__(name)\n"
        "from tunix_agentic.cli.main import main\n"
        "try:\n"
        "    main(['serve-env', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({DEVICE_LIBRARIES!r})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def _module_import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports anywhere in its file: at module level, inside
    functions and under ``TYPE_CHECKING`` alike (a lazy import is still a dependency)."""
    known = {name for name, _ in _modules()}

    def resolve(name: str) -> str | None:
        while name and name not in known:  # ``from pkg.mod import name``: the module
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                target = resolve(name) if name.startswith("tunix_agentic.") else None
                # A package's __init__ re-exporting its modules is not a dependency back.
                if target and target != module and not module.startswith(target + "."):
                    graph.setdefault(module, set()).add(target)
    return graph


def test_modules_import_each_other_without_cycles():
    graph = _module_import_graph()
    assert "tunix_agentic.inference.config" in graph["tunix_agentic.inference.scheduler"]
    state: dict[str, str] = {}
    cycles: list[str] = []

    def visit(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            cycles.append(" -> ".join([*path[path.index(module) :], module]))
            return
        state[module] = "open"
        for nxt in sorted(graph.get(module, ())):
            visit(nxt, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
    assert not cycles, "\n".join(cycles)


def test_every_parametrize_names_its_cases():
    """``ids=`` on every ``pytest.mark.parametrize``, so a failing case reads as words."""
    missing = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", None) == "parametrize"
                and not any(k.arg == "ids" for k in node.keywords)
            ):
                missing.append(f"{path.name}:{node.lineno}")
    assert not missing, missing


def test_no_class_is_longer_than_350_lines():
    """A class past 350 lines holds more than one job: split it (the trainer's setup went to
    ``run_setup`` and its checkpoints to ``run_context``, the orchestrator's task stream,
    prefetch and batch queue to their own modules, the scheduler's admission and prefill
    planning to ``admission``, the node's request resolution to ``NodeSetup``)."""
    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})"
        for _, path in _modules()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 350
    ]
    assert not long, long
