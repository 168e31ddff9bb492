"""`reader_for`: the reader a location needs, with its options checked against the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.sources import reader_for, source_kind
from ingest.sources.folder import FolderReader
from ingest.sources.s3 import S3Reader
from ingest.sources.web import WebReader
from ragservice.config import SourceSettings

SETTINGS = SourceSettings(crawl_max_pages=50, crawl_rate=4.0, source_max_bytes=1000)


def test_the_location_picks_the_reader(tmp_path: Path) -> None:
    assert source_kind("HTTPS://example.com/") == "web"
    assert source_kind("s3://bucket/prefix") == "s3"
    assert source_kind(str(tmp_path)) == "folder"
    web = reader_for("https://example.com/docs/", {"depth": 1}, settings=SETTINGS)
    assert isinstance(web, WebReader)
    assert (web.depth, web.max_pages, web.rate, web.max_bytes) == (1, 50, 4.0, 1000)
    assert web.user_agent == "ragservice/0.1" and not web.guard.allow_private
    bucket = reader_for("s3://b/p/", {"region": "eu-west-1"}, settings=SETTINGS)
    assert isinstance(bucket, S3Reader) and (bucket.bucket, bucket.prefix) == ("b", "p/")
    folder = reader_for(str(tmp_path), {"include": "*.md"}, settings=SETTINGS)
    assert isinstance(folder, FolderReader) and folder.include == ("*.md",)


def test_the_allow_setting_reaches_the_guard() -> None:
    allowed = SourceSettings(sources_allow_private=True)
    web = reader_for("http://127.0.0.1:8000/", settings=allowed)
    assert isinstance(web, WebReader) and web.guard.allow_private


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        ("https://example.com/", {"profile": "x"}, "unknown option for a web source: profile"),
        ("s3://b/", {"depth": 2, "rate": 1}, "unknown options for a s3 source: depth, rate"),
        ("/data", {"endpoint_url": "http://x"}, "unknown option for a folder source"),
        ("https://example.com/", {"max_pages": 51}, "max_pages: from 1 to 50"),
        ("https://example.com/", {"rate": 0}, "rate: from 0.001 to 4"),
        ("https://example.com/", {"depth": 1.5}, "depth: a whole number"),
        ("https://example.com/", {"depth": True}, "depth: a number"),
        ("/data", {"exclude": [1]}, "exclude: a list of glob patterns"),
        ("s3://b/", {"endpoint_url": ""}, "endpoint_url: a non-empty string"),
        ("ftp//nothing", {"max_bytes": 0}, "max_bytes: from 1 to 1000"),
    ],
)
def test_bad_options_are_refused_clearly(
    location: str, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        reader_for(location, options, settings=SETTINGS)
