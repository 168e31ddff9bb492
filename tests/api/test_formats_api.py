"""`GET /v1/formats`: the loaders' formats as the console and other clients choose files by
them, behind a key like every other `/v1` endpoint; the upload route says the same."""

from __future__ import annotations

from fastapi.testclient import TestClient

from ingest.loaders.formats import FORMATS, SUPPORTED_SUFFIXES, suffix_list
from tests.api.conftest import Keys, ok


def test_formats_are_the_loaders_own(client: TestClient, keys: Keys) -> None:
    listed = ok(client.get("/v1/formats", headers=keys.reader))
    assert listed["suffixes"] == list(SUPPORTED_SUFFIXES)
    assert [f["kind"] for f in listed["formats"]] == [f.kind for f in FORMATS]
    by_kind = {f["kind"]: f for f in listed["formats"]}
    assert by_kind["pptx"]["citation"] == "slide"
    assert by_kind["xlsx"] == {
        "kind": "xlsx",
        "suffixes": [".xlsx"],
        "mime_types": ["application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"],
        "citation": "sheet",
        "extra": None,
        "limits": ["pages", "zip"],
    }
    assert by_kind["image"]["extra"] == "ocr"


def test_formats_need_a_key(client: TestClient, keys: Keys) -> None:
    assert client.get("/v1/formats").status_code == 401
    bad = {"Authorization": "Bearer rsk_not-a-key"}
    assert client.get("/v1/formats", headers=bad).status_code == 401
    assert ok(client.get("/v1/formats", headers=keys.other_tenant))["suffixes"]


def test_the_upload_route_describes_every_format(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    upload = paths["/v1/collections/{collection}/documents/files"]["post"]
    ref = upload["requestBody"]["content"]["multipart/form-data"]["schema"]["$ref"]
    name = ref.rsplit("/", 1)[1]
    schema = client.get("/openapi.json").json()["components"]["schemas"][name]
    assert schema["properties"]["files"]["description"] == suffix_list()
    assert "xlsx" in suffix_list() and "pptx" in suffix_list()
    assert "/v1/formats" in paths
