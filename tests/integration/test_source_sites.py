"""Sources synced with the real readers: a site of 200 pages served here on loopback (with
Last-Modified, so reruns ask conditionally), and a folder; a source run as a worker's job."""

from __future__ import annotations

import dataclasses
import http.server
import logging
import os
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from ingest.sources.runs import source_target
from ingest.sources.sync import SyncReport, sync_source
from ingest.sources.web import WebReader
from ingest.targets import ingest_pipeline
from ingest.worker import JobWorker
from ragservice import store
from ragservice.embedding.null import null_embedder
from ragservice.runtime import Runtime
from ragservice.services import sources as service
from ragservice.services.callers import Operator
from ragservice.services.sources import SourceSpec
from tests.integration.test_source_sync import counts, documents

PAGES = 200


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    links = "".join(f'<li><a href="p{i:03d}.html">page {i}</a></li>' for i in range(PAGES))
    (root / "index.html").write_text(f"<html><body><h1>Handbook</h1><ul>{links}</ul></body></html>")
    for i in range(PAGES):
        write_page(root, i, f"Section {i} of the handbook covers topic {i}.")
    return root


def write_page(root: Path, i: int, body: str, *, later: int = 0) -> None:
    path = root / f"p{i:03d}.html"
    path.write_text(f"<html><head><title>Page {i}</title></head><body><p>{body}</p></body></html>")
    if later:  # Last-Modified has whole seconds: a change within the same second must show
        stamp = path.stat().st_mtime + later
        os.utime(path, (stamp, stamp))


@pytest.fixture(scope="module")
def site(site_root: Path) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_QuietHandler, directory=str(site_root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    thread.join()


def operator(runtime: Runtime) -> Operator:
    return Operator(tenant_id=runtime.default_tenant_id, actor="cli:test")


def crawl(runtime: Runtime, source: service.SourceView, url: str) -> SyncReport:
    reader = WebReader(url, depth=1, max_pages=1000, rate=1000.0, allow_private=True)
    with runtime.db.read() as session:
        row = store.sources.source_by_id(session, source.id)
    assert row is not None
    # The real tokenizer and chunking, vectors without the model: the crawl is under test.
    embedder = null_embedder(runtime.settings.embedding)
    pipeline = ingest_pipeline(runtime, tenant_id=runtime.default_tenant_id, embedder=embedder)
    return sync_source(runtime, source_target(runtime, row), reader, pipeline=pipeline)


def test_a_site_of_200_pages_synced_again_asks_conditionally_and_writes_only_changes(
    runtime: Runtime, site: str, site_root: Path
) -> None:
    settings = runtime.settings.model_copy(update={"sources_allow_private": True})
    spec = SourceSpec(location=site, options={"depth": 1})
    source = service.add_source(runtime.db, settings, operator(runtime), "handbook", spec)

    first = crawl(runtime, source, site)
    assert counts(first)["added"] == PAGES + 1  # the index is a page too
    assert first.complete and first.failed == 0
    before = documents(runtime)

    again = crawl(runtime, source, site)
    assert counts(again) == {
        "found": PAGES + 1,
        "unchanged": PAGES + 1,
        "not_modified": PAGES + 1,
        "requests": again.requests,
    }
    assert documents(runtime) == before

    changed = [3, 50, 99, 150, 199]
    removed = [10, 11, 12]
    for i in changed:
        write_page(site_root, i, f"Section {i} was rewritten.", later=5)
    for i in removed:
        (site_root / f"p{i:03d}.html").unlink()

    third = crawl(runtime, source, site)

    assert (third.changed, third.removed, third.added, third.failed) == (5, 3, 0, 0)
    assert third.not_modified == PAGES + 1 - 5 - 3
    after = documents(runtime)
    base = site.rsplit("/", 1)[0]
    assert set(before) - set(after) == {f"{base}/p{i:03d}.html" for i in removed}
    for i in changed:
        key = f"{base}/p{i:03d}.html"
        assert after[key][1] == before[key][1] + 1
    untouched = set(after) - {f"{base}/p{i:03d}.html" for i in changed}
    assert all(after[key] == before[key] for key in untouched)


def test_a_folder_source_run_by_a_worker(runtime: Runtime, tmp_path: Path) -> None:
    for name in ("a.txt", "b.md"):
        (tmp_path / name).write_text(f"The file {name} holds notes about folders.")
    view = service.find_or_add_source(
        runtime.db,
        runtime.settings,
        operator(runtime),
        "notes",
        SourceSpec(location=str(tmp_path), options={}),
    )
    assert view.kind == "folder"
    again = service.find_or_add_source(
        runtime.db,
        runtime.settings,
        operator(runtime),
        "notes",
        SourceSpec(location=f"file://{tmp_path}", options={}),
    )
    assert again.id == view.id
    job_id = service.queue_run(runtime.db, runtime.default_tenant_id, "notes", view.id)

    assert JobWorker(runtime, threads=0).run_once()

    shown = service.get_source(runtime.db, runtime.default_tenant_id, "notes", view.id)
    assert shown.last_run is not None and shown.last_run.job_id == job_id
    assert shown.last_run.status == "done", shown.last_run.errors
    assert shown.last_run.counts["added"] == 2
    assert set(documents(runtime)) == {"a.txt", "b.md"}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on loopback, with fake credentials in the environment."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            env.delenv(name, raising=False)
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()


def test_a_bucket_synced_again_downloads_and_writes_only_changes(
    runtime: Runtime, s3_endpoint: str
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    s3.create_bucket(Bucket="handbook")
    for i in range(10):
        s3.put_object(Bucket="handbook", Key=f"team/doc{i}.md", Body=f"# Doc {i}\n\nNotes {i}.")
    local = dataclasses.replace(
        runtime, settings=runtime.settings.model_copy(update={"sources_allow_private": True})
    )
    spec = SourceSpec(location="s3://handbook/team/", options={"endpoint_url": s3_endpoint})
    view = service.add_source(
        local.db, local.settings, operator(local), "bucket", spec, operator=True
    )

    def sync() -> SyncReport:
        return service.run_now(local, local.default_tenant_id, "bucket", view.id)

    first = sync()
    assert (first.found, first.added, first.failed) == (10, 10, 0)
    before = documents(local)
    again = sync()
    assert (again.found, again.unchanged, again.added, again.changed) == (10, 10, 0, 0)
    assert documents(local) == before

    s3.put_object(Bucket="handbook", Key="team/doc1.md", Body=b"# Doc 1\n\nRewritten.")
    s3.put_object(Bucket="handbook", Key="team/doc2.md", Body=b"# Doc 2\n\nRewritten.")
    s3.delete_object(Bucket="handbook", Key="team/doc9.md")
    third = sync()

    assert (third.changed, third.removed, third.unchanged, third.failed) == (2, 1, 7, 0)
    after = documents(local)
    assert set(before) - set(after) == {"s3://handbook/team/doc9.md"}
    for key in ("s3://handbook/team/doc1.md", "s3://handbook/team/doc2.md"):
        assert after[key][1] == before[key][1] + 1
