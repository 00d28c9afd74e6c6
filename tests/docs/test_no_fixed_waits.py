"""Tests wait for events, never for fixed time, and assert order, not wall-clock durations.

Every Python file under tests/ is read as a syntax tree (not searched as text) for:

- fixed waits: a call of ``time.sleep``, ``trio.sleep``, ``trio.sleep_until``, ``asyncio.sleep``,
  ``anyio.sleep`` (``trio.sleep(0)`` and the like, a checkpoint, is no wait), ``select.select`` with
  nothing to wait for, ``.wait(t)`` on an event made to be waited out (``threading.Event().wait(t)``), and
  a cancel scope with a deadline around nothing but ``sleep_forever()``;
- duration asserts: an ``assert`` comparing a duration, that is the difference of two readings of a clock
  (``time.monotonic()``, ``time.perf_counter()``, ``time.time()``, ``trio.current_time()``, a name that
  holds one, an ``…_at`` or ``at`` attribute or name, as the arrival times of ``tests.support.client``
  are) or a name or call that holds such a difference (``largest_gap``).

Allowed, and nowhere else:

- tests/support/simserver/: the simulated llama-server's emulated work (loading, generating) is its
  behaviour, not a test waiting;
- tests/support/waiting.py's ``until`` and ``until_blocking``: the one polling primitive, whose pause
  between two looks at a condition is the only fixed sleep a test may reach;
- ``trio.sleep`` in a test that takes the ``autojump_clock`` or ``mock_clock`` fixture (the owner tier):
  there it moves virtual time and costs nothing;
- the entries of ``ALLOWED`` below, each with its reason.

A test that must show that something does not happen waits for a later event that would have come after
it; where none exists, the router lacks an event, and the entry in ``ALLOWED`` says which.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

SLEEPS = frozenset(
    {"time.sleep", "trio.sleep", "trio.sleep_until", "asyncio.sleep", "anyio.sleep", "anyio.sleep_until"}
)
CHECKPOINTS = frozenset({"trio.sleep", "asyncio.sleep", "anyio.sleep"})  # with 0: yield, do not wait
VIRTUAL = frozenset({"trio.sleep", "trio.sleep_until"})  # on a mock clock
MOCK_CLOCKS = frozenset({"autojump_clock", "mock_clock"})
CLOCKS = frozenset(
    {
        "time.monotonic",
        "time.monotonic_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "time.time",
        "time.time_ns",
        "trio.current_time",
    }
)
DURATION_CALLS = frozenset({"largest_gap"})
EVENTS = frozenset({"threading.Event", "multiprocessing.Event", "Event"})
SCOPES = frozenset({"trio.move_on_after", "trio.move_on_at", "trio.fail_after", "trio.fail_at"})

# Paths (relative to the repository, a folder ending in "/") where fixed waits belong to what is run.
EXEMPT_PATHS: dict[str, str] = {
    "tests/support/simserver/": "the simulated llama-server's emulated work (load_delay, token_rate, ...)",
}
# (path, function) -> why a fixed wait is there. Each entry must still match something.
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/support/waiting.py", "until"): "the one polling primitive: the pause between two looks",
    ("tests/support/waiting.py", "until_blocking"): "the one polling primitive, outside Trio",
}


@attrs.frozen
class Finding:
    path: str
    line: int
    function: str
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function}): {self.what}"


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the qualified name it stands for (``import time as t``, ``from trio import sleep``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                names[alias.asname or root] = alias.name if alias.asname else root
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.imports = _imports(tree)
        self.findings: list[Finding] = []
        self.stack: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        self.clock_names, self.duration_names, self.event_names = self._names(tree)

    # -------------------------------------------------------------------------------------- naming
    def qualified(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.imports.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            root = self.qualified(node.value)
            return None if root is None else f"{root}.{node.attr}"
        return None

    def _called(self, node: ast.AST) -> str | None:
        return self.qualified(node.func) if isinstance(node, ast.Call) else None

    def _names(self, tree: ast.Module) -> tuple[set[str], set[str], set[str]]:
        """Names assigned a clock reading (or a collection of them), a duration, or a fresh event
        (anywhere in the module: names are few, and a clash costs at most a look at a line)."""
        clocks: set[str] = set()
        durations: set[str] = set()
        events: set[str] = set()
        nodes = list(ast.walk(tree))
        for _ in range(3):  # a name from a name from a clock
            for node in nodes:
                if self._appends_reading(node, clocks):  # xs.append(clock reading): xs holds readings
                    clocks.add(node.func.value.id)  # type: ignore[attr-defined]
                if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                # xs[key] = clock reading: xs holds readings
                holders = [
                    t.value.id
                    for t in targets
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                ]
                if self.timestamp(node.value, clocks):
                    clocks.update(names + holders)
                elif (
                    isinstance(node.value, ast.ListComp | ast.GeneratorExp | ast.Call)
                    and any(
                        self.timestamp(inner, clocks)
                        for inner in ast.walk(node.value)
                        if inner is not node.value
                    )
                    and self._called(node.value) not in CLOCKS
                    and not self.duration(node.value, clocks, durations)
                ):
                    clocks.update(names)  # readings gathered: sorted(r.first_token_at for r in replies)
                elif self.duration(node.value, clocks, durations):
                    durations.update(names)
                elif self._called(node.value) in EVENTS:
                    events.update(names)
        return clocks, durations, events

    def _appends_reading(self, node: ast.AST, clocks: set[str]) -> bool:
        return (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and isinstance(node.func.value, ast.Name)
            and len(node.args) == 1
            and self.timestamp(node.args[0], clocks)
        )

    def timestamp(self, node: ast.expr, clocks: set[str] | None = None) -> bool:
        clocks = self.clock_names if clocks is None else clocks
        if isinstance(node, ast.Call):
            return self._called(node) in CLOCKS
        if isinstance(node, ast.Name):
            return node.id in clocks or node.id == "at" or node.id.endswith("_at")
        if isinstance(node, ast.Attribute):
            return node.attr == "at" or node.attr.endswith("_at")
        if isinstance(node, ast.Subscript):
            key = node.slice
            named = isinstance(key, ast.Constant) and isinstance(key.value, str)
            if named and (key.value == "at" or key.value.endswith("_at")):  # type: ignore[attr-defined]
                return True
            return isinstance(node.value, ast.Name) and node.value.id in clocks
        return False

    def duration(self, node: ast.expr, clocks: set[str] | None = None, names: set[str] | None = None) -> bool:
        names = self.duration_names if names is None else names
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub):
            return self.timestamp(node.left, clocks) and self.timestamp(node.right, clocks)
        if isinstance(node, ast.Name):
            return node.id in names
        if isinstance(node, ast.Call):
            called = self._called(node)
            return called is not None and called.rsplit(".", 1)[-1] in DURATION_CALLS
        return False

    # -------------------------------------------------------------------------------------- walking
    def _where(self) -> str:
        return ".".join(f.name for f in self.stack) or "<module>"

    def _on_mock_clock(self) -> bool:
        return any(arg.arg in MOCK_CLOCKS for f in self.stack for arg in f.args.args + f.args.kwonlyargs)

    def _report(self, node: ast.AST, what: str) -> None:
        self.findings.append(Finding(self.path, node.lineno, self._where(), what))  # type: ignore[attr-defined]

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        called = self._called(node)
        if called in SLEEPS:
            zero = (
                called in CHECKPOINTS
                and len(node.args) == 1
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == 0
            )
            if not zero and not (called in VIRTUAL and self._on_mock_clock()):
                self._report(node, f"fixed wait: {called}()")
        elif called == "select.select" and len(node.args) == 4:
            if all(isinstance(a, ast.List | ast.Tuple) and not a.elts for a in node.args[:3]):
                self._report(node, "fixed wait: select.select() on nothing")
        elif (
            isinstance(node.func, ast.Attribute) and node.func.attr == "wait" and (node.args or node.keywords)
        ):
            receiver = node.func.value
            fresh = self._called(receiver) in EVENTS
            named = isinstance(receiver, ast.Name) and receiver.id in self.event_names
            if fresh or named:
                self._report(node, "fixed wait: Event.wait(timeout) on an event nothing sets")
        self.generic_visit(node)

    def _with(self, node: ast.With | ast.AsyncWith) -> None:
        scoped = any(self._called(item.context_expr) in SCOPES for item in node.items)
        if scoped and len(node.body) == 1 and isinstance(node.body[0], ast.Expr):
            inner = node.body[0].value
            if isinstance(inner, ast.Await) and self._called(inner.value) == "trio.sleep_forever":
                self._report(node, "fixed wait: a deadline around sleep_forever()")
        self.generic_visit(node)

    visit_With = _with  # type: ignore[assignment]
    visit_AsyncWith = _with  # type: ignore[assignment]

    def visit_Assert(self, node: ast.Assert) -> None:
        for compare in (n for n in ast.walk(node.test) if isinstance(n, ast.Compare)):
            operands = [compare.left, *compare.comparators]
            if any(self.duration(operand) for operand in operands):
                self._report(node, f"duration assert: {ast.unparse(compare)}")
                break
        self.generic_visit(node)


def check_source(source: str, path: str) -> list[Finding]:
    """The fixed waits and duration asserts in ``source`` (the file at ``path``, relative to the root)."""
    tree = ast.parse(source, filename=path)
    checker = _Checker(path, tree)
    checker.visit(tree)
    return checker.findings


def python_files() -> Iterator[Path]:
    return iter(sorted(TESTS.rglob("*.py")))


def findings() -> tuple[list[Finding], set[tuple[str, str]]]:
    """What breaks the rule, and which ``ALLOWED`` entries were used."""
    found: list[Finding] = []
    used: set[tuple[str, str]] = set()
    for file in python_files():
        path = file.relative_to(ROOT).as_posix()
        if any(path.startswith(prefix) for prefix in EXEMPT_PATHS):
            continue
        for finding in check_source(file.read_text(), path):
            key = (path, finding.function.split(".")[0])
            if key in ALLOWED or (path, finding.function) in ALLOWED:
                used.add(key if key in ALLOWED else (path, finding.function))
            else:
                found.append(finding)
    return found, used


def test_no_test_waits_for_fixed_time_or_asserts_a_duration() -> None:
    found, used = findings()
    assert not found, (
        "wait for an event or a condition (tests/support/waiting.py), assert order:\n"
        + "\n".join(map(str, found))
    )
    stale = set(ALLOWED) - used
    assert not stale, f"allowed fixed waits that are gone (drop them from ALLOWED): {sorted(stale)}"


def test_the_exempt_paths_exist() -> None:
    for prefix in EXEMPT_PATHS:
        assert (ROOT / prefix).is_dir(), prefix


# ------------------------------------------------------------------------------------------------------
# The checker itself


def kinds(source: str) -> list[str]:
    return [f.what.split(":")[0] for f in check_source(source, "tests/x.py")]


def test_the_checker_finds_each_kind_of_fixed_wait() -> None:
    source = """
