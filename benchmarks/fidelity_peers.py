"""Other readers of documents, as a user would pick one instead of this project's loader: each
file's text printed as JSON, for `benchmarks/fidelity.py`.

    .venv-peers/bin/python benchmarks/fidelity_peers.py PEER FILE [FILE ...]
    .venv-peers/bin/python benchmarks/fidelity_peers.py --list

Run in its own virtual environment (`make bench-fidelity` builds `.venv-peers`), so the
project's never imports these libraries (PyMuPDF and pymupdf4llm are AGPL). It imports nothing
of the project. One process reads many files, so interpreter start-up and imports stay out of
the timings; the first file is read once, untimed, before the others, so one-time set-up (a
layout model loaded on first use) does too. The network is cut before any peer runs: nothing
downloads while it runs, and a peer that tries fails on that file.

One JSON line per file, in the order given, on standard output (whatever a library prints
there itself goes to standard error):

    {"file": "a.pdf", "pages": ["page 1 text", ...], "seconds": 0.12}   # PDFs, page by page
    {"file": "a.epub", "text": "the whole text", "seconds": 0.03}       # other formats
    {"file": "a.eml", "error": "ValueError: why"}                        # the peer failed

`--list` prints {"peers": {name: {"version": "1.2"} or {"absent": "why"}}, "formats": {name:
the suffixes it is given, or ["*"]}}.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TextIO

Pages = list[str]
PDF = (".pdf",)
EVERYTHING = ("*",)


@dataclass(frozen=True)
class Timed:
    """A result whose reader timed itself, leaving out its own preparation of the file."""

    value: Pages | str
    seconds: float


Read = Callable[[Path], "Pages | str | Timed"]
"""A peer: a file to its pages (a PDF) or its text (anything else)."""


def _pdftotext(*options: str) -> Read:
    def read(path: Path) -> Pages:
        command = ["pdftotext", *options, "-enc", "UTF-8", str(path), "-"]
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.decode("utf-8", "replace").strip()[:300])
        return form_feed_pages(done.stdout.decode("utf-8", "replace"))

    return read


def form_feed_pages(text: str) -> Pages:
    """pdftotext's and pdfminer's text: each page ends with a form feed."""
    pages = text.split("\f")
    return pages[:-1] if pages and not pages[-1].strip() else pages


def _pymupdf(path: Path) -> Pages | str:
    import pymupdf

    with pymupdf.open(path) as document:
        pages = [page.get_text() for page in document]
    return pages if path.suffix.lower() == ".pdf" else "\n".join(pages)


def _pymupdf4llm(path: Path) -> Pages:
    import pymupdf4llm

    # OCR off, as the loader's PDF measure runs: both read the text the PDF holds.
    chunks = pymupdf4llm.to_markdown(
        str(path), page_chunks=True, show_progress=False, use_ocr=False
    )
    return [str(chunk.get("text", "")) for chunk in chunks]


@cache
def _markitdown_converter() -> Any:
    from markitdown import MarkItDown

    return MarkItDown(enable_plugins=False)


def _markitdown(path: Path) -> str | Timed:
    if path.suffix.lower() == ".pdf":
        return _markitdown_pages(path)
    return str(_markitdown_converter().convert(str(path)).text_content)


def _markitdown_pages(path: Path) -> Timed:
    """markitdown joins a PDF's pages with no mark between them, so each page is given to it
    as a one-page PDF (cut by pdfium, outside the timing)."""
    from markitdown import StreamInfo

    converter = _markitdown_converter()
    pages: Pages = []
    seconds = 0.0
    for data in single_pages(path):
        started = time.perf_counter()
        got = converter.convert_stream(io.BytesIO(data), stream_info=StreamInfo(extension=".pdf"))
        seconds += time.perf_counter() - started
        pages.append(str(got.text_content))
    return Timed(pages, seconds)


def single_pages(path: Path) -> list[bytes]:
    """Each page of a PDF as a PDF of its own."""
    import pypdfium2

    source = pypdfium2.PdfDocument(path)
    try:
        found: list[bytes] = []
        for index in range(len(source)):
            one = pypdfium2.PdfDocument.new()
            one.import_pages(source, [index])
            out = io.BytesIO()
            one.save(out)
            one.close()
            found.append(out.getvalue())
        return found
    finally:
        source.close()


def _unstructured(path: Path) -> Pages | str:
    from unstructured.partition.auto import partition

    pdf = path.suffix.lower() == ".pdf"
    elements = partition(filename=str(path), **({"strategy": "fast"} if pdf else {}))
    if not pdf:
        return "\n\n".join(str(element) for element in elements)
    pages: dict[int, list[str]] = {}
    for element in elements:
        pages.setdefault(element.metadata.page_number or 1, []).append(str(element))
    return ["\n\n".join(pages.get(n, [])) for n in range(1, max(pages, default=0) + 1)]


def _pypdfium2(path: Path) -> Pages:
    import pypdfium2

    document = pypdfium2.PdfDocument(path)
    try:
        pages: Pages = []
        for page in document:
            text_page = page.get_textpage()
            pages.append(text_page.get_text_range())
            text_page.close()
        return pages
    finally:
        document.close()


def _pdfplumber(path: Path) -> Pages:
    import pdfplumber

    with pdfplumber.open(path) as pdf:
        return [page.extract_text() or "" for page in pdf.pages]


@dataclass(frozen=True)
class Peer:
    read: Read
    suffixes: tuple[str, ...]  # the files it is given
    module: str = ""  # what must import for it to run ("": a program)
    distribution: str = ""  # whose version is reported


PEERS: dict[str, Peer] = {
    "pdftotext-layout": Peer(_pdftotext("-layout"), PDF),
    "pdftotext": Peer(_pdftotext(), PDF),
    "pymupdf4llm": Peer(_pymupdf4llm, PDF, "pymupdf4llm", "pymupdf4llm"),
    "pymupdf": Peer(_pymupdf, (".pdf", ".epub"), "pymupdf", "pymupdf"),
    "markitdown": Peer(_markitdown, EVERYTHING, "markitdown", "markitdown"),
    "unstructured": Peer(_unstructured, EVERYTHING, "unstructured.partition.auto", "unstructured"),
    "pypdfium2": Peer(_pypdfium2, PDF, "pypdfium2", "pypdfium2"),
    "pdfplumber": Peer(_pdfplumber, PDF, "pdfplumber", "pdfplumber"),
}
# unstructured classifies text with spaCy's English model, which it downloads from GitHub on
# first use when it is not installed (it is not on PyPI).
_SPACY_MODEL = "en_core_web_sm"


def availability(name: str) -> dict[str, str]:
    """{"version": ...} when the peer can run here, offline; else {"absent": why}."""
    peer = PEERS[name]
    if not peer.module:
        return _program_version()
    try:
        importlib.import_module(peer.module)
    except Exception as exc:  # an import error, or a missing native library
        return {"absent": f"{type(exc).__name__}: {exc}"[:300]}
    if name == "unstructured" and not _installed(_SPACY_MODEL):
        return {"absent": f"needs spaCy's {_SPACY_MODEL}, which it would download at run time"}
    return {"version": importlib.metadata.version(peer.distribution)}


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _program_version() -> dict[str, str]:
    if shutil.which("pdftotext") is None:
        return {"absent": "pdftotext is not installed (Debian: poppler-utils)"}
    done = subprocess.run(["pdftotext", "-v"], capture_output=True, text=True, check=False)
    first = (done.stderr or done.stdout).splitlines()[:1]
    return {"version": first[0].removeprefix("pdftotext version ").strip() if first else "?"}


def read_one(name: str, path: Path) -> dict[str, Any]:
    """One file's line: its pages or text and the seconds it took, or why it failed."""
    started = time.perf_counter()
    try:
        got = PEERS[name].read(path)
    except Exception as exc:  # a peer failing on a file is a result, not a crash
        return {"file": str(path), "error": f"{type(exc).__name__}: {exc}"[:500]}
    seconds = time.perf_counter() - started
    if isinstance(got, Timed):
        got, seconds = got.value, got.seconds
    return {
        "file": str(path),
        "pages" if isinstance(got, list) else "text": got,
        "seconds": seconds,
    }


