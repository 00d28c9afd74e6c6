"""spec/scheduler.md and the tests agree on the invariant and liveness ids.

- every id the spec defines (a table row ``| INV-… |`` or ``| LIVE-… |``) is cited by some test, in a comment
  or docstring ``checks: ID ID …``;
- every id a test cites is defined in the spec, and so is every id statemachine/invariants.py can raise;
- every "checked by" reference (``path.py::name`` or ``path.py::Class.method``) names a function that exists
  and cites that id.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "spec" / "scheduler.md"
TEST_DIRS = (ROOT / "tests", ROOT / "property_tests")

ID = r"(?:INV|LIVE)-[A-Z]+(?:-[A-Z]+)*"
ROW = re.compile(rf"^\|\s*({ID})\s*\|")
REFERENCE = re.compile(r"([\w/]+\.py)::([\w.]+)")
CITATION = re.compile(rf"checks:((?:[\s,]*{ID})+)")


def spec_rows() -> dict[str, list[tuple[str, str]]]:
    """id -> the (file, qualified name) references of its "checked by" cell."""
    rows: dict[str, list[tuple[str, str]]] = {}
    for line in SPEC.read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} is defined twice in the spec"
            checked_by = line.rstrip().rstrip("|").rsplit("|", 1)[-1]
            rows[match.group(1)] = REFERENCE.findall(checked_by)
    return rows


def cited(text: str) -> set[str]:
    return {i for group in CITATION.findall(text) for i in re.findall(ID, group)}


def _test_files() -> list[Path]:
    return sorted(p for d in TEST_DIRS for p in d.rglob("*.py") if p.name != "test_spec_ids.py")


def find_function(path: Path, qualified: str) -> str | None:
    """The source of ``name`` or ``Class.method`` in ``path`` (comments inside included), or None."""
    source = path.read_text()
    scope: list[ast.stmt] = ast.parse(source).body
    node: ast.AST | None = None
    for part in qualified.split("."):
        node = next(
            (
                n
                for n in scope
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.name == part
            ),
            None,
        )
        if node is None:
            return None
        scope = node.body  # type: ignore[attr-defined]
    return ast.get_source_segment(source, node) if node is not None else None


def test_the_spec_defines_ids_and_references() -> None:
    rows = spec_rows()
    assert len(rows) >= 20, sorted(rows)
    missing = [i for i, refs in rows.items() if not refs]
    assert not missing, f"ids without a 'checked by' reference: {missing}"


def test_every_spec_id_is_cited_by_a_test() -> None:
    citations: set[str] = set()
    for path in _test_files():
        citations |= cited(path.read_text())
    uncited = sorted(set(spec_rows()) - citations)
    assert not uncited, f"no test cites {uncited}"


def test_every_cited_id_is_in_the_spec() -> None:
    rows = spec_rows()
    unknown = {
        f"{path.relative_to(ROOT)}: {i}"
        for path in _test_files()
        for i in cited(path.read_text())
        if i not in rows
    }
    assert not unknown, f"tests cite ids the spec lacks: {sorted(unknown)}"


def test_every_id_the_checker_raises_is_in_the_spec() -> None:
    raised = set(re.findall(ID, (ROOT / "statemachine" / "invariants.py").read_text()))
    assert raised, "statemachine/invariants.py names no ids"
    missing = sorted(raised - set(spec_rows()))
    assert not missing, f"statemachine/invariants.py raises ids the spec lacks: {missing}"


def test_every_checked_by_reference_resolves_and_cites_its_id() -> None:
    problems = []
    for inv, refs in spec_rows().items():
        for file, qualified in refs:
            path = ROOT / file
            if not path.is_file():
                problems.append(f"{inv}: {file} does not exist")
                continue
            source = find_function(path, qualified)
            if source is None:
                problems.append(f"{inv}: {file}::{qualified} does not exist")
            elif inv not in cited(source):
                problems.append(f"{inv}: {file}::{qualified} does not cite it")
    assert not problems, "\n".join(problems)


def test_the_parsers_see_what_they_should() -> None:
    line = "x = 1  # checks: INV-CAP, INV-BUDGET LIVE-DRAIN\n"
    assert cited(line) == {"INV-CAP", "INV-BUDGET", "LIVE-DRAIN"}
    assert cited('"""checks: INV-ORDER"""') == {"INV-ORDER"}
    assert cited("mentions INV-CAP without the marker") == set()
    here = Path(__file__)
    assert find_function(here, "test_the_parsers_see_what_they_should") is not None
    assert find_function(here, "no_such_function") is None
