"""Per-document readers from the command line, in process (the session's model shared): keys
acting for a user, groups, and readers set on ingest by `--readers`, a folder's `.readers`
sidecar and a JSONL row's `readers`, kept or changed on re-ingest without embedding again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

from ragservice.cli import app

pytestmark = pytest.mark.default_tenancy  # the commands say whose rows they work on


def run(cli: CliRunner, *args: str, code: int = 0) -> Any:
    result = cli.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def ingest(cli: CliRunner, *args: str, code: int = 0) -> dict[str, Any]:
    """`ragservice ingest ARGS --json`: its summary."""
    summary: dict[str, Any] = json.loads(run(cli, "ingest", *args, "--json", code=code).stdout)
    return summary


def rows(database_url: str, statement: str) -> list[tuple[Any, ...]]:
    """`statement` as the database's owner (row-level security does not apply)."""
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        return conn.execute(statement).fetchall()


def readers(database_url: str) -> dict[str, list[str] | None]:
    """Each document's readers by external id; fails unless its chunks have the same."""
    documents = dict(rows(database_url, "SELECT external_id, readers FROM documents"))
    chunks = rows(
        database_url,
        "SELECT d.external_id, c.readers FROM chunks c "
        "JOIN documents d ON d.id = c.document_id AND d.tenant_id = c.tenant_id",
    )
    assert chunks and all(documents[external_id] == list_ for external_id, list_ in chunks)
    return {
        external_id: None if list_ is None else list(list_)
        for external_id, list_ in documents.items()
    }


def test_a_key_acts_for_a_user_and_a_bad_user_name_is_refused(
    cli: CliRunner, database_url: str
) -> None:
    made = run(cli, "keys", "create", "--tenant", "acme", "--role", "reader", "--user", "ana")
    assert "acting for user 'ana'" in made.stderr
    secret = made.stdout.strip().splitlines()[-1]
    listed = json.loads(run(cli, "keys", "list", "--json").stdout)
    assert [key["user"] for key in listed] == ["ana"]
    assert rows(database_url, "SELECT prefix, user_name FROM api_keys") == [
        (secret[: len(listed[0]["prefix"])], "ana")
    ]

    refused = cli.invoke(
        app, ["keys", "create", "--tenant", "acme", "--role", "reader", "--user", "bad name"]
    )
    assert refused.exit_code == 2
    assert "--user" in refused.stderr and "'bad name'" in refused.stderr
    assert "letters, digits" in refused.stderr
    assert len(rows(database_url, "SELECT 1 FROM api_keys")) == 1  # nothing made


def test_groups_add_list_and_remove(cli: CliRunner) -> None:
    run(cli, "tenants", "create", "acme")
    added = run(cli, "groups", "add", "hr", "ana", "carl", "--tenant", "acme")
    assert "added 2 user(s) to group 'hr'" in added.stderr
    run(cli, "groups", "add", "it", "bob", "--tenant", "acme")
    assert run(cli, "groups", "add", "hr", "ana", "--tenant", "acme").stderr.startswith("added 0")
    assert run(cli, "groups", "list", "--tenant", "acme").stdout == "hr\tana,carl\nit\tbob\n"
    removed = run(cli, "groups", "remove", "hr", "carl", "--tenant", "acme")
    assert "removed 1 user(s)" in removed.stderr
    listed = json.loads(run(cli, "groups", "list", "--tenant", "acme", "--json").stdout)
    assert listed == {"hr": ["ana"], "it": ["bob"]}

    bad = cli.invoke(app, ["groups", "add", "hr", "bad name", "--tenant", "acme"])
    assert bad.exit_code == 2 and "'bad name'" in bad.stderr
    unknown = cli.invoke(app, ["groups", "list", "--tenant", "nobody"])
    assert unknown.exit_code == 1 and "no tenant named 'nobody'" in unknown.output


def handbook(root: Path) -> Path:
    """A folder: two files of its own, and `finance/` (and a folder below it) whose `.readers`
    names its readers."""
    (root / "finance" / "plans").mkdir(parents=True)
    (root / "leave.md").write_text("# Leave\n\nParents get sixteen weeks of paid parental leave.")
    (root / "travel.md").write_text("# Travel\n\nBook flights through the travel desk early.")
    (root / "finance" / ".readers").write_text("# finance only\nuser:ana,\ngroup:finance\n")
    (root / "finance" / "budget.md").write_text("# Budget\n\nThe budget for next year grows.")
    (root / "finance" / "plans" / "cuts.md").write_text("# Cuts\n\nNo cuts are planned.")
    return root


