"""Sources: where documents live (a web site, an S3-compatible bucket, a local folder).

A source reader (`SourceReader`) walks its source and says, for each document it finds,
whether it is new or changed (with its bytes), unchanged (by ETag, Last-Modified, size and
time, or content hash), or failed; what a complete walk did not find is gone. The readers fetch
only: parsing, ingest and deleting what is gone are the sync's (`ingest.sources.sync`), and
what a source knew of each document at its last run is kept in the store.

`reader_for(location, options)` picks the reader by the location's form: `http(s)://…` a web
crawl (`web.py`), `s3://bucket/prefix` a bucket (`s3.py`), anything else a folder
(`folder.py`). The settings (`RAGSERVICE_CRAWL_*`, `RAGSERVICE_SOURCE_MAX_BYTES`) are the
defaults of the options and their upper bounds: a source may ask for less, never for more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ingest.sources.base import SourceReader
from ingest.sources.credentials import Credentials
from ragservice.config import SourceSettings, get_settings

FOLDER_OPTIONS = frozenset({"include", "exclude", "max_bytes", "run_seconds"})
WEB_OPTIONS = frozenset(
    {
        "include",
        "exclude",
        "max_bytes",
        "run_seconds",
        "depth",
        "max_pages",
        "rate",
        "timeout",
        "response_seconds",
        "user_agent",
    }
)
S3_OPTIONS = frozenset(
    {"include", "exclude", "max_bytes", "run_seconds", "profile", "endpoint_url", "region"}
)

N = TypeVar("N", int, float)


def source_kind(location: str) -> str:
    """`web`, `s3` or `folder`: what reads `location`."""
    lowered = location.lower()
    if lowered.startswith(("http://", "https://")):
        return "web"
    if lowered.startswith("s3://"):
        return "s3"
    return "folder"


def reader_for(
    location: str,
    options: Mapping[str, Any] | None = None,
    *,
    settings: SourceSettings | None = None,
    credentials: Credentials | None = None,
) -> SourceReader:
    """The reader of `location` with `options` (see the module), fetching with `credentials`
    (`ingest.sources.credentials`; a folder takes none). Raises ValueError, with a message for
    a person, for an unknown option or a bad value."""
    given = dict(options or {})
    config = settings or get_settings().sources
    kind = source_kind(location)
    allowed = {"web": WEB_OPTIONS, "s3": S3_OPTIONS, "folder": FOLDER_OPTIONS}[kind]
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ValueError(
            f"unknown option{'s' if len(unknown) > 1 else ''} for a {kind} source: "
            f"{', '.join(unknown)} (known: {', '.join(sorted(allowed))})"
        )
    include = _globs(given, "include")
    exclude = _globs(given, "exclude")
    max_bytes = _number(given, "max_bytes", int, config.max_bytes, low=1)
    run = run_seconds(given, config)
    if kind == "web":
        from ingest.sources.web import WebReader

        return WebReader(
            location,
            depth=_number(given, "depth", int, config.crawl_depth, low=0),
            max_pages=_number(given, "max_pages", int, config.crawl_max_pages, low=1),
            rate=_number(given, "rate", float, config.crawl_rate, low=0.001),
            timeout=_number(given, "timeout", float, config.crawl_timeout_seconds, low=0.1),
            response_seconds=_number(
                given, "response_seconds", float, config.crawl_response_seconds, low=0.1
            ),
            run_seconds=run,
            user_agent=_text(given, "user_agent") or config.crawl_user_agent,
            allow_private=config.allow_private,
            include=include,
            exclude=exclude,
            max_bytes=max_bytes,
            credentials=credentials,
        )
    if kind == "s3":
        from ingest.sources.s3 import S3Reader

        return S3Reader(
            location,
            profile=_text(given, "profile"),
            endpoint_url=_text(given, "endpoint_url"),
            region=_text(given, "region"),
            allow_private=config.allow_private,
            include=include,
            exclude=exclude,
            max_bytes=max_bytes,
            credentials=credentials,
        )
    if credentials is not None:
        raise ValueError("a folder source takes no credentials")
    from ingest.sources.folder import FolderReader

    return FolderReader(location, include, exclude, max_bytes=max_bytes)


def run_seconds(options: Mapping[str, Any], settings: SourceSettings) -> float:
    """How long a run of a source with `options` may take: its `run_seconds`, up to
    `RAGSERVICE_SOURCE_RUN_SECONDS` (its default). ValueError for a bad value."""
    return _number(options, "run_seconds", float, settings.run_seconds, low=0.1)


def _globs(given: Mapping[str, Any], name: str) -> tuple[str, ...]:
    value = given.get(name, ())
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or not all(isinstance(g, str) and g for g in value):
        raise ValueError(f"option {name}: a list of glob patterns, got {value!r}")
    return tuple(value)


def _number(given: Mapping[str, Any], name: str, kind: type[N], ceiling: N, *, low: float) -> N:
    """The option `name` as `kind`, from `low` up to the setting `ceiling` (its default)."""
    value = given.get(name)
    if value is None:
        return ceiling
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"option {name}: a number, got {value!r}")
    if kind is int and value != int(value):
        raise ValueError(f"option {name}: a whole number, got {value!r}")
    if not low <= value <= ceiling:
        raise ValueError(f"option {name}: from {low:g} to {ceiling:g} (the setting), got {value}")
    return kind(value)


def _text(given: Mapping[str, Any], name: str) -> str | None:
    value = given.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"option {name}: a non-empty string, got {value!r}")
    return value.strip()
