"""Uploading chunks with their vectors (JSONL with `chunks`, Parquet) over HTTP."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from tests.api.conftest import Keys, ok, wait_for_job

DIM = 384


def _vectors(n: int, dim: int = DIM) -> list[list[float]]:
    rows = np.random.default_rng(1).standard_normal((n, dim)).astype(np.float32)
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).tolist()  # type: ignore[no-any-return]


def _jsonl(dim: int = DIM) -> bytes:
    chunks = [{"text": f"jsonl chunk {i}", "embedding": v} for i, v in enumerate(_vectors(2, dim))]
    lines = [
        {"_id": "from-jsonl", "title": "J", "chunks": chunks},
        {"_id": "plain", "text": "A text line, embedded by the server."},
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


def _parquet() -> bytes:
    table = pa.table(
        {
            "doc": ["from-parquet", "from-parquet"],
            "text": ["parquet chunk 0", "parquet chunk 1"],
            "vec": pa.array(_vectors(2), pa.list_(pa.float32())),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _upload(
    client: TestClient,
    headers: dict[str, str],
    data: dict[str, str],
    files: list[tuple[str, bytes]],
) -> Any:
    return client.post(
        "/v1/collections/bulk/documents/files",
        files=[("files", (name, body, "application/octet-stream")) for name, body in files],
        data=data,
        headers=headers,
    )


def test_jsonl_and_parquet_with_vectors_are_imported(client: TestClient, keys: Keys) -> None:
    ok(client.post("/v1/collections", json={"name": "bulk"}, headers=keys.writer), 201)
    serving = client.app.state.runtime.models.current()  # type: ignore[attr-defined]
    data = {"model": f"{serving.name}:{serving.version}", "parquet_columns": "id=doc,embedding=vec"}
    files = [("v.jsonl", _jsonl()), ("c.parquet", _parquet())]
    job = ok(_upload(client, keys.writer, data, files), 202)
    finished = wait_for_job(client, job["id"], keys.writer)  # rows may name readers: its own
    assert finished["status"] == "done", finished
    assert finished["counts"]["new"] == 3
    assert (finished["counts"]["chunks_imported"], finished["counts"]["chunks_embedded"]) == (4, 1)
    doc = ok(
        client.get("/v1/collections/bulk/documents/from-parquet?chunks=true", headers=keys.reader)
    )
    assert [c["text"] for c in doc["chunks"]] == ["parquet chunk 0", "parquet chunk 1"]
    assert doc["metadata"]["file_type"] == "parquet"
    # Another tenant can neither import into the collection nor see it.
    foreign = _upload(client, keys.other_tenant, {}, files)
    assert foreign.status_code == 404
    listed = client.get("/v1/collections/bulk/documents", headers=keys.other_tenant)
    assert listed.status_code == 404


def test_a_wrong_dimension_fails_its_document_and_an_unknown_model_is_refused(
    client: TestClient, keys: Keys
) -> None:
    ok(client.post("/v1/collections", json={"name": "bulk"}, headers=keys.writer), 201)
    job = ok(_upload(client, keys.writer, {}, [("v.jsonl", _jsonl(dim=12))]), 202)
    finished = wait_for_job(client, job["id"], keys.writer)
    assert finished["counts"]["new"] == 1  # the plain line
    [error] = finished["errors"]
    assert error["source"] == "v.jsonl:1"
    assert "12 dimensions" in error["error"] and f"has {DIM}" in error["error"]
    unknown = _upload(client, keys.writer, {"model": "nope:3"}, [("v.jsonl", _jsonl())])
    assert unknown.status_code == 422
    assert "nope:3" in unknown.json()["detail"]
    reader = _upload(client, keys.reader, {}, [("v.jsonl", _jsonl())])
    assert reader.status_code == 403
