"""EPUB fidelity: whether each real book is accepted, and the loader's words against the book's
full text as the EPUB library reads it.

- The reference: the visible text (`html.visible_text`) of each document the spine names, in
  spine order, each file once, the navigation document left out, as ebooklib (the EPUB library
  this project depends on) reads the book. Where ebooklib refuses the book (a manifest naming
  `chapter.xhtml#o8`, or a file that is not in the archive), the same read straight from the
  archive with lxml: `META-INF/container.xml`, the package document, its manifest and spine,
  each href without its `#fragment` and percent-decoded. `reference` says which.
- Accepted: the loader (or another reader) gave text and no error; `ebooklib_accepts` says
  whether ebooklib opens the book at all.
- Words (`words.word_score`): recall and precision against the reference. The loader adds a
  `# <title>` from the table of contents to a chapter without a heading, so precision is a
  little under 1.

    python -m tests.realdocs.fidelity.epub      # one JSON line per file, then the summary
"""

from __future__ import annotations

import io
import posixpath
import time
import urllib.parse
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ebooklib
import lxml.etree
from ebooklib import epub

from tests.realdocs.fidelity import print_rows
from tests.realdocs.fidelity.html import visible_text
from tests.realdocs.fidelity.words import WordScore, total, word_score, words
from tests.realdocs.sources import ROOT, sources

EPUB_FOLDER = ROOT / "epub"
CHAPTER_TYPES = frozenset({"application/xhtml+xml", "text/html"})

Reader = Callable[[Path], str]
"""An EPUB reader under test: a corpus book to its text."""


def epub_names() -> list[str]:
    return [source.name for source in sources(("epub",))]


# -- the reference -----------------------------------------------------------------------------


def ebooklib_documents(data: bytes) -> list[bytes]:
    """The spine's documents as ebooklib reads them (it raises where it refuses the book)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its notices of future defaults
        book = epub.read_epub(io.BytesIO(data), {"ignore_ncx": True})
    items = {item.id: item for item in book.get_items()}
    found: dict[str, bytes] = {}
    for entry in book.spine:
        item = items.get(entry[0] if isinstance(entry, tuple) else entry)
        if item is None or item.get_type() == ebooklib.ITEM_NAVIGATION:
            continue
        if item.media_type in CHAPTER_TYPES:
            found.setdefault(item.file_name.partition("#")[0], item.content or b"")
    return list(found.values())


def archive_documents(data: bytes) -> list[bytes]:
    """The spine's documents read straight from the archive."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        container = lxml.etree.fromstring(archive.read("META-INF/container.xml"))
        package_path = _all(container, "rootfile")[0].get("full-path")
        package = lxml.etree.fromstring(archive.read(package_path))
        folder = posixpath.dirname(package_path)
        items = {e.get("id"): e for e in _all(package, "item")}
        found: dict[str, bytes] = {}
        for itemref in _all(package, "itemref"):
            item = items.get(itemref.get("idref"))
            if item is None or "nav" in item.get("properties", "").split():
                continue
            if item.get("media-type") in CHAPTER_TYPES:
                href = urllib.parse.unquote(item.get("href").partition("#")[0])
                name = posixpath.normpath(posixpath.join(folder, href))
                if name not in found:
                    found[name] = archive.read(name)
        return list(found.values())


def _all(root: Any, name: str) -> list[Any]:
    return [
        e for e in root.iter() if isinstance(e.tag, str) and lxml.etree.QName(e).localname == name
    ]


def reference_text(data: bytes) -> tuple[str, str]:
    """The book's full text and which reader gave it ("ebooklib" or "archive")."""
    try:
        documents, kind = ebooklib_documents(data), "ebooklib"
    except Exception:  # ebooklib refuses the book: read it as the package describes it
        documents, kind = archive_documents(data), "archive"
    return "\n\n".join(visible_text(document) for document in documents), kind


def ebooklib_accepts(data: bytes) -> bool:
    try:
        ebooklib_documents(data)
    except Exception:
        return False
    return True


# -- ours --------------------------------------------------------------------------------------


def loader_reader() -> Reader:
    """This project's loader (`ingest.loaders.epub_files.parse_epub`)."""
    from ingest.loaders.epub_files import parse_epub
    from ragservice.limits.documents import DocumentLimits

    limits = DocumentLimits(max_pages=2000, max_chars=50_000_000)

    def read(path: Path) -> str:
        return parse_epub(path.read_bytes(), limits).text

    return read


# -- the measure -------------------------------------------------------------------------------


def measure(name: str, read: Reader | None = None) -> dict[str, Any]:
    """Every measure of one corpus book, read by the loader or by `read`."""
    path = EPUB_FOLDER / name
    data = path.read_bytes()
    reference, kind = reference_text(data)
    started = time.perf_counter()
    error = ""
    try:
        ours = (read or loader_reader())(path)
    except Exception as exc:  # a refusal is this file's result
        ours, error = "", f"{type(exc).__name__}: {exc}"[:300]
    seconds = time.perf_counter() - started
    score = word_score(words(ours), words(reference))
    return {
        "file": name,
        "accepted": not error and bool(ours.strip()),
        "error": error,
        "ebooklib_accepts": ebooklib_accepts(data),
        "reference": kind,
        "reference_words": score.reference,
        "our_words": score.ours,
        "recall": round(score.recall, 4),
        "precision": round(score.precision, 4),
        "seconds": round(seconds, 4),
        "_score": score,
    }


def fidelity(
    read: Reader | None = None, names: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One JSON-ready dict per corpus book (`measure`) and the summary over all of them, read
    by this project's loader, or by `read` (another library, for a benchmark)."""
    measured = [measure(name, read) for name in (names or epub_names())]
    scores: list[WordScore] = [row.pop("_score") for row in measured]
    overall = total(scores)
    summary = {
        "files": len(measured),
        "accepted": sum(1 for row in measured if row["accepted"]),
        "ebooklib_accepts": sum(1 for row in measured if row["ebooklib_accepts"]),
        "recall": round(overall.recall, 4),
        "precision": round(overall.precision, 4),
        "lowest_recall": min((row["recall"] for row in measured), default=1.0),
        "seconds": round(sum(row["seconds"] for row in measured), 3),
    }
    return measured, summary


def main() -> None:
    print_rows(*fidelity())


if __name__ == "__main__":
    main()
