"""`ragservice ingest FOLDER` with files no loader reads: a spreadsheet of another format and a
real message with a GIF attached. Both are skipped, counted and listed (text and `--json`),
nothing fails, the exit status is 0, and the run's job counts them too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ragservice.cli import app

pytestmark = pytest.mark.default_tenancy  # the commands say whose rows they work on

MAIL = Path(__file__).parents[1] / "realdocs" / "mail" / "cpython-msg07-dingus-fish.eml"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "inbox"
    root.mkdir()
    shutil.copy(MAIL, root / "fish.eml")
    (root / "budget.ods").write_bytes(b"PK\x03\x04 an OpenDocument spreadsheet")
    (root / "notes.txt").write_text("Pumps move water with an impeller.")
    (root / ".readers").write_text("group:team\n")  # a sidecar: neither read nor reported
    return root


def run(cli: CliRunner, *args: str) -> Any:
    result = cli.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def test_files_no_loader_reads_are_skipped_and_listed(cli: CliRunner, folder: Path) -> None:
    ods, gif = str(folder / "budget.ods"), str(folder / "fish.eml" / "dingusfish.gif")
    text = run(cli, "ingest", str(folder), "-c", "inbox")
    assert "│ failed    │     0 │\n│ skipped   │     2 │" in text.stderr
    assert f"skipped {ods}: unsupported file type .ods" in text.stderr
    assert f"skipped {gif}: unsupported file type .gif" in text.stderr
    assert "failed /" not in text.stderr

    again = json.loads(run(cli, "ingest", str(folder), "-c", "inbox", "--json").stdout)
    assert again["ok"] is True
    assert again["failures"] == []
    assert again["skipped"] == [
        {"source": ods, "reason": "unsupported file type .ods"},
        {"source": gif, "reason": "unsupported file type .gif"},
    ]
    counts = again["counts"]
    assert (counts["unchanged"], counts["skipped"], counts["failed"]) == (2, 2, 0)

    job = json.loads(run(cli, "jobs", "show", again["job_id"], "--json").stdout)
    assert (job["status"], job["counts"]["skipped"], job["counts"]["failed"]) == ("done", 2, 0)


def test_a_message_is_found_by_its_subject_and_sender(cli: CliRunner, folder: Path) -> None:
    run(cli, "ingest", str(folder), "-c", "inbox")
    found = json.loads(run(cli, "search", "dingus fish from Barry", "-c", "inbox", "--json").stdout)
    top = found["results"][0]
    assert top["document"]["external_id"] == "fish.eml"
    assert top["text"].startswith("From: Barry <barry@digicool.com>\n")
