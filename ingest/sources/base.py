"""What every source reader takes and gives; shared by the readers and the sync."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias


@dataclass(frozen=True, slots=True)
class ItemState:
    """What a source knew of one document at its last run: how to ask whether it changed.

    `etag` and `last_modified` are the validators the source gave (HTTP headers, an S3
    object's ETag and LastModified; a folder's size and mtime as `etag`); `content_hash` is
    the SHA-256 of the bytes last fetched; `links` are the same-site links a crawled page
    held, so that a page answered `304 Not Modified` still leads the crawl on."""

    etag: str | None = None
    last_modified: str | None = None
    content_hash: str | None = None
    links: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "etag": self.etag,
            "last_modified": self.last_modified,
            "content_hash": self.content_hash,
            "links": list(self.links),
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> ItemState:
        return cls(
            etag=value.get("etag"),
            last_modified=value.get("last_modified"),
            content_hash=value.get("content_hash"),
            links=tuple(value.get("links") or ()),
        )


@dataclass(frozen=True, slots=True)
class Changed:
    """A document that is new or changed: its bytes, to be parsed as `name`'s suffix says.

    `key` is the document's external id (a URL, `s3://bucket/key`, a path relative to the
    folder) and stays the same across runs; `origin` is recorded in the document's metadata
    (`origin`: where it came from and the validators it came with). `readers`: who may read
    it, as the source itself says (a folder's `.readers` sidecar); None: not said, so the
    source's own readers apply."""

    key: str
    name: str
    data: bytes
    state: ItemState
    origin: dict[str, Any] = field(default_factory=dict)
    readers: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class Unchanged:
    """A document the source still has and that did not change (nothing was downloaded)."""

    key: str
    state: ItemState


@dataclass(frozen=True, slots=True)
class Failed:
    """A document the source has but that could not be fetched; kept as it is stored."""

    key: str
    reason: str


@dataclass(frozen=True, slots=True)
class Skipped:
    """A file the source has but no loader reads (an image, an archive): not fetched, not a
    document, and not a failure; counted and listed in the run's report."""

    key: str
    reason: str


ScanEvent: TypeAlias = Changed | Unchanged | Failed | Skipped


class SourceError(Exception):
    """The source as a whole cannot be read (no such bucket, the site's host refused, an
    address the SSRF guard refuses): the run fails and deletes nothing. The message is for a
    person."""


class SourceReader(Protocol):
    """Walks one source. `scan` yields one event per document found (and per file skipped),
    each key once; a scan that ends without raising found everything there is, so what
    `known` has and the scan did not yield as a document is gone from the source."""

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]: ...