import time, select, threading
import trio as t
from time import sleep as nap
async def f():
    time.sleep(0.1)
    nap(1)
    await t.sleep(0.2)
    await t.sleep_until(5)
    threading.Event().wait(0.5)
    stop = threading.Event()
    stop.wait(timeout=1)
    select.select([], [], [], 0.3)
    with t.move_on_after(1):
        await t.sleep_forever()
"""
    assert kinds(source) == ["fixed wait"] * 8


def test_the_checker_lets_checkpoints_deadlines_and_mock_clocks_be() -> None:
    source = """
import trio, subprocess
async def f(proc, event):
    await trio.sleep(0)
    with trio.fail_after(5):
        await event.wait()
    proc.wait(timeout=5)
async def test_virtual(autojump_clock):
    await trio.sleep(600)
    async def inner():
        await trio.sleep(1)
"""
    assert kinds(source) == []
    assert kinds("import time\ndef test_real(autojump_clock):\n    time.sleep(1)\n") == ["fixed wait"]


def test_the_checker_finds_duration_asserts_but_not_order() -> None:
    source = """
import time, trio
def f(reply, other, h):
    started = trio.current_time()
    elapsed = trio.current_time() - started
    assert elapsed < 5.0
    assert time.monotonic() - started >= 0.5
    assert reply.last_token_at - other.first_token_at > 1.0
    assert largest_gap(reply.token_times) < 0.5
    assert h.at - started < 2 and True
    arrivals = []
    arrivals.append(time.monotonic())
    assert arrivals[-1] - arrivals[0] >= 0.15
    finished = {}
    finished["a"] = time.monotonic()
    assert finished["b"] - finished["a"] > 0
    starts = sorted(r.first_token_at for r in reply)
    assert starts[1] - starts[0] < 1
    assert reply.first_token_at < other.last_token_at
    assert started < h.at <= trio.current_time()
    assert sum(started < at for at in reply.token_times) > 10
"""
    assert kinds(source) == ["duration assert"] * 8