def offline() -> None:
    """Cut the network for this process: a library that would download fails instead."""
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", DO_NOT_TRACK="true")
    os.environ.update(SCARF_NO_ANALYTICS="true", UNSTRUCTURED_DISABLE_NOTICE="1")
    connect = socket.socket.connect

    def refuse(self: socket.socket, address: Any) -> None:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            raise OSError("no network while benchmarking: nothing may download")
        connect(self, address)

    socket.socket.connect = refuse  # type: ignore[method-assign]


def json_out() -> TextIO:
    """Standard output for the JSON lines alone: what the libraries print, from Python or
    from C, goes to standard error from here on."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", nargs="?", choices=sorted(PEERS))
    parser.add_argument("files", nargs="*", type=Path)
    parser.add_argument("--list", action="store_true", help="which peers run here")
    args = parser.parse_args(argv)
    offline()
    out = json_out()
    if args.list or not args.peer:
        peers = {name: availability(name) for name in PEERS}
        formats = {name: list(peer.suffixes) for name, peer in PEERS.items()}
        print(json.dumps({"peers": peers, "formats": formats}), file=out, flush=True)
        return 0
    if args.files:
        read_one(args.peer, args.files[0])  # warm-up, untimed
    for path in args.files:
        print(json.dumps(read_one(args.peer, path)), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
