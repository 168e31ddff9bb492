"""The sources API: a writer adds a site (served here, on loopback) and its runs are jobs;
readers read, other tenants see nothing, and what the API may not add is a 422."""

from __future__ import annotations

import http.server
import logging
import socket
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ingest.worker import JobWorker
from ragservice.config import Settings
from tests.api.conftest import Keys, ok
from tests.locked_site import basic
from tests.locked_site import locked_site as serve_locked

PAGES = 3


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A small site on loopback: an index linking to its pages."""
    root = tmp_path_factory.mktemp("site")
    links = "".join(f'<a href="p{i}.html">page {i}</a> ' for i in range(PAGES))
    (root / "index.html").write_text(f"<html><body><h1>Index</h1>{links}</body></html>")
    for i in range(PAGES):
        body = f"<html><head><title>Page {i}</title></head><body><p>Topic {i} notes.</p></body>"
        (root / f"p{i}.html").write_text(body + "</html>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), partial(_QuietHandler, directory=str(Path(root)))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    thread.join()


@pytest.fixture
def overrides() -> dict[str, Any]:
    """Settings a test changes (by parametrizing this fixture)."""
    return {}


@pytest.fixture
def api_settings(settings: Settings, overrides: dict[str, Any]) -> Settings:
    """No job threads: the tests run the jobs they queue (so a queued run is still queued)."""
    update = {
        "workers": 0,
        "sources_allow_private": True,
        "sources_s3_buckets": "shared",
        "crawl_rate": 100.0,
    }
    return settings.model_copy(update={**update, **overrides})


def run_jobs(client: TestClient) -> None:
    worker = JobWorker(client.app.state.runtime, threads=0)  # type: ignore[attr-defined]
    while worker.run_once():
        pass


def add(client: TestClient, headers: dict[str, str], **body: Any) -> Any:
    return client.post("/v1/collections/docs/sources", json=body, headers=headers)


def test_a_writer_adds_a_site_and_its_first_run_ingests_it(
    client: TestClient, keys: Keys, site: str
) -> None:
    source = ok(add(client, keys.writer, location=site, options={"depth": 1}), 201)
    assert (source["kind"], source["location"], source["prune"]) == ("web", site, True)
    assert source["queued_job_id"] is not None

    run_jobs(client)

    shown = ok(client.get(f"/v1/collections/docs/sources/{source['id']}", headers=keys.reader))
    assert shown["last_run"]["job_id"] == source["queued_job_id"]
    assert shown["last_run"]["status"] == "done", shown["last_run"]
    assert shown["last_run"]["counts"]["added"] == PAGES + 1
    listed = ok(client.get("/v1/collections/docs/sources", headers=keys.reader))
    assert [s["id"] for s in listed["sources"]] == [source["id"]]
    documents = ok(client.get("/v1/collections/docs/documents", headers=keys.reader))
    assert len(documents["documents"]) == PAGES + 1


def test_a_second_run_while_one_is_queued_is_a_conflict(
    client: TestClient, keys: Keys, site: str
) -> None:
    source = ok(add(client, keys.writer, location=site, run=False), 201)
    assert source["queued_job_id"] is None
    url = f"/v1/collections/docs/sources/{source['id']}/run"

    queued = ok(client.post(url, headers=keys.writer), 202)
    conflict = client.post(url, headers=keys.writer)
    assert conflict.status_code == 409, conflict.text
    assert queued["job_id"] in conflict.json()["detail"]

    run_jobs(client)
    ok(client.post(url, headers=keys.writer), 202)  # the first one is over


def test_roles_and_tenants(client: TestClient, keys: Keys, site: str) -> None:
    assert add(client, keys.reader, location=site).status_code == 403
    source = ok(add(client, keys.writer, location=site, run=False), 201)
    one = f"/v1/collections/docs/sources/{source['id']}"
    assert client.post(f"{one}/run", headers=keys.reader).status_code == 403
    assert client.delete(one, headers=keys.reader).status_code == 403

    other = keys.other_tenant
    for method, url in (
        ("GET", "/v1/collections/docs/sources"),
        ("GET", one),
        ("POST", f"{one}/run"),
        ("DELETE", one),
    ):
        response = client.request(method, url, headers=other)
        assert response.status_code == 404, (method, url, response.text)

    ok(client.delete(one, headers=keys.writer), 204)
    assert client.get(one, headers=keys.reader).status_code == 404


def test_removing_a_source_can_delete_its_documents(
    client: TestClient, keys: Keys, site: str
) -> None:
    source = ok(add(client, keys.writer, location=site), 201)
    run_jobs(client)
    one = f"/v1/collections/docs/sources/{source['id']}"
    ok(client.delete(f"{one}?delete_documents=true", headers=keys.writer), 204)
    documents = ok(client.get("/v1/collections/docs/documents", headers=keys.reader))
    assert documents["documents"] == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"location": "ftp://example.org/"}, "location"),
        ({"location": "/etc"}, "folder sources are for operators"),
        ({"location": "file:///etc"}, "folder sources are for operators"),
        ({"location": "s3://private-bucket/x"}, "RAGSERVICE_SOURCES_S3_BUCKETS"),
        ({"location": "s3://shared/x", "options": {"profile": "prod"}}, "options.profile"),
        ({"location": "http://127.0.0.1/", "options": {"colour": "red"}}, "colour"),
        ({"location": "http://127.0.0.1/", "options": {"rate": 10_000}}, "option rate"),
        ({"location": "http://127.0.0.1/", "every_seconds": 5}, "every_seconds"),
        ({"location": "http://127.0.0.1/", "readers": ["nobody"]}, "readers"),
    ],
)
def test_what_the_api_may_not_add_is_a_422(
    client: TestClient, keys: Keys, body: dict[str, Any], says: str
) -> None:
    response = add(client, keys.writer, **body)
    assert response.status_code == 422, response.text
    assert says in response.text


@pytest.mark.parametrize("overrides", [{"sources_allow_private": False}])
def test_private_addresses_are_refused_without_the_setting(
    client: TestClient, keys: Keys, site: str
) -> None:
    response = add(client, keys.writer, location=site)
    assert response.status_code == 422, response.text
    assert "RAGSERVICE_SOURCES_ALLOW_PRIVATE" in response.json()["detail"]
    assert ok(client.get("/v1/collections", headers=keys.reader))["collections"] == []


@pytest.mark.parametrize("overrides", [{"sources_max_per_collection": 1}])
def test_a_collection_has_one_source_per_location_and_at_most_the_limit(
    client: TestClient, keys: Keys, site: str
) -> None:
    ok(add(client, keys.writer, location=site, run=False), 201)
    again = add(client, keys.writer, location=site, run=False)
    assert again.status_code == 409, again.text
    assert "already has a source" in again.json()["detail"]
    full = add(client, keys.writer, location=site.replace("index", "p0"), run=False)
    assert full.status_code == 409, full.text
    assert "RAGSERVICE_SOURCES_MAX_PER_COLLECTION" in full.json()["detail"]


USER, SECRET = "reader-bot", "s3cr3t-Pa55"
BASIC = basic(USER, SECRET)


@pytest.fixture
def locked_site(tmp_path: Path) -> Iterator[tuple[str, list[str | None]]]:
    """A site on loopback behind Basic auth: its start URL (no credentials) and the
    Authorization headers it was sent."""
    (tmp_path / "index.html").write_text(
        '<html><body><h1>Index</h1><a href="p0.html">page</a></body></html>'
    )
    (tmp_path / "p0.html").write_text("<html><body><p>Private notes.</p></body></html>")
    with serve_locked(tmp_path, USER, SECRET) as served:
        yield served


def _with_userinfo(url: str) -> str:
    return url.replace("http://", f"http://{USER}:{SECRET}@", 1)


@pytest.mark.parametrize("given", ["in the location", "apart"])
def test_credentials_are_used_to_fetch_and_never_shown(
    client: TestClient,
    keys: Keys,
    locked_site: tuple[str, list[str | None]],
    caplog: pytest.LogCaptureFixture,
    given: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    url, seen = locked_site
    if given == "in the location":
        response = add(client, keys.writer, location=_with_userinfo(url))
    else:
        credentials = {"username": USER, "password": SECRET}
        response = add(client, keys.writer, location=url, credentials=credentials)
    source = ok(response, 201)
    assert source["location"] == url and source["has_credentials"] is True

    run_jobs(client)

    one = f"/v1/collections/docs/sources/{source['id']}"
    shown = ok(client.get(one, headers=keys.reader))
    assert shown["last_run"]["status"] == "done", shown["last_run"]
    assert shown["last_run"]["counts"]["added"] == 2
    assert BASIC in seen and None not in seen  # every request of the crawl was signed
    bodies = [
        response.text,
        client.get(one, headers=keys.reader).text,
        client.get("/v1/collections/docs/sources", headers=keys.reader).text,
        client.get(f"/v1/jobs/{source['queued_job_id']}", headers=keys.admin).text,
        client.get("/v1/audit", headers=keys.admin).text,
    ]
    for body in bodies:
        assert SECRET not in body and USER not in body, body
    assert client.get(one, headers=keys.other_tenant).status_code == 404
    ok(client.delete(one, headers=keys.writer), 204)
    audit = client.get("/v1/audit", headers=keys.admin).text
    assert "source.remove" in audit and SECRET not in audit
    assert SECRET not in caplog.text
    assert all(SECRET not in str(record.args) for record in caplog.records)


def test_a_failed_run_names_the_location_without_its_credentials(
    client: TestClient, keys: Keys, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    source = ok(add(client, keys.writer, location=f"http://{USER}:{SECRET}@127.0.0.1:{port}/"), 201)
    run_jobs(client)
    job = client.get(f"/v1/jobs/{source['queued_job_id']}", headers=keys.admin)
    assert ok(job)["status"] == "failed", job.text
    assert f"127.0.0.1:{port}" in job.text and SECRET not in job.text
    shown = client.get(f"/v1/collections/docs/sources/{source['id']}", headers=keys.reader)
    assert ok(shown)["last_run"]["status"] == "failed" and SECRET not in shown.text
    assert SECRET not in caplog.text


@pytest.mark.parametrize("overrides", [{"sources_allow_private": False}])
def test_a_refused_location_is_named_without_its_credentials(
    client: TestClient, keys: Keys
) -> None:
    response = add(client, keys.writer, location=f"http://{USER}:{SECRET}@127.0.0.1/docs/")
    assert response.status_code == 422, response.text
    assert "RAGSERVICE_SOURCES_ALLOW_PRIVATE" in response.text and SECRET not in response.text


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (
            {
                "location": f"http://{USER}:{SECRET}@127.0.0.1/",
                "credentials": {"username": USER, "password": SECRET},
            },
            "credentials",
        ),
        (
            {
                "location": "s3://shared/x",
                "options": {"endpoint_url": f"http://{USER}:{SECRET}@127.0.0.1:9000"},
            },
            "endpoint_url",
        ),
    ],
)
def test_credentials_given_twice_or_in_an_option_are_refused(
    client: TestClient, keys: Keys, body: dict[str, Any], says: str
) -> None:
    response = add(client, keys.writer, **body)
    assert response.status_code == 422, response.text
    assert says in response.json()["detail"] and SECRET not in response.text
