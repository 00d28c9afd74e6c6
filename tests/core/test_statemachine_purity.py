"""statemachine/ stays pure: no I/O, no clock, no randomness, no concurrency, judged from every file's AST."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "statemachine"

FORBIDDEN_MODULES = {
    "trio",
    "httpx",
    "os",
    "time",
    "random",
    "secrets",
    "socket",
    "subprocess",
    "asyncio",
    "threading",
    "multiprocessing",
    "concurrent",
    "datetime",
    "pathlib",
    "io",
    "shutil",
    "tempfile",
    "signal",
    "select",
    "selectors",
    "logging",
    "sys",
    "uuid",
    "glob",
    "urllib",
    "http",
    "ssl",
    "pickle",
    "sqlite3",
    "hypercorn",
    "quart",
    "quart_trio",
    "pynvml",
}
FORBIDDEN_CALLS = {"open", "print", "input", "exec", "eval", "__import__", "breakpoint"}


def _files() -> list[Path]:
    files = sorted(PACKAGE.glob("*.py"))
    assert files, f"no Python files under {PACKAGE}"
    return files


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_no_impure_imports(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [
        f"{path.name}:{line} imports {name}"
        for line, name in _imported(tree)
        if name.split(".")[0] in FORBIDDEN_MODULES
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", _files(), ids=lambda p: p.name)
def test_no_io_builtins(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [
        f"{path.name}:{node.lineno} calls {node.func.id}()"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS
    ]
    assert not bad, "\n".join(bad)


def test_the_checker_sees_a_forbidden_import() -> None:
    tree = ast.parse("import os.path\nfrom time import monotonic\nfrom . import passes\n")
    assert [name for _, name in _imported(tree)] == ["os.path", "time"]
