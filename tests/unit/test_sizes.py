"""No module under router/ or statemachine/ over 500 lines, no function (a method, a nested function) over 80:
a file or a function that long holds more than one idea. Split it into well-named parts, keeping each idea in
one file. A function's length runs from its ``def`` line to its last line (its decorators not counted)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("router", "statemachine")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def sources() -> Iterator[tuple[str, str]]:
    """(path relative to the repository, text) of every module of the packages."""
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8")


def long_functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function in ``tree`` longer than the limit, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        name = prefix
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    yield name, lines
            name += "."
        yield from long_functions(node, name)


def offenders() -> dict[str, str]:
    """What breaks a limit (a module by its path, a function by "path:name"), with how long it is."""
    found: dict[str, str] = {}
    for rel, text in sources():
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found[rel] = f"{lines} lines (most {MAX_MODULE_LINES})"
        for name, length in long_functions(ast.parse(text, rel)):
            found[f"{rel}:{name}"] = f"{length} lines (most {MAX_FUNCTION_LINES})"
    return found


def test_no_module_or_function_is_too_long() -> None:
    found = offenders()
    assert not found, "too long; split into well-named parts:\n" + "\n".join(
        f"  {key}: {size}" for key, size in sorted(found.items())
    )


def test_the_measure_counts_nested_functions_and_methods() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))  # 80 lines at depth 2
    text = f"def short():\n    pass\n\nclass C:\n    def method(self):\n{body}\n\n"
    text += f"def outer():\n    def inner():\n{body}\n    return inner\n"
    assert dict(long_functions(ast.parse(text))) == {
        "C.method": MAX_FUNCTION_LINES + 1,
        "outer": MAX_FUNCTION_LINES + 3,
        "outer.inner": MAX_FUNCTION_LINES + 1,
    }
