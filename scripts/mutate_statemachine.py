"""Mutation testing of the pure scheduler: how many single-point breaks of statemachine/ the pure tests catch.

Each mutant changes one point of one module (an AST edit): a comparison flipped, ``and``/``or`` swapped, an
int constant moved by one, ``min``/``max`` swapped, a statement replaced by ``pass``, a returned value
dropped. Every mutant runs the pure tiers (tests/core/test_*.py and the property machines under the
``mutation`` Hypothesis profile: derandomized, no shrinking, fewer examples; ``PYTHONHASHSEED=0``) in its own
copy of the repository, several at a time. The report goes to outputs/mutation-report.json.

A mutant is named by its file, the function that holds it and ``what`` (the edit and the code it edits, e.g.
``and -> or: request.local_only and remote``), which stay the same when lines move; the report's ``key``
(``file:line:kind#index``) also names it, for this version of the code only. A survivor must either be
killed by a new test or be listed, with its reason, in property_tests/EQUIVALENT_MUTANTS.md; the script
exits 1 when a survivor is neither (``unlisted`` in the report).

    python3 scripts/mutate_statemachine.py                 # every mutant, one job per core
    python3 scripts/mutate_statemachine.py --limit 40      # a seeded sample of 40
    python3 scripts/mutate_statemachine.py --limit 40 --seed commit   # the sample CI runs at this commit
    python3 scripts/mutate_statemachine.py --key statemachine/passes.py:267:return#14   # one mutant
    python3 scripts/mutate_statemachine.py --survivors outputs/mutation-report.json --out outputs/again.json
                                                           # only the survivors of an earlier run
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "statemachine"
EQUIVALENT = ROOT / "property_tests" / "EQUIVALENT_MUTANTS.md"
TESTS = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "core").glob("test_*.py")),
    "property_tests/test_scheduler_machine.py",
    "property_tests/test_affinity_machine.py",
    "property_tests/test_peer_machine.py",
    "property_tests/test_liveness.py",
    "property_tests/test_class_machine.py",
    "property_tests/test_scope_machine.py",
    "property_tests/test_swap_machine.py",
]
COPIED = ("statemachine", "tests", "property_tests", "spec", "pyproject.toml")
# The seed of ``--seed commit`` outside a git checkout (an unpacked sdist, say).
FALLBACK_SEED = 20261202

_FLIP: dict[type, type] = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@attrs.frozen
class Mutant:
    path: str  # relative to the repository root
    line: int
    kind: str
    index: int  # the how-many-th mutation point of this kind in the file (walk order)
    what: str  # the edit and the code it edits: with path and function, a name that survives line shifts
    function: str = "<module>"  # the qualified name of the def (or class) that holds the point

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}:{self.kind}#{self.index}"

    @property
    def name(self) -> tuple[str, str, str]:
        """How EQUIVALENT_MUTANTS.md names it: (file, function, what)."""
        return (self.path, self.function, self.what)


@attrs.frozen
class _Point:
    kind: str
    node: ast.AST
    what: str
    op: int = 0  # which operator of a chained comparison

    @property
    def position(self) -> tuple[int, int, int]:
        return (getattr(self.node, "lineno", 0), getattr(self.node, "col_offset", 0), self.op)


def _snippet(node: ast.AST, width: int = 72) -> str:
    """The first line of ``node``'s source, whitespace collapsed, cut at ``width``; no backticks (the list
    quotes it between backticks)."""
    text = " ".join(ast.unparse(node).splitlines()[0].split()).replace("`", "'")
    return text if len(text) <= width else text[: width - 3] + "..."


def _context(node: ast.AST, parents: dict[int, ast.AST]) -> ast.AST:
    """The code a constant belongs to: the nearest enclosing expression that says more than the number (a
    call, a comparison, an operation), or its statement."""
    current = node
    while True:
        parent = parents.get(id(current))
        if parent is None:
            return current
        if isinstance(parent, ast.stmt):
            return parent
        if isinstance(parent, ast.expr) and not isinstance(parent, ast.UnaryOp | ast.Constant):
            return parent
        current = parent


def _block(stmt: ast.AST, parents: dict[int, ast.AST]) -> str:
    """Where a short statement sits, so that two ``return False`` of one function read apart:
    ``in if w.peer_free(peer)``, ``in else of if ...``, ``in for name in names``, ``in def f``."""
    parent = parents.get(id(stmt))
    if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef):
        head = f"def {parent.name}"
    elif isinstance(parent, ast.If | ast.While):
        head = f"{'if' if isinstance(parent, ast.If) else 'while'} {_snippet(parent.test, 48)}"
        if any(s is stmt for s in parent.orelse):
            head = f"else of {head}"
    elif isinstance(parent, ast.ClassDef):
        head = f"class {parent.name}"
    elif isinstance(parent, ast.For):
        head = f"for {_snippet(parent.target, 20)} in {_snippet(parent.iter, 36)}"
    else:
        head = type(parent).__name__.lower()
    return f" (in {head})"


def _points(tree: ast.AST) -> Iterator[_Point]:
    """Every mutation point, in a stable walk order."""
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    edit = f"{type(op).__name__} -> {_FLIP[type(op)].__name__}"
                    yield _Point("compare", node, f"{edit}: {_snippet(node)}", i)
        elif isinstance(node, ast.BoolOp):
            edit = "and -> or" if isinstance(node.op, ast.And) else "or -> and"
            yield _Point("boolop", node, f"{edit}: {_snippet(node)}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            context = _context(node, parents)
            where = _statement(context, parents) if isinstance(context, ast.stmt) else _snippet(context)
            yield _Point("int+1", node, f"{node.value} -> {node.value + 1}: {where}")
            yield _Point("int-1", node, f"{node.value} -> {node.value - 1}: {where}")
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
        ):
            edit = f"{node.func.id} -> {'max' if node.func.id == 'min' else 'min'}"
            yield _Point("minmax", node, f"{edit}: {_snippet(node)}")
        elif isinstance(node, ast.Return) and node.value is not None:
            yield _Point("return", node, f"return value dropped: {_statement(node, parents)}")
        if isinstance(node, ast.FunctionDef | ast.If | ast.For | ast.While | ast.With | ast.Try):
            for stmt in node.body:
                if _deletable(stmt):
                    yield _Point("delete", stmt, f"statement deleted: {_statement(stmt, parents)}")


def _statement(stmt: ast.stmt, parents: dict[int, ast.AST]) -> str:
    """A statement's first line; a short one (``return``, ``head += 1``) says which block holds it."""
    text = _snippet(stmt)
    return text + _block(stmt, parents) if len(text) <= 24 else text


