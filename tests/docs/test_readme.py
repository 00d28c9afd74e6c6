"""README stays true: its configuration reference is the one generated from the schema."""

from pathlib import Path

from router.config.reference import embed_in

ROOT = Path(__file__).resolve().parents[2]


def test_readme_carries_the_generated_config_reference() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert embed_in(text) == text, "run: python -m router.config.reference README.md"


def test_readme_names_its_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "scripts/demo" in text and "scripts/test" in text
    assert (ROOT / "scripts" / "demo").exists() and (ROOT / "scripts" / "test").exists()
