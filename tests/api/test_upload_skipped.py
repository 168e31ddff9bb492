"""An upload of real messages with attachments no loader reads (a GIF, a PGP signature): the
job is done, its counts show the attachments skipped, nothing failed, and each message is a
document that names what it skipped."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok, wait_for_job

MAIL = Path(__file__).parents[1] / "realdocs" / "mail"


def test_an_upload_jobs_counts_show_the_skipped_attachments(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "mail"}, headers=keys.writer), 201)
    files = [
        ("files", (name, (MAIL / name).read_bytes(), "message/rfc822"))
        for name in ("cpython-msg07-dingus-fish.eml", "dkim-pep394-comments.eml")
    ]
    url = "/v1/collections/mail/documents/files"
    queued = ok(client.post(url, files=files, headers=keys.writer), 202)
    done = wait_for_job(client, queued["id"], keys.reader)
    assert done["status"] == "done", done
    counts = done["counts"]
    assert (counts["new"], counts["skipped"], counts["failed"]) == (2, 2, 0)
    assert done["errors"] == []
    listed = ok(client.get("/v1/jobs", headers=keys.reader))["jobs"]
    assert [job["counts"]["skipped"] for job in listed if job["id"] == queued["id"]] == [2]

    fish = ok(
        client.get(
            "/v1/collections/mail/documents/cpython-msg07-dingus-fish.eml", headers=keys.reader
        )
    )
    assert fish["metadata"]["skipped_attachments"] == ["dingusfish.gif"]
