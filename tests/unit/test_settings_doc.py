"""docs/settings.md is what the settings model writes: one source for every setting's docs."""

from __future__ import annotations

from pathlib import Path

from ragservice.config import GROUPS, Settings
from ragservice.config.docs import render

ROOT = Path(__file__).resolve().parents[2]


def test_docs_settings_md_is_current() -> None:
    written = (ROOT / "docs" / "settings.md").read_text()
    assert written == render(), "run `python -m ragservice.config.docs` and commit docs/settings.md"


def test_every_setting_has_a_row_under_its_group() -> None:
    text = render()
    for name in Settings.model_fields:
        assert text.count(f"| `RAGSERVICE_{name.upper()}` |") == 1, name
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(GROUPS)


def test_every_setting_says_what_it_does() -> None:
    assert [name for name, f in Settings.model_fields.items() if not f.description] == []


def test_the_readme_points_to_the_generated_list() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/settings.md" in readme
    assert "| `RAGSERVICE_" not in readme, "the README keeps no second list of settings"
