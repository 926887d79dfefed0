"""The architecture as a test: stage packages import only earlier stages, the core never imports
Dagster, the service, the CLI or the measurement harnesses, nothing below the command layer
(``lib``, ``defs``, ``serve``) imports it or the CLI, and the module graph has no cycle.

Every ``import`` is read from the source (AST), including the lazy ones inside functions, so a
late import cannot hide a dependency that runs back up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "rag_assets"
# the core's stages, in order: a module may import its own stage or an earlier one
STAGES = ["rag_assets.lib.models", "rag_assets.lib.ingest", "rag_assets.lib.index",
          "rag_assets.lib.query", "rag_assets.lib.evaluate"]  # fmt: skip
LEAVES = {"rag_assets.lib.types", "rag_assets.lib.observe", "rag_assets.settings",
          "rag_assets.lib"}  # import no rag_assets  # fmt: skip
# the command layer: the CLI's parser and dispatch, and one module per group of verbs
COMMANDS = ("rag_assets.cli", "rag_assets.commands")
# what sits below it, and never imports it (not even lazily, inside a function)
BELOW = ("rag_assets.lib", "rag_assets.defs", "rag_assets.serve")
# what runner.py held (issue 39): the graph runs, their progress, the Dagster UI, the status
RUNNER = ("rag_assets.defs.run", "rag_assets.defs.run_progress", "rag_assets.defs.ui",
          "rag_assets.serve.status")  # fmt: skip
# the package root: the entry point, the settings, the code location; the rest is in packages
ROOT = {"rag_assets", "rag_assets.cli", "rag_assets.settings", "rag_assets.definitions"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


MODULES = _modules()


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported rag_assets module, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top = {id(n) for n in tree.body}
    found: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in MODULES and "." in name:
                name = name.rpartition(".")[0]
            if name.startswith(("rag_assets", "dagster")) and (
                name in MODULES or name.startswith("dagster")
            ):
                found.append((name.split(".")[0] if name.startswith("dagster") else name,
                              id(node) in top))  # fmt: skip
    return found


def _stage(name: str) -> int | None:
    for i, s in enumerate(STAGES):
        if name == s or name.startswith(s + "."):
            return i
    return None


def test_every_module_was_found():
    assert "rag_assets.lib.index.store" in MODULES and "rag_assets.bench.speed" in MODULES
    assert len(MODULES) > 60


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("rag_assets.lib")))
def test_the_core_imports_only_earlier_stages(name):
    own = _stage(name)
    for dep, _ in _imports(MODULES[name]):
        assert dep != "dagster", f"{name} imports Dagster"
        if dep in LEAVES or dep == name:
            continue
        assert dep.startswith("rag_assets.lib."), f"{name} reaches up to {dep}"
        theirs = _stage(dep)
        assert own is not None and theirs is not None and theirs <= own, (
            f"{name} (stage {own}) imports {dep} (stage {theirs}): a later stage"
        )


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_nothing_but_the_commands_reaches_the_harnesses(name):
    if name.startswith("rag_assets.bench"):
        return
    for dep, top in _imports(MODULES[name]):
        if dep.startswith("rag_assets.bench"):
            assert _within(name, COMMANDS) and not top, f"{name} imports {dep}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith("rag_assets.defs")))
def test_dagster_definitions_sit_on_the_core_only(name):
    for dep, _ in _imports(MODULES[name]):
        assert not _within(dep, ("rag_assets.serve", *COMMANDS)), f"{name} imports {dep}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _within(n, BELOW)))
def test_nothing_below_the_commands_imports_them(name):
    """Issue 39: no arrow up, lazy imports included (the service's status report and the
    backfill's closing run live below the command layer, in serve.status and defs.run)."""
    for dep, top in _imports(MODULES[name]):
        where = "at module level" if top else "inside a function"
        assert not _within(dep, COMMANDS), f"{name} imports {dep} ({where})"


def test_the_package_root_holds_only_the_entry_point_settings_and_code_location():
    at_root = {n for n, p in MODULES.items() if p.parent == PKG and n != "rag_assets"}
    assert at_root | {"rag_assets"} == ROOT, sorted(at_root - ROOT)


def test_every_command_module_registers_its_verbs():
    from rag_assets.commands import COMMAND_MODULES

    for name in COMMAND_MODULES:
        tree = ast.parse(MODULES[f"rag_assets.commands.{name}"].read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body), name


@pytest.mark.parametrize("name", sorted(n for n in MODULES if _within(n, (*COMMANDS, *RUNNER))))
def test_the_command_layer_imports_no_private_name(name):
    """A name another module uses is public where it lives (``_x`` stays in its module): in the
    command layer and the pieces of the former runner.py."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rag_"):
            private = [a.name for a in node.names if a.name[:1] == "_" != a.name[1:2]]
            assert not private, f"{name} imports {private} from {node.module}"


def test_the_module_graph_has_no_cycle():
    graph = {n: {d for d, _ in _imports(p) if d in MODULES and d != n} for n, p in MODULES.items()}
    # a package __init__ that re-exports its parts is not a cycle with them
    for n in graph:
        graph[n] = {
            d for d in graph[n] if not (n.startswith(d + ".") and MODULES[d].name == "__init__.py")
        }
    state: dict[str, int] = {}

    def visit(n: str, path: list[str]) -> None:
        state[n] = 1
        for d in sorted(graph[n]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, n, d]))
            if d not in state:
                visit(d, [*path, n])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [])
