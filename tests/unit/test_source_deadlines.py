"""Deadlines of a crawl against a page that trickles in (a byte every two seconds, so that no
read ever times out): the answer's deadline fails that page, the run's ends the scan."""

from __future__ import annotations

import time

import pytest

from ingest.sources.base import Changed, Failed, SourceError
from ingest.sources.deadline import RunOverdue
from ingest.sources.web import WebReader
from tests.slow_site import slow_site

START = (
    b'<html><body><p>start</p><a href="/slow.html">slow</a><a href="/p.html">p</a></body></html>'
)
PAGE = b"<html><body><p>a page</p></body></html>"


def test_a_trickling_page_fails_at_its_answers_deadline_and_the_crawl_goes_on() -> None:
    with slow_site({"/": START, "/p.html": PAGE}) as (_site, base):
        reader = WebReader(
            f"{base}/", rate=1000.0, allow_private=True, timeout=30.0, response_seconds=2.5
        )
        began = time.monotonic()
        events = list(reader.scan({}))
        took = time.monotonic() - began

    failed = [e for e in events if isinstance(e, Failed)]
    assert [(e.key, e.reason) for e in failed] == [
        (f"{base}/slow.html", "no whole answer within 2.5 s")
    ]
    assert {e.key for e in events if isinstance(e, Changed)} == {f"{base}/", f"{base}/p.html"}
    assert reader.complete
    assert took < 2.5 + 5.0  # the read timeout (30 s) never came into it


def test_a_run_past_its_deadline_raises_within_it() -> None:
    with slow_site({}) as (_site, base):
        reader = WebReader(
            f"{base}/slow-start.html",
            rate=1000.0,
            allow_private=True,
            timeout=30.0,
            response_seconds=60.0,
            run_seconds=2.0,
        )
        began = time.monotonic()
        with pytest.raises(RunOverdue, match="deadline of 2 s") as raised:
            list(reader.scan({}))
        took = time.monotonic() - began
    assert isinstance(raised.value, SourceError)
    assert took < 2.0 + 5.0
