"""Mutation testing of the pure scheduler: how many single-point breaks of statemachine/ the pure tests catch.

Each mutant changes one point of one module (an AST edit): a comparison flipped, ``and``/``or`` swapped, an
int constant moved by one, ``min``/``max`` swapped, a statement replaced by ``pass``, a returned value
dropped. Every mutant runs the pure tiers (tests/core/test_*.py and the property machines under the
``mutation`` Hypothesis profile: derandomized, no shrinking, fewer examples) in its own copy of the
repository, several at a time. The report goes to outputs/mutation-report.json; surviving mutants are listed
with file, line and the edit, to be killed by a new test or recorded in property_tests/EQUIVALENT_MUTANTS.md.

    python3 scripts/mutate_statemachine.py                 # every mutant, one job per core
    python3 scripts/mutate_statemachine.py --limit 40      # a seeded sample of 40
    python3 scripts/mutate_statemachine.py --survivors outputs/mutation-report.json --out outputs/again.json
                                                           # only the survivors of an earlier run
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
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
TESTS = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "core").glob("test_*.py")),
    "property_tests/test_scheduler_machine.py",
    "property_tests/test_affinity_machine.py",
    "property_tests/test_liveness.py",
]
COPIED = ("statemachine", "tests", "property_tests", "spec", "pyproject.toml")

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
    what: str

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}:{self.kind}#{self.index}"


def _points(tree: ast.AST) -> Iterator[tuple[str, ast.AST, str]]:
    """(kind, node, description) for every mutation point, in a stable walk order."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) in _FLIP:
                    yield "compare", node, f"{type(op).__name__} -> {_FLIP[type(op)].__name__}"
        elif isinstance(node, ast.BoolOp):
            yield "boolop", node, "and <-> or"
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, int)
            and not isinstance(node.value, bool)
        ):
            yield "int+1", node, f"{node.value} -> {node.value + 1}"
            yield "int-1", node, f"{node.value} -> {node.value - 1}"
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
        ):
            yield "minmax", node, f"{node.func.id} -> {'max' if node.func.id == 'min' else 'min'}"
        elif isinstance(node, ast.Return) and node.value is not None:
            yield "return", node, "return value dropped"
        if isinstance(node, ast.FunctionDef | ast.If | ast.For | ast.While | ast.With | ast.Try):
            for stmt in node.body:
                if _deletable(stmt):
                    yield "delete", stmt, f"statement deleted: {ast.unparse(stmt).splitlines()[0][:60]}"


def _deletable(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return False  # a docstring
    return isinstance(
        stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.If | ast.For | ast.Return
    )


def enumerate_mutants(files: list[Path]) -> list[Mutant]:
    out = []
    for path in files:
        tree = ast.parse(path.read_text())
        counts: dict[str, int] = {}
        for kind, node, what in _points(tree):
            index = counts.get(kind, 0)
            counts[kind] = index + 1
            line = getattr(node, "lineno", 0)
            out.append(Mutant(str(path.relative_to(ROOT)), line, kind, index, what))
    return out


def mutate_source(source: str, mutant: Mutant) -> str:
    tree = ast.parse(source)
    seen = 0
    for kind, node, _ in _points(tree):
        if kind != mutant.kind:
            continue
        if seen == mutant.index:
            _apply(tree, kind, node)
            return ast.unparse(ast.fix_missing_locations(tree))
        seen += 1
    raise ValueError(f"no mutation point {mutant.key}")


def _apply(tree: ast.AST, kind: str, node: ast.AST) -> None:
    if kind == "compare":
        assert isinstance(node, ast.Compare)
        for i, op in enumerate(node.ops):
            if type(op) in _FLIP:
                node.ops[i] = _FLIP[type(op)]()
                return
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
    env = {**os.environ, "HYPOTHESIS_PROFILE": "mutation", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=where, env=env, capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return "timeout", time.monotonic() - started
    return ("survived" if done.returncode == 0 else "killed"), time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--limit", type=int, default=0, help="run a seeded sample of this many mutants")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=0.0, help="seconds per mutant (0: 4 x baseline)")
    parser.add_argument("--file", action="append", default=[], help="only these statemachine modules")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "mutation-report.json")
    parser.add_argument(
        "--survivors", type=Path, help="run only the mutants a previous report lists as survivors"
    )
    args = parser.parse_args()

    files = sorted(PACKAGE.glob("*.py"))
    if args.file:
        files = [f for f in files if f.name in args.file or f.stem in args.file]
    mutants = enumerate_mutants(files)
    total = len(mutants)
    if args.survivors is not None:
        keys = {str(r["key"]) for r in json.loads(args.survivors.read_text())["survived"]}
        mutants = [m for m in mutants if m.key in keys]
    if args.limit and args.limit < total:
        mutants = sorted(random.Random(args.seed).sample(mutants, args.limit), key=lambda m: m.key)
    print(
        f"{total} mutants in {len(files)} modules; running {len(mutants)} with {args.jobs} jobs", flush=True
    )

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
            }

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(one, m) for m in mutants]
            for n, future in enumerate(as_completed(futures), 1):
                result = future.result()
                results.append(result)
                print(
                    f"[{n}/{len(mutants)}] {result['verdict']:8} {result['key']} {result['what']}", flush=True
                )

    results.sort(key=lambda r: str(r["key"]))
    killed = sum(1 for r in results if r["verdict"] != "survived")  # a timeout counts as caught
    score = killed / len(results) if results else 1.0
    report = {
        "total_mutants": total,
        "run": len(results),
        "killed": killed,
        "survived": [r for r in results if r["verdict"] == "survived"],
        "score": round(score, 4),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(
        f"score {score:.1%}: {killed} of {len(results)} killed ({total} mutants in all); report in {args.out}"
    )
    for r in report["survived"]:  # type: ignore[union-attr]
        print(f"  survived {r['key']} {r['what']}")  # type: ignore[index]
    return 0


if __name__ == "__main__":
    sys.exit(main())
