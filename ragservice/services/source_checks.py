"""What a source may be, checked before it is stored: its location's kind, its reader's
options, who adds it (the API or an operator), its schedule.

A tenant's source is fetched by the service's own machines with the service's credentials:
over the API a folder (the server's disk) is refused, a web host must pass the SSRF guard
(`ingest.sources.guard`, unless `RAGSERVICE_SOURCES_ALLOW_PRIVATE`), and an S3 source must name
a bucket `RAGSERVICE_SOURCES_S3_BUCKETS` lists, with neither a named AWS profile nor an endpoint
the guard refuses. Operators (the CLI) may add any source.

Credentials (a web site's user name and password, an S3 access key id and secret key) are
split off the location, or given apart (`SourceSpec.credentials`), never both; the messages of
what is refused name the location without them (`ingest.sources.credentials`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ingest.sources import runs
from ingest.sources.base import SourceError
from ingest.sources.credentials import Credentials, has_userinfo, redact, split_location
from ingest.sources.guard import Guard
from ragservice.config import Settings
from ragservice.errors import InvalidInputError
from ragservice.limits.text import json_text_problem, text_problem
from ragservice.readers import parse_readers

if TYPE_CHECKING:
    from ragservice.services.sources import SourceSpec

MAX_LOCATION_CHARS = 2048
MAX_OPTIONS_BYTES = 16 * 1024
MIN_EVERY_SECONDS = 60
"""The shortest schedule the API takes; operators may go down to a second."""
MAX_EVERY_SECONDS = 366 * 24 * 3600
MAX_CREDENTIAL_CHARS = 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_ENCODE_HINT = (
    "a user name or password holding '/', '?', '#', '@' or ':' is written percent-encoded "
    "(%2F …), or given apart (credentials)"
)


@dataclass(frozen=True, slots=True)
class CheckedSource:
    kind: str
    location: str
    options: dict[str, Any]
    readers: tuple[str, ...] | None
    credentials: Credentials | None = None


def source_kind(location: str) -> str:
    """`web` (http, https), `s3` (s3://bucket/prefix) or `folder` (a path, `file://` or not);
    InvalidInputError for another scheme."""
    try:
        scheme = urlsplit(location).scheme.lower()
    except ValueError:  # a broken IPv6 literal
        raise InvalidInputError("location: not a URL or a path that can be read") from None
    if scheme in ("http", "https"):
        return "web"
    if scheme == "s3":
        return "s3"
    if scheme in ("", "file") or (len(scheme) == 1 and location[1:3] in (":\\", ":/")):
        return "folder"
    raise InvalidInputError(
        f"location {location[:80]!r}: use an http(s) URL, s3://bucket/prefix or a folder path"
    )


def checked_source(settings: Settings, spec: SourceSpec, *, operator: bool) -> CheckedSource:
    """`spec` checked (see the module's docstring); InvalidInputError saying what is wrong."""
    location, given = split_location(spec.location.strip())
    credentials = _credentials(given, spec.credentials)
    _check_shape(location, spec, operator)
    kind = source_kind(location)
    if credentials is not None and kind == "folder":
        raise InvalidInputError("credentials: a folder source takes none")
    if kind != "folder":
        _check_authority(kind, location)
    if kind == "folder" and not operator:
        raise InvalidInputError(
            "folder sources are for operators (`ragservice sources add` on the server); "
            "the API takes http(s) and s3:// locations"
        )
    if kind == "folder":
        location = _folder_path(location)
    options = dict(spec.options)
    if not operator:
        _check_remote(settings, kind, location, options)
    endpoint = options.get("endpoint_url")
    if isinstance(endpoint, str) and has_userinfo(endpoint):
        raise InvalidInputError(
            "options.endpoint_url: give the bucket's keys as the source's credentials, "
            "not in the endpoint URL"
        )
    try:  # the reader checks its options
        runs.open_reader(settings, location, options, credentials=credentials)
    except SourceError as exc:
        raise InvalidInputError(redact(f"location {location[:80]!r}: {exc}", credentials)) from exc
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(redact(f"options: {exc}", credentials)) from exc
    readers = parse_readers(spec.readers)  # InvalidInputError naming a bad principal
    return CheckedSource(
        kind=kind, location=location, options=options, readers=readers, credentials=credentials
    )


def _credentials(in_location: Credentials | None, apart: Credentials | None) -> Credentials | None:
    """The source's credentials, given once; InvalidInputError (naming neither) otherwise."""
    if in_location is not None and apart is not None:
        raise InvalidInputError("credentials: given both in the location and apart; give them once")
    credentials = in_location or apart
    if credentials is None:
        return None
    if not credentials.username and not credentials.password:
        raise InvalidInputError("credentials: a user name, a password or both")
    for name, value in (("username", credentials.username), ("password", credentials.password)):
        if len(value) > MAX_CREDENTIAL_CHARS:
            raise InvalidInputError(
                f"credentials.{name}: longer than {MAX_CREDENTIAL_CHARS} characters"
            )
        if text_problem(value):
            raise InvalidInputError(f"credentials.{name}: characters that cannot be stored")
    if ":" in credentials.username:
        raise InvalidInputError("credentials.username: holds ':', which HTTP Basic cannot send")
    return credentials


def _check_authority(kind: str, location: str) -> None:
    """A URL's host part is whole: no user information left (split off before), a port that
    is a number, a bucket name S3 takes. The messages do not quote the location, which may
    hold part of a password that was not percent-encoded."""
    try:
        parts = urlsplit(location)
        parts.port  # noqa: B018 (raises ValueError for a port that is no number)
    except ValueError:
        raise InvalidInputError(
            f"location: its host or port cannot be read; {_ENCODE_HINT}"
        ) from None
    if "@" in parts.netloc:
        raise InvalidInputError(f"location: its host cannot be read; {_ENCODE_HINT}")
    if kind == "s3" and not _BUCKET.match(parts.netloc):
        raise InvalidInputError(
            "location: an S3 bucket's name is 3 to 63 lower-case letters, digits, dots and "
            f"hyphens; {_ENCODE_HINT}"
        )


def _folder_path(location: str) -> str:
    """A folder's absolute path (`file://` dropped), so that one folder is one source."""
    path = location[len("file://") :] if location.lower().startswith("file://") else location
    return str(Path(path).expanduser().resolve())


def _check_shape(location: str, spec: SourceSpec, operator: bool) -> None:
    if not location:
        raise InvalidInputError("location: empty")
    if len(location) > MAX_LOCATION_CHARS:
        raise InvalidInputError(f"location: longer than {MAX_LOCATION_CHARS} characters")
    if problem := text_problem(location):
        raise InvalidInputError(f"location: {problem}")
    if not isinstance(spec.options, dict):
        raise InvalidInputError("options: must be a JSON object")
    if problem := json_text_problem(spec.options):
        raise InvalidInputError(f"options: {problem}")
    if len(json.dumps(spec.options)) > MAX_OPTIONS_BYTES:
        raise InvalidInputError(f"options: larger than {MAX_OPTIONS_BYTES} bytes")
    every = spec.every_seconds
    shortest = 1 if operator else MIN_EVERY_SECONDS
    if every is not None and not shortest <= every <= MAX_EVERY_SECONDS:
        raise InvalidInputError(
            f"every_seconds: between {shortest} and {MAX_EVERY_SECONDS}, or null (runs when asked)"
        )


def _check_remote(settings: Settings, kind: str, location: str, options: dict[str, Any]) -> None:
    """What the API may not ask of the service's network and credentials."""
    guard = Guard(allow_private=settings.sources.allow_private)
    try:
        if kind == "web":
            guard.check_url(location)
        elif kind == "s3":
            _check_bucket(settings, location, options)
            endpoint = options.get("endpoint_url")
            if endpoint:
                guard.check_url(str(endpoint))
    except SourceError as exc:
        raise InvalidInputError(f"location {location[:80]!r}: {exc}") from exc


def _check_bucket(settings: Settings, location: str, options: dict[str, Any]) -> None:
    bucket = urlsplit(location).netloc
    allowed = settings.sources.s3_bucket_names()
    if bucket not in allowed:
        hint = "none are" if not allowed else "it is not one of them"
        raise InvalidInputError(
            f"S3 bucket {bucket!r}: the API adds sources for the buckets "
            f"RAGSERVICE_SOURCES_S3_BUCKETS lists only, and {hint}"
        )
    if options.get("profile"):
        raise InvalidInputError(
            "options.profile: AWS profiles of the server are for operators (the CLI)"
        )