SIDECAR_READERS = ["group:finance", "user:ana"]


def test_ingest_readers_from_the_option_and_a_sidecar_kept_and_changed_on_re_ingest(
    cli: CliRunner, database_url: str, tmp_path: Path
) -> None:
    folder = handbook(tmp_path / "handbook")
    first = ingest(cli, str(folder), "-c", "docs", "--readers", "group:hr")
    assert first["ok"] and first["counts"]["new"] == 4
    assert first["counts"]["chunks_embedded"] == first["counts"]["chunks_written"] > 0
    assert readers(database_url) == {
        "leave.md": ["group:hr"],
        "travel.md": ["group:hr"],
        "finance/budget.md": SIDECAR_READERS,  # the sidecar wins over --readers
        "finance/plans/cuts.md": SIDECAR_READERS,  # the nearest sidecar above
    }

    kept = ingest(cli, str(folder), "-c", "docs")  # no --readers: each keeps its own
    assert kept["ok"] and kept["counts"]["unchanged"] == 4  # nothing written again
    assert readers(database_url)["leave.md"] == ["group:hr"]
    assert readers(database_url)["finance/budget.md"] == SIDECAR_READERS

    changed = ingest(cli, str(folder), "-c", "docs", "--readers", "group:legal,user:zoe")
    counts = changed["counts"]
    assert changed["ok"] and counts["updated"] == 2 and counts["unchanged"] == 2
    assert counts["chunks_embedded"] == 0 and counts["chunks_reused"] == counts["chunks_written"]
    assert counts["chunks_reused"] > 0
    assert readers(database_url) == {
        "leave.md": ["group:legal", "user:zoe"],
        "travel.md": ["group:legal", "user:zoe"],
        "finance/budget.md": SIDECAR_READERS,
        "finance/plans/cuts.md": SIDECAR_READERS,
    }

    opened = ingest(cli, str(folder / "leave.md"), "-c", "docs", "--readers", "")
    assert opened["counts"]["updated"] == 1 and opened["counts"]["chunks_embedded"] == 0
    assert readers(database_url)["leave.md"] is None  # '': the whole tenant

    refused = cli.invoke(app, ["ingest", str(folder), "-c", "docs", "--readers", "hr"])
    assert refused.exit_code == 2 and "--readers" in refused.stderr
    assert "user:<name> or group:<name>" in refused.stderr


def badly_locked(folder: Path) -> Path:
    """A folder with an open page and, in `locked/`, one whose sidecar names a bad reader."""
    (folder / "locked").mkdir(parents=True)
    (folder / "open.md").write_text("# Open\n\nEveryone may read this page.")
    (folder / "locked" / "a.md").write_text("# A\n\nA page for some.")
    (folder / "locked" / ".readers").write_text("group:hr, janitor\n")
    return folder


def test_a_bad_sidecar_fails_its_files_only_naming_it(
    cli: CliRunner, database_url: str, tmp_path: Path
) -> None:
    folder = badly_locked(tmp_path / "mixed")
    summary = ingest(cli, str(folder), "-c", "docs", "--readers", "group:staff", code=1)
    assert summary["counts"]["new"] == 1 and summary["counts"]["failed"] == 1
    [failure] = summary["failures"]
    assert failure["source"].endswith("locked/a.md")
    assert str(folder / "locked" / ".readers") in failure["error"]
    assert "'janitor'" in failure["error"]
    assert readers(database_url) == {"open.md": ["group:staff"]}


