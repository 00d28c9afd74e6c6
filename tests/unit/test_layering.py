"""The packages form layers: a module imports only from its own layer or the ones below it, and no two
modules import each other, directly or through others (imports under TYPE_CHECKING and inside functions
count). docs/architecture.md describes the layers in this order."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom to top. A module belongs to the longest prefix listed here.
LAYERS = (
    ("statemachine",),
    ("router.frozenmap", "router.version", "router.placement"),
    ("router.config",),
    ("router.hosts",),
    ("router.deploy",),
    ("router.journal",),
    ("router.shell",),
    ("router.observe",),
    ("router.http",),
    ("router.serve",),
    ("router.cli",),
    ("router", "router.__main__"),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in ("router", "statemachine"):
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imported(name: str, path: Path, known: set[str]) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of one of ``known`` in the module, wherever it is written."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            # "from pkg import mod" imports the module pkg.mod when there is one.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                yield node.lineno, target


def layer_of(name: str) -> int:
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {
        name: {target for _, target in imported(name, path, known) if target != name}
        for name, path in found.items()
    }


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer_of(name) < 0] == []


def test_imports_only_go_down() -> None:
    found = modules()
    known = set(found)
    upward = [
        f"{name}:{line} imports {target}, a layer above it"
        for name, path in found.items()
        for line, target in imported(name, path, known)
        if layer_of(target) > layer_of(name)
    ]
    assert upward == []


def test_pure_layers_import_nothing_of_the_shell() -> None:
    """The scheduler and the memory arithmetic can be read, tested and reused without any I/O layer."""
    edges = graph()
    for name, targets in edges.items():
        if name.startswith("statemachine"):
            assert all(t.startswith("statemachine") for t in targets), (name, targets)
        if name.startswith("router.placement"):
            assert all(t.startswith(("router.placement", "router.frozenmap")) for t in targets), (
                name,
                targets,
            )


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that returns to its start, or None."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if colour.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in colour and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        colour[node] = 2
        return None

    for start in sorted(edges):
        if start not in colour and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle() -> None:
    assert find_cycle(graph()) is None


def test_the_cycle_check_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_layer_check_sees_an_upward_import(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from router.http.app import create_app\n"
    )
    targets = [t for _, t in imported("router.placement.x", path, set(modules()))]
    assert targets == ["router.http.app"]
    assert layer_of("router.http.app") > layer_of("router.placement.x")


def test_handlers_and_observers_see_the_router_only_through_its_views() -> None:
    """router/http and router/observe read the running router through router.shell.views; only the wiring
    (router/serve, and router/observe/observers.py, which hands the metrics and the history to the router's
    listeners) holds the Router itself."""
    root = Path(__file__).resolve().parents[2]
    allowed = {"router/observe/observers.py"}
    found = []
    for folder in ("router/http", "router/observe"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and node.module == "router.shell.runtime":
                    found.append(f"{rel}:{node.lineno}")
    assert not found, found
