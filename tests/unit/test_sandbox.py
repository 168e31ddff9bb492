"""Files are parsed in a child process: over its time or memory a file fails alone, and the
next file parses as usual."""

from __future__ import annotations

import os
import threading

import pytest

from ingest.loaders import DocumentLimits, load_bytes
from ingest.loaders.parsing import ParseError
from ingest.loaders.replies import checked_page_starts
from ingest.loaders.sandbox import parse_isolated, sandbox_pid
from ragservice.types import LoadedDocument, LoadFailure
from tests.pdfs import make_pdf

# About 14 MB of HTML: BeautifulSoup needs seconds of CPU and well over 256 MiB for its tree.
HEAVY_HTML = b"<html><body>" + b"<div><p>x y z</p></div>" * 600_000 + b"</body></html>"


def limits(*, seconds: float = 60.0, memory_mib: int = 1024) -> DocumentLimits:
    return DocumentLimits(
        max_pages=100, max_chars=50_000_000, parse_seconds=seconds, parse_memory_mib=memory_mib
    )


def only(name: str, data: bytes, given: DocumentLimits) -> LoadedDocument | LoadFailure:
    (result,) = load_bytes(name, data, limits=given)
    return result


def test_a_parse_over_its_time_fails_alone_and_the_next_file_parses() -> None:
    slow = only("slow.html", HEAVY_HTML, limits(seconds=0.2))
    assert isinstance(slow, LoadFailure)
    assert slow.reason == ("parsing took longer than 0.2 s (RAGSERVICE_PARSE_TIMEOUT_SECONDS)")
    after = only("after.md", b"# Next\n\nfine", limits(seconds=0.2))
    assert isinstance(after, LoadedDocument)
    assert after.title == "Next"


def test_a_parse_over_its_memory_fails_alone_and_the_next_file_parses() -> None:
    big = only("big.html", HEAVY_HTML, limits(memory_mib=200))
    assert isinstance(big, LoadFailure)
    assert big.reason == "parsing used more than 200 MiB (RAGSERVICE_PARSE_MEMORY_MIB)"
    after = only("after.txt", b"still here", limits(memory_mib=200))
    assert isinstance(after, LoadedDocument)
    assert after.text == "still here"


def test_parse_errors_and_results_cross_the_process_boundary_unchanged() -> None:
    broken = only("broken.pdf", b"%PDF-1.7 not really", limits())
    assert isinstance(broken, LoadFailure)
    assert broken.reason.startswith("not a valid PDF")
    page = only("page.html", b"<title>T</title><h1>Head</h1><p>Body</p>", limits())
    assert isinstance(page, LoadedDocument)
    assert (page.title, page.format, page.metadata["file_type"]) == ("T", "markdown", "html")
    assert page.text == "# Head\n\nBody"


def test_a_pdfs_page_map_crosses_the_process_boundary() -> None:
    parsed = parse_isolated(".pdf", make_pdf(["One.", "Two.", "Three."]), limits())
    assert (parsed.text, parsed.page_starts) == ("One.\n\nTwo.\n\nThree.", (0, 6, 12))


@pytest.mark.parametrize(
    "sent",
    [
        [0] * 101,  # more pages than the limits allow
        [0, 9, 4],  # out of order
        [0, 99],  # past the end of the text
        [-1, 2],
        [0, "3"],
        [0, True],
        {"0": 1},
    ],
)
def test_a_page_map_that_does_not_fit_its_text_is_refused(sent: object) -> None:
    with pytest.raises(ParseError, match="page map"):
        checked_page_starts(sent, 20, 100)


def test_each_thread_parses_in_its_own_process() -> None:
    pids: dict[str, int] = {}

    def parse(name: str) -> None:
        parsed = parse_isolated(".txt", f"{name} text".encode(), limits())
        assert parsed.text == f"{name} text"
        pid = sandbox_pid()
        assert pid is not None
        pids[name] = pid

    threads = [threading.Thread(target=parse, args=(name,)) for name in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(pids) == {"a", "b"}
    assert len({pids["a"], pids["b"], os.getpid()}) == 3
