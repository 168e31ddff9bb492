"""OCR accuracy and speed: known text is drawn as scanned pages (Pillow, 300 dpi, an image-only
PDF), read back by the real loader (`ingest.loaders.load_bytes`, so in the parsing sandbox,
with tesseract), and compared with what was drawn.

The character error rate (CER) is the edit distance between the text read and the text drawn
over the drawn text's length, whitespace runs counted as one space; lines are first paired by
difflib, and the distance summed over the pairs (an upper bound of the whole page's distance,
which would be too slow to compute in Python). Target: CER <= 0.03.

    .venv/bin/python benchmarks/ocr.py                         # sentences from a fixed word list
    .venv/bin/python benchmarks/ocr.py --data ../shared/data/scifact --pages 30

The last line printed is JSON: {"pages": N, "cer": x, "seconds_per_page": y}.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest.loaders import DocumentLimits, load_bytes
from ragservice.types import LoadedDocument
from tests import corpus_pdf

_DPI = 300
_LINES_PER_PAGE = 30
_TEXT_WIDTH_POINTS = 6.27 * 72  # A4 less two 1-inch margins


def paragraphs(data: Path | None) -> Iterator[str]:
    """SciFact abstracts (corpus.jsonl) when `data` is given, else generated sentences."""
    if data is None:
        sentences = corpus_pdf.sentences(2000)
        for start in range(0, len(sentences), 5):
            yield " ".join(sentences[start : start + 5])
        return
    with (data / "corpus.jsonl").open(encoding="utf-8") as rows:
        for row in rows:
            text = str(json.loads(row).get("text", "")).strip()
            if text:
                yield text


def pages_of(texts: Iterator[str], count: int) -> list[list[str]]:
    """`count` pages of `_LINES_PER_PAGE` lines, each paragraph wrapped to the text width."""
    face = corpus_pdf.font(round(12 * _DPI / 72))
    width = _TEXT_WIDTH_POINTS * _DPI / 72
    lines: list[str] = []
    for text in texts:
        lines.extend(_wrap(text, face, width))
        lines.append("")
        if len(lines) >= count * _LINES_PER_PAGE:
            break
    pages = [lines[i : i + _LINES_PER_PAGE] for i in range(0, len(lines), _LINES_PER_PAGE)]
    return [page for page in pages[:count] if any(page)]


def _wrap(text: str, face: object, width: float) -> list[str]:
    out: list[str] = []
    line = ""
    for word in text.split():
        candidate = f"{line} {word}".strip()
        if line and face.getlength(candidate) > width:  # type: ignore[attr-defined]
            out.append(line)
            candidate = word
        line = candidate
    return [*out, line] if line else out


def distance(a: str, b: str) -> int:
    """Levenshtein distance."""
    previous = list(range(len(b) + 1))
    for i, char in enumerate(a, start=1):
        current = [i]
        for j, other in enumerate(b, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char != other))
            )
        previous = current
    return previous[-1]


def errors(read: str, drawn: list[str]) -> tuple[int, int]:
    """(edit distance, reference length) of a page, lines paired by difflib."""
    reference = [_normal(line) for line in drawn if line.strip()]
    got = [_normal(line) for line in read.splitlines() if line.strip()]
    total = 0
    matcher = difflib.SequenceMatcher(None, reference, got, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            total += distance(" ".join(reference[i1:i2]), " ".join(got[j1:j2]))
    # a space joins each pair of lines in both texts, so line breaks cost nothing
    return total, len(" ".join(reference))


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--data", type=Path, default=None, help="a BEIR folder (corpus.jsonl)")
    args = parser.parse_args()
    pages = pages_of(paragraphs(args.data), args.pages)
    pdf = corpus_pdf.scanned_pdf(pages, dpi=_DPI)
    limits = DocumentLimits(max_pages=len(pages), max_chars=10_000_000, ocr_page_seconds=60)
    started = time.perf_counter()
    (result,) = load_bytes("scan.pdf", pdf, limits=limits)
    seconds = time.perf_counter() - started
    if not isinstance(result, LoadedDocument):
        raise SystemExit(f"the scan was not read: {result.reason}")
    bounds = [*result.page_starts, len(result.text)]
    wrong = length = 0
    for number, drawn in enumerate(pages):
        read = result.text[bounds[number] : bounds[number + 1]]
        page_wrong, page_length = errors(read, drawn)
        wrong, length = wrong + page_wrong, length + page_length
        print(f"page {number + 1}: cer {page_wrong / max(page_length, 1):.4f}", file=sys.stderr)
    report = {
        "pages": len(pages),
        "cer": round(wrong / max(length, 1), 4),
        "seconds_per_page": round(seconds / len(pages), 2),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