def test_a_jsonl_rows_readers(cli: CliRunner, database_url: str, tmp_path: Path) -> None:
    corpus = tmp_path / "rows.jsonl"
    lines = [
        {"_id": "a", "title": "A", "text": "Alpha text for ana.", "readers": ["user:ana"]},
        {
            "_id": "b",
            "title": "B",
            "text": "Beta text for two groups.",
            "readers": "group:it,group:hr",
        },
        {"_id": "c", "title": "C", "text": "Gamma text with no readers of its own."},
    ]
    corpus.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = ingest(cli, str(corpus), "-c", "rows", "--readers", "group:staff")
    assert summary["ok"] and summary["counts"]["new"] == 3
    assert readers(database_url) == {
        "a": ["user:ana"],  # the row's own readers win
        "b": ["group:hr", "group:it"],
        "c": ["group:staff"],
    }

    renamed = tmp_path / "renamed.jsonl"
    row = {"_id": "d", "text": "Delta text.", "acl": ["group:legal"], "readers": ["group:hr"]}
    renamed.write_text(json.dumps(row) + "\n")
    ingest(cli, str(renamed), "-c", "rows", "--jsonl-fields", "readers=acl")
    assert readers(database_url)["d"] == ["group:legal"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"_id": "e", "text": "Epsilon.", "readers": ["hr"]}) + "\n")
    failed = ingest(cli, str(bad), "-c", "rows", code=1)
    assert failed["counts"]["failed"] == 1 and "group:<name>" in failed["failures"][0]["error"]
    assert "e" not in readers(database_url)


def test_imported_vectors_get_their_readers(
    cli: CliRunner, database_url: str, tmp_path: Path
) -> None:
    """Chunks imported with their vectors (a JSONL row's `chunks`, a Parquet file) take the
    row's readers or `--readers`, like documents that are embedded."""
    from tests.integration.test_bulk_import import unit_vectors, vector_line, write_parquet

    vectors = unit_vectors(3)
    row = json.loads(vector_line("v", ["An imported chunk.", "Another one."], vectors[:2]))
    jsonl = tmp_path / "vectors.jsonl"
    jsonl.write_text(json.dumps({**row, "readers": ["group:hr"]}) + "\n")
    parquet = write_parquet(
        tmp_path / "chunks.parquet", {"id": ["p"], "text": ["A parquet chunk."]}, vectors[2:]
    )
    for path in (jsonl, parquet):
        summary = ingest(cli, str(path), "-c", "vectors", "--readers", "group:it")
        assert summary["ok"] and summary["counts"]["chunks_embedded"] == 0
    assert readers(database_url) == {"v": ["group:hr"], "p": ["group:it"]}


@pytest.mark.parametrize("command", ["sync", "sources"])
def test_folder_sources_give_each_file_its_sidecars_readers(
    cli: CliRunner, database_url: str, tmp_path: Path, command: str
) -> None:
    """`sync PATH` and `sources add PATH` read a folder as `ingest PATH` does: the nearest
    `.readers` wins over the source's own readers; changing a sidecar re-permissions its files
    (nothing is embedded again) and removing it gives them the source's readers back."""
    folder = handbook(tmp_path / "handbook")
    if command == "sync":
        base = None
        sync: tuple[str, ...] = ("sync", str(folder), "-c", "docs")
    else:
        base = ["group:staff"]
        run(cli, "sources", "add", str(folder), "-c", "docs", "--readers", "group:staff")
        [listed] = json.loads(run(cli, "sources", "list", "-c", "docs", "--json").stdout)
        sync = ("sources", "run", listed["id"], "-c", "docs")
    run(cli, *sync)
    assert readers(database_url) == {
        "leave.md": base,
        "travel.md": base,
        "finance/budget.md": SIDECAR_READERS,
        "finance/plans/cuts.md": SIDECAR_READERS,
    }
    embedded = rows(database_url, "SELECT count(*) FROM chunk_embeddings")[0][0]

    (folder / "finance" / "plans" / ".readers").write_text("group:board\n")
    run(cli, *sync)
    assert readers(database_url)["finance/plans/cuts.md"] == ["group:board"]
    assert readers(database_url)["finance/budget.md"] == SIDECAR_READERS
    assert rows(database_url, "SELECT count(*) FROM chunk_embeddings")[0][0] == embedded

    (folder / "finance" / "plans" / ".readers").unlink()
    (folder / "finance" / ".readers").unlink()
    run(cli, *sync)
    assert readers(database_url) == dict.fromkeys(
        ["leave.md", "travel.md", "finance/budget.md", "finance/plans/cuts.md"], base
    )


def test_a_bad_sidecar_fails_its_folder_sources_files_only(
    cli: CliRunner, database_url: str, tmp_path: Path
) -> None:
    folder = badly_locked(tmp_path / "mixed")
    failed = cli.invoke(app, ["sync", str(folder), "-c", "docs"])
    assert "'janitor'" in failed.output and "Traceback" not in failed.output
    assert readers(database_url) == {"open.md": None}  # the locked file is not stored open
