"""Collections and documents over HTTP: CRUD, uploads as jobs, paging, per-file job errors."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok, wait_for_job


def test_collections_create_list_get_delete(client: TestClient, keys: Keys) -> None:
    body = {"name": "papers", "description": "research", "metadata": {"team": "ml"}}
    created = ok(client.post("/v1/collections", json=body, headers=keys.writer), 201)
    assert created["name"] == "papers"
    assert created["metadata"] == {"team": "ml"}
    assert (created["document_count"], created["chunk_count"]) == (0, 0)
    duplicate = client.post("/v1/collections", json=body, headers=keys.writer)
    assert duplicate.status_code == 409
    assert "already exists" in duplicate.json()["detail"]
    ok(client.post("/v1/collections", json={"name": "notes"}, headers=keys.writer), 201)
    listed = ok(client.get("/v1/collections", headers=keys.reader))
    assert [c["name"] for c in listed["collections"]] == ["notes", "papers"]
    ok(client.delete("/v1/collections/papers", headers=keys.admin), 204)
    assert client.get("/v1/collections/papers", headers=keys.reader).status_code == 404
    assert client.delete("/v1/collections/papers", headers=keys.admin).status_code == 404


def test_json_documents_become_a_job_then_list_get_page_and_delete(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "kb"}, headers=keys.writer), 201)
    documents = [
        {
            "external_id": f"doc-{i}",
            "title": f"Doc {i}",
            "text": f"Topic {i} text.",
            "metadata": {"i": i},
        }
        for i in range(5)
    ]
    response = client.post(
        "/v1/collections/kb/documents", json={"documents": documents}, headers=keys.writer
    )
    job = ok(response, 202)
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] in ("queued", "running", "done")
    finished = wait_for_job(client, job["id"], keys.reader)
    assert finished["status"] == "done"
    assert finished["counts"]["new"] == 5
    assert finished["errors"] == []

    first = ok(client.get("/v1/collections/kb/documents?limit=2", headers=keys.reader))
    assert [d["external_id"] for d in first["documents"]] == ["doc-0", "doc-1"]
    second = ok(
        client.get(
            f"/v1/collections/kb/documents?limit=2&after={first['next_after']}",
            headers=keys.reader,
        )
    )
    assert [d["external_id"] for d in second["documents"]] == ["doc-2", "doc-3"]
    last = ok(
        client.get(
            f"/v1/collections/kb/documents?limit=2&after={second['next_after']}",
            headers=keys.reader,
        )
    )
    assert [d["external_id"] for d in last["documents"]] == ["doc-4"]
    assert last["next_after"] is None

    doc = ok(client.get("/v1/collections/kb/documents/doc-3?chunks=true", headers=keys.reader))
    assert (doc["title"], doc["metadata"]["i"], doc["version"]) == ("Doc 3", 3, 1)
    assert len(doc["chunks"]) == 1
    assert "Topic 3 text." in doc["chunks"][0]["text"]
    assert ok(client.get("/v1/collections/kb", headers=keys.reader))["document_count"] == 5

    ok(client.delete("/v1/collections/kb/documents/doc-3", headers=keys.writer), 204)
    assert client.get("/v1/collections/kb/documents/doc-3", headers=keys.reader).status_code == 404
    assert (
        client.delete("/v1/collections/kb/documents/doc-3", headers=keys.writer).status_code == 404
    )
    assert ok(client.get("/v1/collections/kb", headers=keys.reader))["document_count"] == 4


def test_a_bad_file_in_a_batch_is_reported_and_the_good_ones_land(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "files"}, headers=keys.writer), 201)
    files = [
        (
            "files",
            ("guide.md", b"# Guide\n\nPgvector stores embeddings next to rows.\n", "text/markdown"),
        ),
        ("files", ("notes.txt", b"Reciprocal rank fusion merges two ranked lists.", "text/plain")),
        ("files", ("broken.pdf", b"%PDF-1.7 this is not really a pdf", "application/pdf")),
    ]
    job = ok(
        client.post(
            "/v1/collections/files/documents/files",
            files=files,
            data={"metadata": '{"team": "search"}'},
            headers=keys.writer,
        ),
        202,
    )
    finished = wait_for_job(client, job["id"], keys.reader)
    assert finished["status"] == "done"
    assert finished["counts"]["new"] == 2
    assert finished["counts"]["failed"] == 1
    assert [e["source"] for e in finished["errors"]] == ["broken.pdf"]
    assert finished["errors"][0]["error"]
    listed = ok(client.get("/v1/collections/files/documents", headers=keys.reader))
    assert [d["external_id"] for d in listed["documents"]] == ["guide.md", "notes.txt"]
    assert all(d["metadata"]["team"] == "search" for d in listed["documents"])
    jobs = ok(client.get("/v1/jobs?collection=files", headers=keys.reader))
    assert [j["id"] for j in jobs["jobs"]] == [job["id"]]


def test_a_job_that_cannot_run_fails_with_a_reason(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "rows"}, headers=keys.writer), 201)
    job = ok(
        client.post(
            "/v1/collections/rows/documents/files",
            files=[("files", ("rows.jsonl", b'{"_id": "1", "text": "x"}\n', "application/jsonl"))],
            data={"jsonl_fields": "colour=red"},
            headers=keys.writer,
        ),
        202,
    )
    finished = wait_for_job(client, job["id"], keys.writer)  # rows may name readers: its own
    assert finished["status"] == "failed"
    assert finished["errors"][0]["source"] is None
    assert "colour" in finished["errors"][0]["error"]
    assert ok(client.get("/v1/collections/rows", headers=keys.reader))["document_count"] == 0
