"""An S3-compatible bucket as a source: the objects under a prefix, fetched only when changed.

An object whose ETag is what the last run saw is unchanged without being downloaded (the
listing carries every ETag); any other is fetched, and one whose bytes hash as before is
unchanged too. Credentials are the source's own (an access key id and secret key, given in
the location or apart: `ingest.sources.credentials`), or else come the way boto3 finds them
(the AWS_* variables, a named profile, an instance role); `endpoint_url` reaches
S3-compatible stores (MinIO, R2, Ceph).

An endpoint given by a source is checked by the SSRF guard before each scan, so that a tenant
cannot point it at an address inside the network. The check is made on the name's addresses at
that moment; boto3 resolves the name again when it connects, so a name that changes its
address between the two (DNS rebinding) is a residual risk. Operators who let tenants name
endpoints should give them addresses, or names they control.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from ingest.loaders.formats import file_type
from ingest.sources.base import (
    Changed,
    Failed,
    ItemState,
    ScanEvent,
    Skipped,
    SourceError,
    Unchanged,
)
from ingest.sources.credentials import Credentials
from ingest.sources.guard import Guard
from ragservice.extras import missing_extra

_GONE_CODES = ("NoSuchKey", "404")
_TIMEOUT_SECONDS = 30


@dataclass
class BucketStats:
    """What the last scan did: objects listed, downloads, and objects no loader reads (yielded
    as `Skipped`, not downloaded)."""

    listed: int = 0
    downloads: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class _Object:
    key: str
    etag: str
    size: int
    last_modified: str | None


class S3Reader:
    """Lists `s3://bucket/prefix` and fetches what changed (see the module)."""

    def __init__(
        self,
        location: str,
        *,
        profile: str | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        allow_private: bool = False,
        include: Sequence[str] = (),
        exclude: Sequence[str] = (),
        max_bytes: int = 32 * 2**20,
        guard: Guard | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        parts = urlsplit(location)
        if parts.scheme.lower() != "s3" or not parts.netloc:
            raise ValueError(f"{location!r} is not an s3://bucket/prefix location")
        if parts.username is not None or parts.password is not None:
            raise ValueError("an S3 location's credentials are given apart from it")
        if credentials is not None and profile is not None:
            raise ValueError("an S3 source takes a profile or credentials, not both")
        self.bucket = parts.netloc
        self.prefix = parts.path.lstrip("/")
        self.profile = profile
        self.endpoint_url = endpoint_url
        self.region = region
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.max_bytes = max_bytes
        self.guard = guard or Guard(allow_private=allow_private)
        self.credentials = credentials
        self.complete = False
        self.stats = BucketStats()

    def scan(self, known: Mapping[str, ItemState]) -> Iterator[ScanEvent]:
        """One event per object under the prefix whose name a loader reads; raises
        SourceError (before yielding) when the bucket cannot be listed: no such bucket,
        access denied, bad credentials, an endpoint refused or unreachable."""
        self.complete = False
        self.stats = BucketStats()
        client = self._client()
        pages = self._pages(client)
        first = self._first(pages)
        return self._events(client, first, pages, known)

    def _client(self) -> Any:
        problem = missing_extra("s3", "an S3 source")
        if problem:
            raise SourceError(problem)
        if self.endpoint_url:
            self.guard.check_url(self.endpoint_url)
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        try:
            keys = self.credentials
            session = boto3.session.Session(
                aws_access_key_id=None if keys is None else keys.username,
                aws_secret_access_key=None if keys is None else keys.password,
                profile_name=self.profile,
                region_name=self.region,
            )
            return session.client(
                "s3",
                endpoint_url=self.endpoint_url,
                config=Config(
                    connect_timeout=_TIMEOUT_SECONDS,
                    read_timeout=_TIMEOUT_SECONDS,
                    retries={"max_attempts": 3},
                ),
            )
        except BotoCoreError as exc:  # no such profile, a bad endpoint URL
            raise SourceError(f"s3://{self.bucket}: {exc}") from exc

    def _pages(self, client: Any) -> Iterator[list[_Object]]:
        from botocore.exceptions import BotoCoreError, ClientError

        paginator = client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                yield [_listed(item) for item in page.get("Contents", ())]
        except ClientError as exc:
            raise SourceError(f"s3://{self.bucket}/{self.prefix}: {_client_error(exc)}") from exc
        except BotoCoreError as exc:  # unreachable endpoint, no credentials
            raise SourceError(f"s3://{self.bucket}/{self.prefix}: {exc}") from exc

    def _first(self, pages: Iterator[list[_Object]]) -> list[_Object]:
        # The first listing is made now, so that a missing bucket or denied access is an
        # error of the scan call itself, before any event.
        return next(pages, [])

    def _events(
        self,
        client: Any,
        first: list[_Object],
        pages: Iterator[list[_Object]],
        known: Mapping[str, ItemState],
    ) -> Iterator[ScanEvent]:
        yield from self._page_events(client, first, known)
        for page in pages:
            yield from self._page_events(client, page, known)
        self.complete = True

    def _page_events(
        self, client: Any, page: list[_Object], known: Mapping[str, ItemState]
    ) -> Iterator[ScanEvent]:
        for item in page:
            self.stats.listed += 1
            if not self._selected(item.key):
                continue
            key = self._document_key(item.key)
            suffix = PurePosixPath(item.key).suffix.lower()
            if not file_type(item.key):
                self.stats.skipped += 1
                yield Skipped(key, f"unsupported file type {suffix or '(no suffix)'}")
                continue
            event = self._event(client, item, known.get(key))
            if event is not None:
                yield event

    def _selected(self, key: str) -> bool:
        """Whether the object is a file (not a "folder" marker) that include/exclude let
        through; the globs' choice is the user's, and not reported."""
        name = key.rsplit("/", 1)[-1]
        if not name:
            return False
        relative = key[len(self.prefix) :].lstrip("/")
        if any(fnmatchcase(relative, g) or fnmatchcase(name, g) for g in self.exclude):
            return False
        return not self.include or any(
            fnmatchcase(relative, g) or fnmatchcase(name, g) for g in self.include
        )

    def _document_key(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _event(self, client: Any, item: _Object, prior: ItemState | None) -> ScanEvent | None:
        key = self._document_key(item.key)
        if prior is not None and prior.etag == item.etag:
            return Unchanged(key, prior)
        if item.size > self.max_bytes:
            return Failed(key, f"{item.size} bytes, over the limit of {self.max_bytes}")
        try:
            data = self._download(client, item)
        except _Gone:
            return None  # deleted since it was listed
        except _DownloadFailed as exc:
            return Failed(key, str(exc))
        state = ItemState(
            etag=item.etag,
            last_modified=item.last_modified,
            content_hash=hashlib.sha256(data).hexdigest(),
        )
        if prior is not None and prior.content_hash == state.content_hash:
            return Unchanged(key, state)
        origin = {
            "bucket": self.bucket,
            "key": item.key,
            "etag": item.etag,
            "last_modified": item.last_modified,
            "size": item.size,
        }
        return Changed(key, item.key.rsplit("/", 1)[-1], data, state, origin)

    def _download(self, client: Any, item: _Object) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        self.stats.downloads += 1
        try:
            answer = client.get_object(Bucket=self.bucket, Key=item.key)
            data: bytes = answer["Body"].read(self.max_bytes + 1)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _GONE_CODES:
                raise _Gone from exc
            raise _DownloadFailed(_client_error(exc)) from exc
        except BotoCoreError as exc:
            raise _DownloadFailed(str(exc)) from exc
        if len(data) > self.max_bytes:
            raise _DownloadFailed(f"over the limit of {self.max_bytes} bytes")
        return data


class _Gone(Exception):
    pass


class _DownloadFailed(Exception):
    pass


def _listed(item: Mapping[str, Any]) -> _Object:
    modified = item.get("LastModified")
    return _Object(
        key=str(item["Key"]),
        etag=str(item.get("ETag", "")),
        size=int(item.get("Size", 0)),
        last_modified=modified.isoformat() if modified is not None else None,
    )


def _client_error(exc: Any) -> str:
    error = exc.response.get("Error", {})
    code = error.get("Code", "error")
    messages = {
        "NoSuchBucket": "no such bucket",
        "AccessDenied": "access denied",
        "InvalidAccessKeyId": "the access key is not known",
        "SignatureDoesNotMatch": "the secret key does not match",
    }
    return messages.get(code) or f"{code}: {error.get('Message', '')}".rstrip(": ")
