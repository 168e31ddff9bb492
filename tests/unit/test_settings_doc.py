"""docs/settings.md is what the settings model writes: one source for every setting's docs."""

from __future__ import annotations

import re
from pathlib import Path

from ragservice.config import FLAT_NAMES, GROUPS
from ragservice.config.docs import render

ROOT = Path(__file__).resolve().parents[2]


def test_docs_settings_md_is_current() -> None:
    written = (ROOT / "docs" / "settings.md").read_text()
    assert written == render(), "run `python -m ragservice.config.docs` and commit docs/settings.md"


def test_every_setting_has_a_row_under_its_group() -> None:
    text = render()
    for name in FLAT_NAMES:
        assert text.count(f"| `RAGSERVICE_{name.upper()}` |") == 1, name
    assert [line[3:] for line in text.splitlines() if line.startswith("## ")] == list(GROUPS)


def test_every_setting_says_what_it_does() -> None:
    undescribed = [
        (group_name, name)
        for group_name, group in GROUPS.items()
        for name, field in group.model_fields.items()
        if not field.description
    ]
    assert undescribed == []


def test_the_readme_points_to_the_generated_list() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/settings.md" in readme
    assert "| `RAGSERVICE_" not in readme, "the README keeps no second list of settings"


# Variables named RAGSERVICE_ that are not settings of the service: the client's and the MCP
# server's (client/, mcp_server/), `sources add --username`'s password, the test suite's, and
# the patterns docs write for a family.
NOT_SETTINGS = {
    "RAGSERVICE_API_KEY",
    "RAGSERVICE_SOURCE_PASSWORD",
    "RAGSERVICE_URL",
    "RAGSERVICE_MCP_IDLE_TIMEOUT",
    "RAGSERVICE_MCP_KEY_CACHE_SECONDS",
    "RAGSERVICE_TEST_DATABASE_URL",
    "RAGSERVICE_BROWSER",
    "RAGSERVICE_REQUIRE_BROWSER",
    "RAGSERVICE_SCREENSHOTS_DIR",
    "RAGSERVICE_MAX",  # RAGSERVICE_MAX_*
}


def test_every_variable_the_docs_name_is_a_setting() -> None:
    settings = {f"RAGSERVICE_{name.upper()}" for name in FLAT_NAMES}
    texts = [ROOT / "README.md", ROOT / ".env.example", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        (path.name, found)
        for path in texts
        for found in re.findall(r"RAGSERVICE_[A-Z0-9_]*[A-Z0-9]", path.read_text())
    }
    assert {(name, found) for name, found in named if found not in settings | NOT_SETTINGS} == set()
