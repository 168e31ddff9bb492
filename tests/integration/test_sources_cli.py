"""Sources from the command line, in process (the session's model shared): `sources add`,
`list`, `run` (here, and queued for the workers) and `remove`; `ingest URL` of a small site
served on localhost (the guard's allow-private setting on), with and without --crawl; `sync` of
a folder once, and `sync --watch` following a folder as files are added, changed and deleted."""

from __future__ import annotations

import functools
import http.server
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner, Result

from ragservice.cli import app
from ragservice.config import get_settings
from tests.locked_site import basic
from tests.locked_site import locked_site as serve_locked

pytestmark = pytest.mark.default_tenancy  # the commands say whose rows they work on

WAIT_SECONDS = 60.0
BIN = Path(sys.executable).parent


@pytest.fixture
def cli(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """The shared `cli`, allowed to crawl the test's site on localhost without pauses."""
    monkeypatch.setenv("RAGSERVICE_SOURCES_ALLOW_PRIVATE", "true")
    monkeypatch.setenv("RAGSERVICE_CRAWL_RATE", "100")
    get_settings.cache_clear()
    return cli


def run(cli: CliRunner, *args: str, code: int = 0) -> Result:
    result = cli.invoke(app, list(args))
    assert result.exit_code == code, result.output
    return result


def rows(database_url: str, statement: str) -> list[tuple[Any, ...]]:
    """`statement` as the database's owner (row-level security does not apply)."""
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        return conn.execute(statement).fetchall()


def documents(database_url: str, collection: str) -> dict[str, str]:
    """The collection's documents: external id → title."""
    found = rows(
        database_url,
        "SELECT d.external_id, coalesce(d.title, '') FROM documents d "
        f"JOIN collections c ON c.id = d.collection_id WHERE c.name = '{collection}'",
    )
    return dict(found)


def wait_for(what: str, check: Callable[[], bool], seconds: float = WAIT_SECONDS) -> None:
    """Poll `check` until it holds (bounded: fails after `seconds`)."""
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def handbook(folder: Path) -> Path:
    (folder / "policies").mkdir(parents=True)
    (folder / "leave.md").write_text("# Leave\n\nParents get sixteen weeks of paid leave.")
    (folder / "policies" / "travel.md").write_text("# Travel\n\nBook flights early.")
    return folder


def test_sources_add_list_run_queue_and_remove(
    cli: CliRunner, database_url: str, tmp_path: Path
) -> None:
    folder = handbook(tmp_path / "handbook")
    added = json.loads(
        run(cli, "sources", "add", str(folder), "-c", "docs", "--every", "1h", "--json").stdout
    )
    assert added["kind"] == "folder" and added["location"] == str(folder.resolve())
    assert added["every_seconds"] == 3600 and added["prune"] is True
    assert added["last_run"] is None
    source_id = added["id"]

    ran = run(cli, "sources", "run", source_id, "-c", "docs")
    assert "added" in ran.stderr
    assert documents(database_url, "docs") == {"leave.md": "Leave", "policies/travel.md": "Travel"}

    [listed] = json.loads(run(cli, "sources", "list", "-c", "docs", "--json").stdout)
    assert listed["id"] == source_id
    assert listed["last_run"]["status"] == "done"
    assert listed["last_run"]["counts"]["added"] == 2
    line = run(cli, "sources", "list", "-c", "docs").stdout.strip().split("\t")
    assert line[:3] == [source_id, str(folder.resolve()), "every 1h"]
    assert line[4:] == ["done", "2/0/0/0", "0 errors"]

    (folder / "leave.md").unlink()
    queued = run(cli, "sources", "run", source_id, "-c", "docs", "--queue")
    job_id = uuid.UUID(queued.stdout.strip())
    assert rows(database_url, f"SELECT status FROM ingest_jobs WHERE id = '{job_id}'") == [
        ("queued",)
    ]
    refused = cli.invoke(app, ["sources", "run", source_id, "-c", "docs"])
    assert refused.exit_code == 1 and "error:" in refused.stderr  # one run at a time
    assert "Traceback" not in refused.output

    run(cli, "sources", "remove", source_id, "-c", "docs", "--delete-documents")
    assert run(cli, "sources", "list", "-c", "docs", "--json").stdout.strip() == "[]"
    assert documents(database_url, "docs") == {}


def test_bad_input_is_a_clear_error(cli: CliRunner, tmp_path: Path) -> None:
    folder = handbook(tmp_path / "handbook")
    cases: list[tuple[list[str], int, str]] = [
        (["sources", "add", str(tmp_path / "nowhere"), "-c", "docs"], 2, "is not a folder"),
        (["sources", "add", str(folder), "-c", "docs", "--every", "5x"], 2, "30m, 1h or 1d"),
        (["sources", "add", str(folder), "-c", "docs", "--readers", "hr"], 2, "--readers"),
        (["sources", "run", str(uuid.uuid4()), "-c", "docs"], 1, "error:"),
        (["sources", "remove", "not-an-id", "-c", "docs"], 2, "valid UUID"),
        (["ingest", "https://example.org/", str(folder), "-c", "docs"], 2, "not both"),
        (["ingest", "https://example.org/", "-c", "docs", "--dry-run"], 2, "--dry-run"),
        (["ingest", "https://example.org/", "-c", "docs", "--depth", "2"], 2, "need --crawl"),
        (["ingest", "s3://bucket/prefix", "-c", "docs", "--crawl"], 2, "for web pages"),
        (["ingest", str(folder), "-c", "docs", "--crawl"], 2, "for web pages"),
        (["sync", str(folder / "leave.md"), "-c", "docs"], 2, "is not a folder"),
    ]
    for args, code, message in cases:
        result = cli.invoke(app, args)
        assert result.exit_code == code, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output, args


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A site of three linked pages served on localhost; its base URL."""
    root = tmp_path_factory.mktemp("site")
    page = "<html><head><title>{title}</title></head><body><h1>{title}</h1><p>{text}</p>{links}"
    pages = {
        "index.html": ("Home", "The handbook's home page.", '<a href="leave.html">Leave</a>'),
        "leave.html": ("Leave", "Sixteen weeks of leave.", '<a href="travel.html">Travel</a>'),
        "travel.html": ("Travel", "Book flights early.", ""),
    }
    for name, (title, text, links) in pages.items():
        (root / name).write_text(page.format(title=title, text=text, links=links))
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_ingest_a_page_and_a_crawled_site(cli: CliRunner, database_url: str, site: str) -> None:
    one = json.loads(run(cli, "ingest", f"{site}/index.html", "-c", "page", "--json").stdout)
    assert one["ok"] and [r["counts"]["added"] for r in one["runs"]] == [1]
    assert list(documents(database_url, "page")) == [f"{site}/index.html"]

    crawled = json.loads(
        run(cli, "ingest", f"{site}/index.html", "-c", "web", "--crawl", "--json").stdout
    )
    [report] = crawled["runs"]
    assert crawled["ok"] and report["counts"]["added"] == 3
    assert set(documents(database_url, "web").values()) == {"Home", "Leave", "Travel"}

    again = run(cli, "ingest", f"{site}/index.html", "-c", "web", "--crawl")
    assert "unchanged" in again.stderr
    [listed] = json.loads(run(cli, "sources", "list", "-c", "web", "--json").stdout)
    assert listed["every_seconds"] is None and listed["prune"] is False  # one source, reused
    assert listed["last_run"]["counts"]["unchanged"] == 3


@pytest.fixture(scope="module")
def bucket() -> Iterator[str]:
    """moto's S3 server on localhost with a bucket of two notes under `handbook/`; its URL."""
    import boto3
    from moto.server import ThreadedMotoServer

    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            env.delenv(name, raising=False)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        try:
            host, port = server.get_host_and_port()
            endpoint = f"http://{host}:{port}"
            s3 = boto3.client("s3", endpoint_url=endpoint)
            s3.create_bucket(Bucket="docs")
            s3.put_object(Bucket="docs", Key="handbook/leave.md", Body=b"# Leave\n\nSixteen weeks.")
            s3.put_object(Bucket="docs", Key="handbook/travel.md", Body=b"# Travel\n\nFly early.")
            s3.put_object(Bucket="docs", Key="other/skip.md", Body=b"# Skip\n\nNot under it.")
            yield endpoint
        finally:
            server.stop()


def test_ingest_an_s3_prefix(cli: CliRunner, database_url: str, bucket: str) -> None:
    args = ["ingest", "s3://docs/handbook/", "-c", "bucket", "--endpoint-url", bucket, "--json"]
    summary = json.loads(run(cli, *args).stdout)
    [report] = summary["runs"]
    assert summary["ok"] and report["counts"]["added"] == 2
    assert set(documents(database_url, "bucket").values()) == {"Leave", "Travel"}
    [listed] = json.loads(run(cli, "sources", "list", "-c", "bucket", "--json").stdout)
    assert listed["kind"] == "s3" and listed["options"] == {"endpoint_url": bucket}


def test_sync_once_then_watch(
    cli: CliRunner, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = handbook(tmp_path / "mirror")
    run(cli, "sync", str(folder), "-c", "mirror")
    assert set(documents(database_url, "mirror")) == {"leave.md", "policies/travel.md"}
    (folder / "policies" / "travel.md").unlink()
    run(cli, "sync", str(folder), "-c", "mirror")
    assert set(documents(database_url, "mirror")) == {"leave.md"}  # pruned

    stop = threading.Event()
    monkeypatch.setattr("ragservice.cli.sync.new_stop_event", lambda: stop)
    outcome: list[Result] = []
    watcher = threading.Thread(
        target=lambda: outcome.append(
            cli.invoke(app, ["sync", str(folder), "-c", "mirror", "--watch"])
        )
    )
    runs_before = _runs(database_url)
    watcher.start()
    try:
        wait_for("the first run of --watch", lambda: _runs(database_url) > runs_before)
        (folder / "new.md").write_text("# New\n\nA page written while watched.")
        (folder / "leave.md").write_text("# Leave, changed\n\nTwenty weeks now.")
        wait_for(
            "the new and changed files",
            lambda: (
                documents(database_url, "mirror") == {"leave.md": "Leave, changed", "new.md": "New"}
            ),
        )
        (folder / "new.md").unlink()
        wait_for(
            "the deleted file's document to go",
            lambda: set(documents(database_url, "mirror")) == {"leave.md"},
        )
    except AssertionError as exc:
        stop.set()
        watcher.join(timeout=WAIT_SECONDS)
        shown = outcome[0].output if outcome else "(still running)"
        raise AssertionError(f"{exc}; sync --watch said:\n{shown}") from None
    finally:
        stop.set()
        watcher.join(timeout=WAIT_SECONDS)
    assert not watcher.is_alive()
    [result] = outcome
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if " ran (" in line]
    assert len(lines) >= 3 and "first run" in lines[0]
    assert any("1 removed" in line for line in lines[1:])


def _runs(database_url: str) -> int:
    """Runs of sources so far (each is an ingest job naming its source) that ended."""
    [(count,)] = rows(
        database_url,
        "SELECT count(*) FROM ingest_jobs "
        "WHERE source_id IS NOT NULL AND status IN ('done', 'failed')",
    )
    return int(count)


@pytest.mark.slow
def test_ctrl_c_ends_sync_watch_with_130(database_url: str, tmp_path: Path) -> None:
    """The real command in its own process: Ctrl-C (SIGINT) while it watches ends it."""
    folder = handbook(tmp_path / "watched")
    env = {
        **os.environ,
        "RAGSERVICE_DATABASE_URL": database_url,
        "RAGSERVICE_DATA_DIR": str(tmp_path / "data"),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "200",
        # A hang shows where it hangs: SIGABRT below makes the process print every thread's
        # stack (it happened once in a full run on a busy machine; not reproduced since).
        "PYTHONFAULTHANDLER": "1",
    }
    command = [str(BIN / "ragservice"), "sync", str(folder), "-c", "watched", "--watch"]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        # A process of its own loads the model first: slow on a busy machine, so a longer bound.
        first = lambda: _runs(database_url) == 1 or process.poll() is not None  # noqa: E731
        wait_for("the first run", first, seconds=4 * WAIT_SECONDS)
        assert process.poll() is None, process.communicate()[1]
        process.send_signal(signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=WAIT_SECONDS)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            _, stacks = process.communicate(timeout=WAIT_SECONDS)
            pytest.fail(f"no exit within {WAIT_SECONDS} s of SIGINT; its output:\n{stacks}")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, stderr
    assert "ran (first run): 2 added" in stderr and "stopped after 1 run(s)" in stderr
    assert "Traceback" not in stderr
    assert set(documents(database_url, "watched")) == {"leave.md", "policies/travel.md"}


USER, SECRET = "crawler", "hunter2-Secret"
BASIC = basic(USER, SECRET)


@pytest.fixture
def locked_site(tmp_path: Path) -> Iterator[tuple[str, list[str | None]]]:
    """A page behind Basic auth on localhost: its URL (no credentials) and the headers sent."""
    root = tmp_path / "locked"
    root.mkdir()
    (root / "index.html").write_text("<html><body><h1>Private</h1><p>Pay day.</p></body></html>")
    with serve_locked(root, USER, SECRET) as served:
        yield served


def test_credentials_in_a_location_are_used_and_never_shown(
    cli: CliRunner,
    database_url: str,
    locked_site: tuple[str, list[str | None]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url, seen = locked_site
    with_userinfo = url.replace("http://", f"http://{USER}:{SECRET}@", 1)
    collection = f"locked-{uuid.uuid4().hex[:8]}"
    added = run(cli, "sources", "add", with_userinfo, "-c", collection, "--run", "--json")
    report = json.loads(added.stdout)
    assert report["ok"] and report["location"] == url and report["counts"]["added"] == 1
    assert BASIC in seen and None not in seen
    [listed] = json.loads(run(cli, "sources", "list", "-c", collection, "--json").stdout)
    assert listed["location"] == url and listed["has_credentials"] is True
    outputs = [
        added.stdout + added.stderr,
        run(cli, "sources", "list", "-c", collection).stdout,
        run(cli, "sources", "list", "-c", collection, "--json").stdout,
        run(cli, "sources", "run", listed["id"], "-c", collection).output,
    ]
    for output in outputs:
        assert SECRET not in output, output
    stored = [
        rows(database_url, "SELECT location, options FROM sources"),
        rows(database_url, "SELECT params, errors FROM ingest_jobs"),
        rows(database_url, "SELECT target, details FROM audit_log"),
        rows(database_url, "SELECT external_id, source, metadata FROM documents"),
    ]
    assert SECRET not in repr(stored)
    assert SECRET not in caplog.text

    with socket.socket() as closed:  # a port nothing listens on: the run fails
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    failed = run(
        cli,
        "sources",
        "add",
        f"http://{USER}:{SECRET}@127.0.0.1:{port}/",
        "-c",
        collection,
        "--run",
        code=1,
    )
    assert f"127.0.0.1:{port}" in failed.output and SECRET not in failed.output
    assert SECRET not in repr(rows(database_url, "SELECT errors FROM ingest_jobs"))
    assert SECRET not in caplog.text


def test_username_flag_takes_the_password_from_the_environment(
    cli: CliRunner,
    monkeypatch: pytest.MonkeyPatch,
    locked_site: tuple[str, list[str | None]],
) -> None:
    url, seen = locked_site
    monkeypatch.setenv("RAGSERVICE_SOURCE_PASSWORD", SECRET)
    collection = f"locked-{uuid.uuid4().hex[:8]}"
    added = run(cli, "sources", "add", url, "-c", collection, "--username", USER, "--run")
    assert BASIC in seen and None not in seen
    assert SECRET not in added.output
    [listed] = json.loads(run(cli, "sources", "list", "-c", collection, "--json").stdout)
    assert listed["location"] == url and listed["has_credentials"] is True
    twice = run(
        cli,
        "sources",
        "add",
        url.replace("http://", f"http://{USER}:x@"),
        "-c",
        collection,
        "--username",
        USER,
        code=1,
    )
    assert "given both" in twice.output and SECRET not in twice.output


def test_ingest_url_with_credentials_gives_its_source_them(
    cli: CliRunner, database_url: str, locked_site: tuple[str, list[str | None]]
) -> None:
    url, seen = locked_site
    collection = f"locked-{uuid.uuid4().hex[:8]}"
    run(cli, "ingest", url, "-c", collection, code=1)  # no credentials: 401
    with_userinfo = url.replace("http://", f"http://{USER}:{SECRET}@", 1)
    again = json.loads(run(cli, "ingest", with_userinfo, "-c", collection, "--json").stdout)
    assert again["ok"] and again["runs"][0]["location"] == url
    [listed] = json.loads(run(cli, "sources", "list", "-c", collection, "--json").stdout)
    assert listed["has_credentials"] is True and BASIC in seen
    audit = rows(database_url, "SELECT action, details FROM audit_log")
    assert "source.credentials" in repr(audit) and SECRET not in repr(audit)