def _deletable(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return False  # a docstring
    return isinstance(
        stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.If | ast.For | ast.Return
    )


def _functions(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the qualified name of the innermost def or class around it ('<module>' at the top)."""
    owner: dict[int, str] = {id(tree): "<module>"}

    def visit(node: ast.AST, name: str) -> None:
        for child in ast.iter_child_nodes(node):
            owner[id(child)] = name
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, child.name if name == "<module>" else f"{name}.{child.name}")
            else:
                visit(child, name)

    visit(tree, "<module>")
    return owner


def _ordinal(n: int) -> str:
    return {2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def enumerate_mutants(files: list[Path]) -> list[Mutant]:
    out = []
    for path in files:
        tree = ast.parse(path.read_text())
        owner = _functions(tree)
        points = list(_points(tree))
        # The same edit of the same code twice in one function: the later ones (in reading order) say which.
        groups: dict[tuple[str, str], list[int]] = {}
        for n, point in enumerate(points):
            groups.setdefault((owner[id(point.node)], point.what), []).append(n)
        nth: dict[int, int] = {}
        for members in groups.values():
            members.sort(key=lambda n: points[n].position)
            nth.update({n: i for i, n in enumerate(members, 1)})
        counts: dict[str, int] = {}
        for n, point in enumerate(points):
            index = counts.get(point.kind, 0)
            counts[point.kind] = index + 1
            what = point.what if nth[n] == 1 else f"{point.what} ({_ordinal(nth[n])})"
            line = getattr(point.node, "lineno", 0)
            out.append(
                Mutant(str(path.relative_to(ROOT)), line, point.kind, index, what, owner[id(point.node)])
            )
    return out


def mutate_source(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    seen = 0
    for point in _points(tree):
        if point.kind != mutant.kind:
            continue
        if seen == mutant.index:
            _apply(tree, point)
            return ast.unparse(ast.fix_missing_locations(tree))
        seen += 1
    raise ValueError(f"no mutation point {mutant.key}")


def _apply(tree: ast.AST, point: _Point) -> None:
    kind, node = point.kind, point.node
    if kind == "compare":
        assert isinstance(node, ast.Compare)
        node.ops[point.op] = _FLIP[type(node.ops[point.op])]()
    elif kind == "boolop":
        assert isinstance(node, ast.BoolOp)
        node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    elif kind in ("int+1", "int-1"):
        assert isinstance(node, ast.Constant)
        node.value = node.value + (1 if kind == "int+1" else -1)
    elif kind == "minmax":
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        node.func.id = "max" if node.func.id == "min" else "min"
    elif kind == "return":
        assert isinstance(node, ast.Return)
        node.value = None
    elif kind == "delete":
        for parent in ast.walk(tree):
            for field in ("body", "orelse", "finalbody"):
                body = getattr(parent, field, None)
                if isinstance(body, list) and any(stmt is node for stmt in body):
                    body[[id(s) for s in body].index(id(node))] = ast.Pass()
                    return


# --------------------------------------------------------------------------------- the equivalent list
_CELL = re.compile(r"(?<!\\)\|")
_QUOTED = re.compile(r"`([^`]+)`")


def load_equivalent(path: Path = EQUIVALENT) -> dict[tuple[str, str, str], str]:
    """(file, function, what) -> reason, for every edit of every row of the list's table.

    A row is ``| `file` | `function` | `what`, `what`, ... | reason |``: one or more edits of one function
    that share a reason; a ``|`` inside an edit is written ``\\|``."""
    listed: dict[tuple[str, str, str], str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.startswith("| `"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in _CELL.split(line.strip())[1:-1]]
        if len(cells) != 4:
            raise ValueError(f"{path.name}:{number}: a row has 4 cells (file, function, edits, reason)")
        file, function = (c.strip("`") for c in cells[:2])
        edits = _QUOTED.findall(cells[2])
        if not edits or not cells[3]:
            raise ValueError(f"{path.name}:{number}: a row names at least one edit and gives its reason")
        for what in edits:
            if (file, function, what) in listed:
                raise ValueError(f"{path.name}:{number}: {file} {function} `{what}` is listed twice")
            listed[(file, function, what)] = cells[3]
    return listed


def commit_seed() -> int:
    """The sample's seed at this commit: the first 8 hex digits of ``git rev-parse HEAD``, or
    ``FALLBACK_SEED`` outside a git checkout."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return FALLBACK_SEED
    head = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"[0-9a-f]{40,64}", head):
        return FALLBACK_SEED
    return int(head[:8], 16)


def sample(mutants: list[Mutant], limit: int, seed: int) -> list[Mutant]:
    if not limit or limit >= len(mutants):
        return mutants
    return sorted(random.Random(seed).sample(mutants, limit), key=lambda m: m.key)


# ------------------------------------------------------------------------------------------ running
def _workspace(base: Path) -> Path:
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, base / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(src, base / name)
    return base


def run_tests(where: Path, timeout: float) -> tuple[str, float]:
    """'killed', 'survived' or 'timeout', and the seconds it took."""
    env = {
        **os.environ,
        "HYPOTHESIS_PROFILE": "mutation",
        "PYTHONDONTWRITEBYTECODE": "1",
        # Derandomized searches still iterate sets in hash order: a fixed hash seed makes every verdict the
        # same on every machine (scripts/test runs the property tier with the same seed).
        "PYTHONHASHSEED": "0",
    }
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=where, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started
    return ("survived" if done.returncode == 0 else "killed"), time.monotonic() - started


def _name(result: dict[str, object]) -> tuple[str, str, str]:
    return (str(result["path"]), str(result["function"]), str(result["what"]))


def _seed(text: str) -> int:
    return commit_seed() if text == "commit" else int(text)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--limit", type=int, default=0, help="run a seeded sample of this many mutants")
    parser.add_argument(
        "--seed", default="1", help="the sample's seed: an integer, or 'commit' (from git rev-parse HEAD)"
    )
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per mutant (0: 4 x baseline)")
    parser.add_argument("--file", action="append", default=[], help="only these statemachine modules")
    parser.add_argument("--key", action="append", default=[], help="only this mutant (file:line:kind#index)")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "mutation-report.json")
    parser.add_argument(
        "--survivors", type=Path, help="run only the mutants a previous report lists as survivors"
    )
    listed_only = parser.add_mutually_exclusive_group()
    listed_only.add_argument(
        "--skip-listed",
        action="store_true",
        help="leave out the mutants EQUIVALENT_MUTANTS.md lists (they cannot fail a run); sample the rest",
    )
    listed_only.add_argument(
        "--only-listed", action="store_true", help="run only the listed ones (do they still survive?)"
    )
    args = parser.parse_args()
    seed = _seed(args.seed)

    equivalent = load_equivalent()
    everything = enumerate_mutants(sorted(PACKAGE.glob("*.py")))
    stale = sorted(set(equivalent) - {m.name for m in everything})
    for file, function, what in stale:
        print(f"EQUIVALENT_MUTANTS.md names no mutant of this code: {file} {function} `{what}`")
    files = sorted(PACKAGE.glob("*.py"))
    if args.file:
        files = [f for f in files if f.name in args.file or f.stem in args.file]
    mutants = enumerate_mutants(files)
    total = len(mutants)
    skipped = 0
    if args.skip_listed:
        skipped = sum(1 for m in mutants if m.name in equivalent)
        mutants = [m for m in mutants if m.name not in equivalent]
    if args.only_listed:
        mutants = [m for m in mutants if m.name in equivalent]
    if args.survivors is not None:
        keys = {str(r["key"]) for r in json.loads(args.survivors.read_text())["survived"]}
        mutants = [m for m in mutants if m.key in keys]
    if args.key:
        unknown = set(args.key) - {m.key for m in mutants}
        if unknown:
            print(f"no such mutant at this version of the code: {', '.join(sorted(unknown))}")
            return 2
        mutants = [m for m in mutants if m.key in args.key]
    mutants = sample(mutants, args.limit, seed)
    print(
        f"{total} mutants in {len(files)} modules; running {len(mutants)} with {args.jobs} jobs "
        f"(seed {seed})",
        flush=True,
    )

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        pristine = _workspace(Path(tmp) / "pristine")
        verdict, seconds = run_tests(pristine, args.timeout * 3 or 900.0)
        if verdict != "survived":
            print(f"the unmutated scheduler does not pass the pure tiers ({verdict}); fix that first")
            return 2
        timeout = args.timeout or max(60.0, 4 * seconds)  # a mutant that loops forever counts as caught
        print(f"baseline green in {seconds:.0f} s; {timeout:.0f} s per mutant at most", flush=True)
        slots = [_workspace(Path(tmp) / f"job{i}") for i in range(args.jobs)]
        free = list(slots)
        results: list[dict[str, object]] = []

        def one(mutant: Mutant) -> dict[str, object]:
            where = free.pop()
            target = where / mutant.path
            original = (ROOT / mutant.path).read_text()
            try:
                target.write_text(mutate_source(original, mutant))
                verdict, seconds = run_tests(where, timeout)
            finally:
                target.write_text(original)
                free.append(where)
            return {
                **attrs.asdict(mutant),
                "key": mutant.key,
                "verdict": verdict,
                "seconds": round(seconds, 1),
                "equivalent": equivalent.get(mutant.name) if verdict == "survived" else None,
            }

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(one, m) for m in mutants]
            for n, future in enumerate(as_completed(futures), 1):
                result = future.result()
                results.append(result)
                label = "listed" if result["equivalent"] else result["verdict"]
                print(f"[{n}/{len(mutants)}] {label:8} {result['key']} {result['what']}", flush=True)

    results.sort(key=lambda r: str(r["key"]))
    killed = sum(1 for r in results if r["verdict"] != "survived")  # a timeout counts as caught
    survived = [r for r in results if r["verdict"] == "survived"]
    listed = [r for r in survived if r["equivalent"]]
    unlisted = [r for r in survived if not r["equivalent"]]
    killed_listed = [r for r in results if r["verdict"] != "survived" and _name(r) in equivalent]
    score = killed / len(results) if results else 1.0
    others = len(results) - len(listed)
    report = {
        "total_mutants": total,
        "run": len(results),
        "killed": killed,
        "survived": survived,
        "score": round(score, 4),
        "results": results,
        "seed": seed,
        "limit": args.limit,
        "listed_equivalent": len(listed),
        "unlisted": unlisted,
        "score_non_equivalent": round(killed / others, 4) if others else 1.0,
        "skipped_listed": skipped,
        "killed_listed": killed_listed,
        "stale_rows": [list(name) for name in stale],
        "seconds": round(time.monotonic() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(
        f"score {score:.1%}: {killed} of {len(results)} killed, {len(listed)} survived as listed equivalent, "
        f"{len(unlisted)} survived unlisted, {skipped} listed not run ({total} mutants in all; seed {seed}); "
        f"report in {args.out}"
    )
    for r in killed_listed:
        print(f"  listed as equivalent but {r['verdict']}: {r['path']} {r['function']} `{r['what']}`")
    for r in unlisted:
        print(f"  survived, not listed: {r['path']} {r['function']} `{r['what']}`   ({r['key']})")
        print(f"    again: python3 scripts/mutate_statemachine.py --key {r['key']}")
    if unlisted:
        print(
            "kill each with a test, or list it in property_tests/EQUIVALENT_MUTANTS.md with the reason "
            "no test can tell it from the scheduler"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
