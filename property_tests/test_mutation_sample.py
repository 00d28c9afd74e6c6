"""The scheduler's tests keep their teeth: a seeded sample of statemachine/'s mutants, each of which must be
killed by the pure tiers or be listed, with its reason, in EQUIVALENT_MUTANTS.md.

``scripts/mutate_statemachine.py`` makes the mutants (one AST edit each) and runs the pure tiers on each in a
copy of the repository. The guard runs ``SAMPLE`` of them (40: one to three minutes on two cores), drawn
among the mutants the list does not name (a listed one cannot fail it), with the seed taken from the commit
(``git rev-parse HEAD``; a fixed seed outside a git checkout): every commit samples other points, and a
failure names the seed and the survivors with the commands that run them again. ``MUTATION_SAMPLE=N``
changes the size (0 skips it). The full run, every mutant, is for before a release (property_tests/README.md).

The fast checks beside it keep the list true as the code changes: every row must still name a mutant, and
no two mutants may share a name.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "mutate_statemachine.py"
SAMPLE = int(os.environ.get("MUTATION_SAMPLE", "40"))


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_statemachine", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_listed_mutant_still_exists() -> None:
    script = _script()
    names = {m.name for m in script.enumerate_mutants(sorted(script.PACKAGE.glob("*.py")))}
    stale = [
        f"{file} {function} `{what}`"
        for file, function, what in script.load_equivalent()
        if (file, function, what) not in names
    ]
    assert not stale, (
        "EQUIVALENT_MUTANTS.md names edits that no mutant of the current code makes (the code changed): "
        "judge the new code again and rewrite or drop these rows:\n  " + "\n  ".join(stale)
    )


def test_every_mutant_has_a_name_of_its_own() -> None:
    script = _script()
    mutants = script.enumerate_mutants(sorted(script.PACKAGE.glob("*.py")))
    seen: dict[tuple[str, str, str], str] = {}
    for mutant in mutants:
        assert mutant.name not in seen, f"{mutant.key} and {seen[mutant.name]} are both named {mutant.name}"
        seen[mutant.name] = mutant.key


def test_the_seed_comes_from_the_commit_or_a_fixed_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _script()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    if head.returncode == 0:
        assert script.commit_seed() == int(head.stdout.strip()[:8], 16)
    monkeypatch.setattr(script, "ROOT", tmp_path)  # not a git checkout
    assert script.commit_seed() == script.FALLBACK_SEED


@pytest.mark.skipif(SAMPLE <= 0, reason="MUTATION_SAMPLE=0")
def test_a_seeded_mutation_sample_is_killed_or_listed_as_equivalent(tmp_path: Path) -> None:
    script = _script()
    seed = script.commit_seed()
    out = tmp_path / "mutation-sample.json"
    command = [
        sys.executable,
        str(SCRIPT),
        "--limit",
        str(SAMPLE),
        "--seed",
        str(seed),
        "--skip-listed",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    print(done.stdout)
    assert out.exists(), (
        f"the mutation run failed before its report (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"
    )
    report = json.loads(out.read_text())
    again = f"python3 scripts/mutate_statemachine.py --limit {SAMPLE} --seed {seed} --skip-listed"
    survivors = [
        f"{r['path']} {r['function']} `{r['what']}`\n"
        f"    (this code: {r['key']}; alone: python3 scripts/mutate_statemachine.py --key {r['key']})"
        for r in report["unlisted"]
    ]
    assert not survivors, (
        f"mutation sample, seed {seed}: {len(survivors)} of {report['run']} mutants survived the pure tiers "
        "and are not listed in property_tests/EQUIVALENT_MUTANTS.md. Kill each with a test (a scenario in "
        "tests/core/ or a property), or, if no test can tell it from the scheduler, list it with the "
        "reason.\n" + "\n".join(survivors) + f"\nthe whole sample again: {again}"
    )
    assert done.returncode == 0, done.stdout + done.stderr
