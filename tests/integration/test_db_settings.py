"""The embedded server sized for its machine, `ragservice db settings` and `db optimize`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url
from typer.testing import CliRunner

from ragservice.cli import app
from ragservice.config import get_settings
from ragservice.db import sizing
from ragservice.db.embedded import (
    acquire_embedded_server,
    pgdata_dir,
    postgres_bin_dir,
    release_embedded_server,
)
from ragservice.db.server_settings import SIZED_FILE


def show(url: str, *names: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:
        return {name: str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[CliRunner]:
    monkeypatch.setenv("RAGSERVICE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "200")
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_the_embedded_server_starts_with_its_sized_settings_every_time(
    tmp_path: Path, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = tmp_path / "data"
    pgdata = pgdata_dir(data_dir)
    names = ("shared_buffers", "max_wal_size", "checkpoint_timeout", "work_mem")
    monkeypatch.setenv("RAGSERVICE_EMBEDDED_PG_SETTINGS", "work_mem=7MB")
    get_settings.cache_clear()
    try:
        server = acquire_embedded_server(data_dir)  # created: initdb, sized, started
        sized = sizing.recommend(sizing.probe_machine(pgdata, postgres_bin_dir()))
        running = show(server.get_uri(), *names)
        assert running["shared_buffers"] == sized["shared_buffers"]
        assert (running["checkpoint_timeout"], running["work_mem"]) == ("15min", "7MB")
        assert running["max_wal_size"] == sized["max_wal_size"]
        assert f"include_if_exists = '{SIZED_FILE}'" in (pgdata / "postgresql.conf").read_text()

        listed = cli.invoke(app, ["db", "settings", "--json"])
        assert listed.exit_code == 0, listed.output
        report = json.loads(listed.stdout)
        rows = {row["name"]: row for row in report["settings"]}
        assert report["embedded"] and list(rows) == list(sizing.TUNABLES)
        assert rows["shared_buffers"]["source"] == "sized"
        assert rows["shared_buffers"]["running"] == rows["shared_buffers"]["recommended"]
        assert (rows["work_mem"]["source"], rows["work_mem"]["running"]) == ("override", "7MB")
        table = cli.invoke(app, ["db", "settings"])
        assert table.exit_code == 0 and "7MB (override)" in table.stdout
        release_embedded_server(data_dir)  # the last holder: it stops

        # The next start sizes again, with the overrides of its own settings.
        again = acquire_embedded_server(data_dir, {"shared_buffers": "64MB"})
        assert show(again.get_uri(), "shared_buffers", "work_mem") == {
            "shared_buffers": "64MB",
            "work_mem": sized["work_mem"],
        }
    finally:
        release_embedded_server(data_dir)


def test_db_settings_of_an_external_server_reads_and_changes_nothing(
    database_url: str, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", database_url)
    get_settings.cache_clear()
    libpq = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    before = show(libpq, *sizing.TUNABLES)
    result = cli.invoke(app, ["db", "settings"])
    assert result.exit_code == 0, result.output
    assert "an external server: nothing was changed" in result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["setting", "running", "recommended"]
    assert [line.split()[0] for line in lines[1:]] == list(sizing.TUNABLES)
    assert show(libpq, *sizing.TUNABLES) == before

    monkeypatch.setenv("RAGSERVICE_EMBEDDED_PG_SETTINGS", "shared_buffer=1GB")
    get_settings.cache_clear()
    refused = cli.invoke(app, ["db", "settings"])
    assert refused.exit_code == 1
    assert "'shared_buffer' is not a setting ragservice sizes" in refused.stderr


def test_db_optimize_runs_as_the_owner_and_refuses_anyone_else(
    database_url: str, service_url: str, cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service's own login: a member of the service roles, not the tables' owner.
    monkeypatch.setenv("RAGSERVICE_DATABASE_URL", service_url)
    monkeypatch.setenv("RAGSERVICE_OWNER_DATABASE_URL", service_url)
    get_settings.cache_clear()
    refused = cli.invoke(app, ["db", "optimize"])
    assert refused.exit_code == 1
    assert "does not own chunk_postings" in refused.stderr
    assert "pack the BM25 postings" not in refused.stderr

    monkeypatch.setenv("RAGSERVICE_OWNER_DATABASE_URL", database_url)
    get_settings.cache_clear()
    done = cli.invoke(app, ["db", "optimize"])
    assert done.exit_code == 0, done.output
    for table in ("chunk_postings", "chunks", "chunk_embeddings", "documents"):
        assert f"  {table}: " in done.stderr
    assert "pack the BM25 postings" in done.stderr and "optimized: " in done.stderr
    # The postings were rewritten in the order of their primary key (a term's blocks together).
    libpq = make_url(database_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(libpq) as conn:
        clustered = conn.execute(
            "SELECT indisclustered FROM pg_index WHERE indexrelid = 'chunk_postings_pkey'::regclass"
        ).fetchone()
    assert clustered == (True,)
