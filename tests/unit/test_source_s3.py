"""The bucket source against moto's S3 server on localhost: listing, ETags that spare
downloads, changes and deletions, and the errors that stop a scan."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ingest.sources.s3 import S3Reader

BUCKET = "docs"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            env.delenv(name, raising=False)
        werkzeug = logging.getLogger("werkzeug")
        level = werkzeug.level
        werkzeug.setLevel(logging.ERROR)  # a line per request otherwise
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()
        werkzeug.setLevel(level)


@pytest.fixture
def s3(endpoint: str) -> Iterator[Any]:
    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=BUCKET)
    yield client
    for item in client.list_objects_v2(Bucket=BUCKET).get("Contents", ()):
        client.delete_object(Bucket=BUCKET, Key=item["Key"])
    client.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The keys of every GetObject the readers' clients make."""
    keys: list[str] = []
    original = boto3.session.Session.client

    def spying(self: Any, *args: Any, **kwargs: Any) -> Any:
        client = original(self, *args, **kwargs)
        client.meta.events.register(
            "before-parameter-build.s3.GetObject", lambda params, **_: keys.append(params["Key"])
        )
        return client

    monkeypatch.setattr(boto3.session.Session, "client", spying)
    return keys


def _put(s3: Any, count: int = 20) -> None:
    for index in range(count):
        s3.put_object(Bucket=BUCKET, Key=f"team/doc{index:02}.md", Body=f"# Doc {index}\n")
    s3.put_object(Bucket=BUCKET, Key="team/photo.bin", Body=b"\0")  # no loader reads it
    s3.put_object(Bucket=BUCKET, Key="other/outside.md", Body=b"not under the prefix")


def _reader(endpoint: str, **options: Any) -> S3Reader:
    return S3Reader(f"s3://{BUCKET}/team/", endpoint_url=endpoint, allow_private=True, **options)


def _states(events: list[ScanEvent]) -> dict[str, ItemState]:
    return {e.key: e.state for e in events if isinstance(e, Changed | Unchanged)}


def test_list_rescan_and_changes(endpoint: str, s3: Any, downloads: list[str]) -> None:
    _put(s3)
    reader = _reader(endpoint)
    first = list(reader.scan({}))
    assert [type(e) for e in first] == [Changed] * 20 + [Skipped]
    assert first[-1] == Skipped(f"s3://{BUCKET}/team/photo.bin", "unsupported file type .bin")
    assert reader.complete and reader.stats.skipped == 1 and len(downloads) == 20
    doc = first[3]
    assert isinstance(doc, Changed)
    assert doc.key == f"s3://{BUCKET}/team/doc03.md" and doc.name == "doc03.md"
    assert doc.data == b"# Doc 3\n"
    assert doc.origin["bucket"] == BUCKET and doc.origin["key"] == "team/doc03.md"
    assert doc.origin["size"] == 8 and doc.origin["etag"] == doc.state.etag

    known = _states(first)
    downloads.clear()
    again = list(_reader(endpoint).scan(known))
    assert [type(e) for e in again] == [Unchanged] * 20 + [Skipped]
    assert downloads == []

    s3.put_object(Bucket=BUCKET, Key="team/doc05.md", Body=b"# Doc 5, changed\n")
    s3.put_object(Bucket=BUCKET, Key="team/doc06.md", Body=b"# Doc 6, changed\n")
    s3.delete_object(Bucket=BUCKET, Key="team/doc07.md")
    third = list(_reader(endpoint).scan(known))
    changed = sorted(e.key for e in third if isinstance(e, Changed))
    assert changed == [f"s3://{BUCKET}/team/doc05.md", f"s3://{BUCKET}/team/doc06.md"]
    assert sum(isinstance(e, Unchanged) for e in third) == 17
    assert set(known) - {e.key for e in third} == {f"s3://{BUCKET}/team/doc07.md"}
    assert sorted(downloads) == ["team/doc05.md", "team/doc06.md"]


def test_same_bytes_under_a_new_etag_are_unchanged(endpoint: str, s3: Any) -> None:
    _put(s3, 1)
    first = list(_reader(endpoint).scan({}))
    assert isinstance(first[0], Changed)
    stale = {first[0].key: ItemState(etag='"other"', content_hash=first[0].state.content_hash)}
    again = list(_reader(endpoint).scan(stale))
    assert [type(e) for e in again] == [Unchanged, Skipped]
    assert again[0].state.etag == first[0].state.etag  # type: ignore[union-attr]


def test_filters_and_size_limit(endpoint: str, s3: Any) -> None:
    _put(s3, 4)
    picked = list(_reader(endpoint, include=["doc0[12].md"]).scan({}))
    assert [e.key.rsplit("/", 1)[1] for e in picked] == ["doc01.md", "doc02.md"]
    big = list(_reader(endpoint, max_bytes=4).scan({}))
    read = [e for e in big if not isinstance(e, Skipped)]
    assert read and all(isinstance(e, Failed) and "over the limit" in e.reason for e in read)


def test_a_bucket_that_cannot_be_listed_is_a_source_error(endpoint: str, s3: Any) -> None:
    with pytest.raises(SourceError, match="no such bucket"):
        S3Reader("s3://missing/x", endpoint_url=endpoint, allow_private=True).scan({})
    with pytest.raises(SourceError, match="loopback address"):
        S3Reader(f"s3://{BUCKET}/", endpoint_url=endpoint).scan({})  # the guard, by default
    with pytest.raises(SourceError, match="profile"):
        S3Reader(
            f"s3://{BUCKET}/", profile="nobody", endpoint_url=endpoint, allow_private=True
        ).scan({})


def test_a_missing_boto3_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(SourceError, match=r"pip install 'ragservice\[s3\]'"):
        S3Reader(f"s3://{BUCKET}/").scan({})


def test_a_location_must_name_a_bucket() -> None:
    with pytest.raises(ValueError, match="not an s3://bucket/prefix"):
        S3Reader("s3:///prefix")
