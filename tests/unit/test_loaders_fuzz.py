"""Fuzzing the loaders: valid-looking and broken files of every format, up to about 1 MiB.

Real documents (built as `test_loaders` and `tests/corpus_mail.py` build them) are mutated
(truncated, bytes flipped, inserted, deleted or duplicated, zip members corrupted or dropped),
and pathological ones are made from runs of small pieces (`#`, spaces, `*`, `<`, nested tags,
NULs, invalid UTF-8, deep JSON, long lines, mail headers and MIME boundaries, nested parts).
Every file goes through the public `load_bytes`, in the parsing sandbox, and must come back
cleanly (documents fit to store, or failures with a reason; never an exception) within the
parse limit plus a margin; an e-mail or a mailbox, whose embedded files are documents of their
own, within that per result.

The examples are derandomized, so every run (and CI) sees the same ones. More by hand:

    FUZZ_EXAMPLES=2000 .venv/bin/pytest tests/unit/test_loaders_fuzz.py

(`FUZZ_EXAMPLES` examples per format). The last test prints the slowest parse seen.
"""

from __future__ import annotations

import dataclasses
import html
import io
import json
import os
import time
import zipfile
from collections.abc import Callable
from typing import Any

import pytest
from fpdf import FPDF
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader, PdfWriter
from pypdf.generic import DecodedStreamObject

from ingest.loaders import DocumentLimits, load_bytes
from ragservice.types import LoadedDocument, LoadFailure
from tests import corpus_pdf
from tests.corpus_mail import (
    make_attachment_only_email,
    make_email,
    make_epub,
    make_html_email,
    make_mbox,
)
from tests.corpus_office import CSV_TEXT, RTF_TEXT, TSV_TEXT, make_deck, make_odt, make_workbook
from tests.pdfs import make_pdf
from tests.unit.test_loaders import make_docx

LIMITS = DocumentLimits(max_pages=50, max_chars=2_000_000, parse_seconds=10, parse_memory_mib=1024)
# Generous: a parse the sandbox stops at its limit, plus starting a fresh parser process.
# JSONL is read in this process, outside the sandbox, so for it this bound is the only one: 512 KiB
# of short lines that are not UTF-8 (each one through charset detection) takes 11-13 s.
TIME_BOUND = LIMITS.parse_seconds + 5
# Files whose embedded files (attachments, messages) are documents of their own.
CONTAINERS = (".eml", ".mbox")
MAX_BYTES = 2**20

_MORE = int(os.environ.get("FUZZ_EXAMPLES", "0"))


def fuzz(examples: int) -> Callable[[Any], Any]:
    """The profile: `examples` per format (or FUZZ_EXAMPLES), the same ones on every run."""
    return settings(
        max_examples=_MORE or examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# (seconds, file name, bytes) of every example, for the report at the end
TIMINGS: list[tuple[float, str, int]] = []


def check(
    name: str, data: bytes, limits: DocumentLimits = LIMITS, bound: float = TIME_BOUND
) -> None:
    """`load_bytes` gives clean results, one per file (per non-blank line for JSONL), in time."""
    started = time.perf_counter()
    results = list(load_bytes(name, data, limits=limits))
    seconds = time.perf_counter() - started
    TIMINGS.append((seconds, name, len(data)))
    if name.endswith(".jsonl"):
        assert len(results) == sum(1 for line in io.BytesIO(data) if line.strip())
    elif name.endswith(CONTAINERS):
        assert results  # the file's own document or failure, or only its embedded files'
        bound = bound * len(results)  # each embedded file is parsed on its own
    else:
        assert len(results) == 1
    for result in results:
        if isinstance(result, LoadFailure):
            assert result.reason.strip(), result
        else:
            assert isinstance(result, LoadedDocument), result
            assert result.text.strip()
            assert len(result.text) <= limits.max_chars
            for value in (result.text, result.title or "", result.external_id):
                assert "\x00" not in value
                value.encode("utf-8")  # no lone surrogates: PostgreSQL must accept it
    assert seconds < bound, f"{name} ({len(data)} bytes) took {seconds:.1f} s"


# --------------------------------------------------------------------------- building blocks


# Target sizes, 16 B to 1 MiB. Hypothesis draws the first choice most often (a third of the
# time) and otherwise spreads evenly: the first is a middle size, not the smallest.
sizes = st.sampled_from([2**10, *(2**exponent for exponent in range(4, 21) if exponent != 10)])

# How much of the room left a run fills: all of it, half, ... or one piece.
shares = st.sampled_from([1, 2, 4, 16, 256, 2**20])


def position(draw: st.DrawFn, length: int) -> int:
    """A place in `length` bytes, spread over all of it (plain integers crowd at the start)."""
    return min(length, length * draw(st.integers(0, 64)) // 64 + draw(st.integers(0, 63)))


@st.composite
def runs(draw: st.DrawFn, pieces: st.SearchStrategy[bytes], most: int = 8) -> bytes:
    """A few pieces, each repeated to fill a share of a size drawn from `sizes`."""
    size = draw(sizes)
    out = bytearray()
    for _ in range(draw(st.integers(1, most))):
        piece = draw(pieces) or b"x"
        room = size - len(out)
        if room <= 0:
            break
        out += piece * max(1, room // len(piece) // draw(shares))
    return bytes(out[:MAX_BYTES])


@st.composite
def mutated(draw: st.DrawFn, base: bytes, most: int = 4) -> bytes:
    """`base` truncated, with bytes flipped, inserted, deleted or spans duplicated."""
    data = bytearray(base)
    for _ in range(draw(st.integers(0, most))):
        at = position(draw, len(data))
        kind = draw(st.sampled_from(["flip", "insert", "duplicate", "delete", "truncate"]))
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16)) * draw(st.integers(1, 1000))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 4096))]
        elif kind == "duplicate":
            span = bytes(data[at : at + draw(st.integers(1, 4096))])
            data[at:at] = span * draw(st.integers(1, 64))
    return bytes(data[:MAX_BYTES])


TEXT_PIECES = [
    *(b"#", b"# ", b"#\t", b" ", b"\t", b"*", b"_", b"`", b"```\n", b"~~~\n", b"\n", b"\r\n"),
    *(b"\r", b"\x00", b"\xff", b"\x80", b"\xfe\xff", b"\xff\xfe", b"\xef\xbb\xbf", b"\xe2\x82"),
    *(b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"[", b"](", b"<", b">", b"|", b"-", b"=", b"\\"),
    *(b"\x1b[31m", b"\x0c", b"\x7f", "\u2028".encode(), "\u200b".encode(), "\ufeff".encode()),
    *("\u00e9t\u00e9 ".encode(), "\u00e9t\u00e9 ".encode("cp1252"), "\u65e5\u672c ".encode()),
    *("\u65e5\u672c ".encode("utf-16"), "\u65e5\u672c ".encode("shift_jis"), b"word ", b"a"),
]
text_pieces = st.one_of(st.sampled_from(TEXT_PIECES), st.binary(min_size=1, max_size=16))

HTML_PIECES = [
    *(b"<html>", b"<body>", b"</body>", b"<head>", b"<title>", b"</title>", b"<main>"),
    *(b"<article>", b"<header>", b"<nav>", b"<footer>", b"<aside>", b"<div>", b"</div>"),
    *(b"<p>", b"</p>", b"<span>", b"<b><i>", b"</b></i>", b"<ul>", b"<li>", b"</li>", b"<table>"),
    *(b"<tr>", b"<td>", b"<th>", b"</td>", b"<h1>", b"</h1>", b"<h6>", b"<pre>", b"</pre>"),
    *(b"<br>", b"<br/>", b"<script>", b"</script>", b"<style>", b"<svg>", b"<math>", b"<!--"),
    *(b"-->", b"<![CDATA[", b"]]>", b"<!DOCTYPE html>", b"<?xml version='1.0'?>", b"<", b"</"),
    *(b'<a href="', b'"', b"'", b"=", b">", b"&amp;", b"&#x", b"&#99999999;", b"&", b"&#0;"),
    *(b'<meta charset="', b"<meta charset=utf-16>", b"<meta charset=shift_jis>", b"<meta"),
    *(b"charset=", b"<template>", b"<frameset>", b"<select><option>", b"<textarea>", b"<x:y>"),
    *(b'<div role="navigation">', b'<p style="' + b"a" * 100, b"text ", b"\n"),
]
html_pieces = st.one_of(st.sampled_from(HTML_PIECES), text_pieces)

PDF_OPERATORS = [
    *(b"BT ", b"ET ", b"/F1 12 Tf ", b"/F9 0 Tf ", b"72 720 Td ", b"(text) Tj ", b"(", b")"),
    *(b"[(a) -120 (b)] TJ ", b"[", b"]", b"<<", b">>", b"q ", b"Q ", b"1 0 0 1 0 0 cm ", b"T* "),
    *(b"' ", b'" ', b"\\", b"99999999999999999999 ", b"-0.000001 ", b"1e308 ", b"<ffff> Tj "),
    *(b"<", b">", b"BI /W 1 /H 1 /BPC 8 /CS /G ID \x00 EI ", b"% comment\n", b"/Name ", b"\n"),
    *(b"0 Tr ", b"3 Tz ", b"12 TL ", b"1 0 0 -1 0 0 Tm ", b"Do ", b"/X0 Do ", b"BX ", b"EX "),
]
pdf_operators = st.one_of(st.sampled_from(PDF_OPERATORS), st.binary(min_size=1, max_size=16))
latin1 = st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=200)


# --------------------------------------------------------------------------- text and Markdown


@pytest.mark.parametrize("suffix", [".txt", ".md"])
@fuzz(60)
@given(data=st.one_of(runs(text_pieces), st.binary(max_size=4096)))
def test_text_and_markdown(suffix: str, data: bytes) -> None:
    check("fuzz" + suffix, data)


# --------------------------------------------------------------------------- HTML


@st.composite
def html_files(draw: st.DrawFn) -> bytes:
    page = b"<html><head><title>T</title></head><body><main><h1>Head</h1><p>Body</p></main>"
    page += b"<ul><li>one</li><li>two</li></ul><table><tr><td>a</td><td>b</td></tr></table>"
    page += b"<pre># code</pre><nav>menu</nav></body></html>"
    made = draw(st.one_of(runs(html_pieces, most=12), st.just(page), st.binary(max_size=4096)))
    return draw(mutated(made, most=3))


@fuzz(80)
@given(data=html_files())
def test_html(data: bytes) -> None:
    check("fuzz.html", data)


# --------------------------------------------------------------------------- PDF


def pdf_with_content(content: bytes, pages: int, compress: bool) -> bytes:
    """A PDF of `pages` pages that all draw one content stream (pypdf's writer)."""
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(make_pdf(["x"] * pages))))
    stream = DecodedStreamObject()
    stream.set_data(content)
    for page in writer.pages:
        page.replace_contents(stream)  # type: ignore[arg-type]
        if compress:
            page.compress_content_streams()
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


@st.composite
def laid_out_pdf(draw: st.DrawFn) -> bytes:
    """Words placed anywhere (columns, grids, overlaps, off the page), some lines drawn: the
    reading-order and table finders' input, read by pdfium or, with lines, pdfplumber."""
    pdf = FPDF(unit="pt")
    pdf.set_font("Helvetica", size=draw(st.sampled_from([4, 11, 30])))
    for _ in range(draw(st.integers(1, 2))):
        pdf.add_page()
        columns = draw(st.lists(st.integers(-50, 700), min_size=1, max_size=6))
        rows = draw(st.integers(1, 60))
        word = draw(st.sampled_from(["a", "word", "1.", "-", "long-sentence-part", "x y z"]))
        for row in range(rows):
            for x in columns:
                pdf.text(x, 40 + row * draw(st.sampled_from([0, 3, 14, 40])), word)
        for _ in range(draw(st.integers(0, 8))):
            x, y = draw(st.integers(0, 600)), draw(st.integers(0, 800))
            pdf.line(x, y, x + draw(st.integers(0, 300)), y + draw(st.integers(0, 300)))
    return bytes(pdf.output())


@st.composite
def pdf_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["plain", "content", "noise", "layout"]))
    if kind == "layout":
        made = draw(laid_out_pdf())
    elif kind == "plain":
        pages = draw(st.lists(latin1, min_size=1, max_size=5))
        made = make_pdf(pages, draw(st.none() | latin1))
    elif kind == "content":
        content = draw(runs(pdf_operators, most=12))[: 256 * 2**10]
        made = pdf_with_content(content, draw(st.integers(1, 60)), draw(st.booleans()))
    else:
        made = b"%PDF-1." + draw(st.binary(max_size=4096))
    return draw(mutated(made))


@fuzz(60)
@given(data=pdf_files())
def test_pdf(data: bytes) -> None:
    check("fuzz.pdf", data)


# --------------------------------------------------------------------------- DOCX


DOCX_PIECES = [
    *(b"<w:p><w:r><w:t>word</w:t></w:r></w:p>", b"<w:r><w:t>x</w:t></w:r>", b"<w:p>", b"</w:p>"),
    *(b"<w:tbl><w:tr><w:tc><w:p/></w:tc></w:tr></w:tbl>", b'<w:pStyle w:val="Heading1"/>'),
]


def rezip(members: dict[str, bytes], compression: int) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression) as archive:
        for name, body in members.items():
            archive.writestr(name, body)
    return out.getvalue()


@st.composite
def docx_files(draw: st.DrawFn) -> bytes:
    title = draw(st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "Zs"])))
    made = make_docx(title[:50])
    if draw(st.booleans()):  # corrupt one member, or the document's body, and zip it again
        with zipfile.ZipFile(io.BytesIO(made)) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        name = draw(st.sampled_from(sorted(members)))
        body = members["word/document.xml"]
        head, _, tail = body.partition(b"<w:body>")
        change = draw(st.sampled_from(["drop", "garbage", "mutate", "paragraphs", "nested"]))
        if change == "drop":
            del members[name]
        elif change == "garbage":
            members[name] = draw(runs(text_pieces))
        elif change == "mutate":
            members[name] = draw(mutated(members[name]))
        elif change == "paragraphs":  # a long body: many paragraphs, runs and table cells
            piece = st.sampled_from(DOCX_PIECES)
            members["word/document.xml"] = head + b"<w:body>" + draw(runs(piece)) + tail
        else:  # nested elements, deeper than any parser recurses
            depth = draw(st.integers(1, 100_000))
            nested = b"<w:tbl><w:tr><w:tc>" * depth + b"</w:tc></w:tr></w:tbl>" * depth
            members["word/document.xml"] = head + b"<w:body>" + nested + tail
        stored = draw(st.booleans())
        made = rezip(members, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return draw(mutated(made, most=2))


@fuzz(50)
@given(data=docx_files())
def test_docx(data: bytes) -> None:
    check("fuzz.docx", data)


# --------------------------------------------------------------------------- PPTX, XLSX, ODT

# (the format's generated file, the member that holds its body, where pieces go, the pieces,
# and an element to nest deeper than any parser recurses)
OFFICE: dict[str, tuple[bytes, str, bytes, list[bytes], bytes, bytes]] = {
    ".pptx": (
        make_deck(),
        "ppt/slides/slide2.xml",
        b"<a:lstStyle/>",
        [
            *(b"<a:p><a:r><a:t>word</a:t></a:r></a:p>", b'<a:p><a:pPr lvl="8"/>', b"</a:p>"),
            *(b'<a:buChar char="-"/>', b"<a:buNone/>", b"<a:r><a:t>", b"</a:t></a:r>"),
        ],
        b"<p:grpSp>",
        b"</p:grpSp>",
    ),
    ".xlsx": (
        make_workbook(),
        "xl/worksheets/sheet2.xml",
        b"<sheetData>",
        [
            b'<row r="5"><c r="A5" t="inlineStr"><is><t>x</t></is></c></row>',
            *(b'<row r="1048576">', b'<c r="XFD1"><v>1</v></c>', b"</row>", b"<row>"),
            *(b'<c r="A1" t="s"><v>999</v></c>', b'<c t="d"><v>garbage</v></c>', b"<c>"),
            *(b'<c r="B2" t="e"><v>#N/A</v></c>', b'<c r="C3" t="b"><v>2</v></c>', b"</c>"),
        ],
        b"<row><c><is>",
        b"</is></c></row>",
    ),
    ".odt": (
        make_odt(),
        "content.xml",
        b"<office:text>",
        [
            *(b"<text:p>word</text:p>", b'<text:h text:outline-level="99">h</text:h>'),
            *(b'<text:s text:c="999999999"/>', b"<text:list><text:list-item>", b"<text:p>"),
            b'<table:table><table:table-row><table:table-cell table:number-columns-repeated="'
            b'1000000"><text:p>x</text:p></table:table-cell></table:table-row></table:table>',
            *(b"<office:annotation><text:p>c</text:p></office:annotation>", b"</text:p>"),
        ],
        b"<text:section>",
        b"</text:section>",
    ),
}


@st.composite
def office_files(draw: st.DrawFn, suffix: str) -> bytes:
    made, body_name, marker, pieces, opening, closing = OFFICE[suffix]
    if draw(st.booleans()):  # corrupt one member, or the body, and zip it again
        with zipfile.ZipFile(io.BytesIO(made)) as archive:
            members = {name: archive.read(name) for name in archive.namelist()}
        name = draw(st.sampled_from(sorted(members)))
        head, _, tail = members[body_name].partition(marker)
        change = draw(st.sampled_from(["drop", "garbage", "mutate", "pieces", "nested"]))
        if change == "drop":
            del members[name]
        elif change == "garbage":
            members[name] = draw(runs(text_pieces))
        elif change == "mutate":
            members[name] = draw(mutated(members[name]))
        elif change == "pieces":
            members[body_name] = head + marker + draw(runs(st.sampled_from(pieces))) + tail
        else:
            depth = draw(st.integers(1, 100_000))
            members[body_name] = head + marker + opening * depth + closing * depth + tail
        stored = draw(st.booleans())
        made = rezip(members, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return draw(mutated(made, most=2))


@pytest.mark.parametrize("suffix", sorted(OFFICE))
@fuzz(30)
@given(data=st.data())
def test_office(suffix: str, data: st.DataObject) -> None:
    check("fuzz" + suffix, data.draw(office_files(suffix)))


# --------------------------------------------------------------------------- CSV, TSV, RTF

TABLE_PIECES = [b",", b";", b"\t", b"|", b'"', b'""', b"\n", b"\r\n", b"\r", b"a", b"1 ", b"\x00"]
table_pieces = st.one_of(st.sampled_from(TABLE_PIECES), text_pieces)

RTF_PIECES = [
    *(b"{\\rtf1 ", b"{", b"}", b"\\par ", b"\\'e9", b"\\'zz", b"\\u8364?", b"\\u-1?"),
    *(b"\\bin9 ", b"{\\*\\", b"{\\fonttbl{\\f0 x;}}", b"{\\info{\\title ", b"\\", b"word "),
    *(b"\\ansicpg1252 ", b"\\ansicpg99999 ", b"\\uc0 ", b"\\b0 ", b"\\~", b"\\\n"),
]


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
@fuzz(30)
@given(data=st.data())
def test_csv_and_tsv(suffix: str, data: st.DataObject) -> None:
    base = (CSV_TEXT if suffix == ".csv" else TSV_TEXT).encode()
    made = data.draw(st.one_of(runs(table_pieces), mutated(base), st.binary(max_size=4096)))
    check("fuzz" + suffix, made)


@fuzz(40)
@given(
    data=st.one_of(
        runs(st.one_of(st.sampled_from(RTF_PIECES), text_pieces)).map(lambda b: b"{\\rtf1 " + b),
        mutated(RTF_TEXT.encode()),
        st.binary(max_size=4096),
    )
)
def test_rtf(data: bytes) -> None:
    check("fuzz.rtf", data)


# --------------------------------------------------------------------------- images, scans (OCR)

# A few small frames, and a short OCR allowance, so each example stays quick: the bound adds
# every page's allowance, as the sandbox does. Without tesseract these are clean failures.
OCR_LIMITS = dataclasses.replace(LIMITS, max_pages=3, ocr_page_seconds=5)
OCR_TIME_BOUND = TIME_BOUND + OCR_LIMITS.max_pages * OCR_LIMITS.ocr_page_seconds


def small_image(lines: list[str], image_format: str, frames: int) -> bytes:
    images = [corpus_pdf.text_image(lines, dpi=100) for _ in range(frames)]
    out = io.BytesIO()
    more = {"save_all": True, "append_images": images[1:]} if image_format == "TIFF" else {}
    images[0].save(out, image_format, **more)
    return out.getvalue()


# Printable ASCII only: the drawing of the text is the fixture, not what is fuzzed.
drawn_words = st.text(st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=20)


@st.composite
def image_files(draw: st.DrawFn) -> tuple[str, bytes]:
    image_format = draw(st.sampled_from(["PNG", "JPEG", "TIFF"]))
    lines = draw(st.lists(drawn_words, min_size=1, max_size=2))
    frames = draw(st.integers(1, 2)) if image_format == "TIFF" else 1
    made = small_image(lines, image_format, frames)
    suffix = {"PNG": ".png", "JPEG": ".jpg", "TIFF": ".tiff"}[image_format]
    return suffix, draw(st.one_of(mutated(made, most=2), st.binary(max_size=2048)))


@fuzz(25)
@given(file=image_files())
def test_images(file: tuple[str, bytes]) -> None:
    suffix, data = file
    check("fuzz" + suffix, data, OCR_LIMITS, OCR_TIME_BOUND)


@fuzz(15)
@given(lines=st.lists(drawn_words, min_size=1, max_size=2), cuts=st.integers(0, 2), data=st.data())
def test_scanned_pdf(lines: list[str], cuts: int, data: st.DataObject) -> None:
    made = corpus_pdf.scanned_pdf([lines], dpi=100)
    check("scan.pdf", data.draw(mutated(made, most=cuts)), OCR_LIMITS, OCR_TIME_BOUND)


# --------------------------------------------------------------------------- JSONL

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=40))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@st.composite
def jsonl_lines(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["row", "truncated", "deep", "odd", "noise"]))
    row: dict[str, Any] = {
        "_id": draw(st.one_of(st.text(min_size=1, max_size=40), st.integers(), json_values)),
        "title": draw(st.one_of(st.text(max_size=40), json_values)),
        "text": draw(st.one_of(st.text(max_size=200), json_values)),
    }
    if draw(st.booleans()):
        row["metadata"] = draw(json_values)
    line = json.dumps(row, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    if kind == "truncated":
        line = line[: position(draw, len(line))]
    elif kind == "deep":
        depth = draw(st.integers(1, 200_000))
        nested = b"[" * depth + b"]" * depth
        line = b'{"_id": "d", "text": "t", "metadata": {"a": ' + nested + b"}}"
    elif kind == "odd":
        line = draw(
            st.sampled_from(
                [
                    b'{"_id": "n", "text": "\\u0000 nul \\ud800 lone"}',
                    b'{"_id": "big", "text": "t", "n": ' + b"9" * 5000 + b"}",
                    b'{"_id": "inf", "text": "t", "n": 1e999, "m": NaN, "o": -Infinity}',
                    b'{"_id": "dup", "_id": "dup2", "text": "a", "text": "b"}',
                    b'{"_id": "' + b"i" * 2000 + b'", "text": "long id"}',
                    b'{"_id": "bad", "text": "\xff\xfe invalid \x80 utf-8"}',
                    b'\xef\xbb\xbf{"_id": "bom", "text": "after a BOM"}',
                    b'{"_id": "long", "text": "' + b"a" * 100_000 + b'"}',
                    b"[1, 2, 3]",
                    b'"a string"',
                    b"null",
                    b"{",
                ]
            )
        )
    elif kind == "noise":
        line = draw(runs(text_pieces))
    return line


@st.composite
def jsonl_files(draw: st.DrawFn) -> bytes:
    size = draw(sizes)
    out = bytearray()
    for _ in range(draw(st.integers(1, 8))):
        line = draw(jsonl_lines()) + draw(st.sampled_from([b"\n", b"\r\n", b"\n\n", b""]))
        room = size - len(out)
        if room <= 0:
            break
        out += line * max(1, room // max(len(line), 1) // draw(shares))
    return bytes(out[:MAX_BYTES])


@fuzz(60)
@given(data=jsonl_files())
def test_jsonl(data: bytes) -> None:
    check("fuzz.jsonl", data)


# --------------------------------------------------------------------------- EPUB


def members_of(archive_bytes: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(archive_bytes)) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


words = st.text(st.characters(codec="utf-8", categories=["L", "N", "P", "Zs"]), max_size=80)


@st.composite
def epub_files(draw: st.DrawFn) -> bytes:
    chapters = [
        (f"chap_{i}.xhtml", draw(words), f"<p>{html.escape(draw(words))}</p>")
        for i in range(draw(st.integers(1, 4)))
    ]
    made = make_epub(chapters, title=draw(words) or "T")
    if draw(st.booleans()):  # corrupt one member (a chapter, the package, the nav) and rezip
        members = members_of(made)
        name = draw(st.sampled_from(sorted(members)))
        change = draw(st.sampled_from(["drop", "garbage", "mutate", "html", "nested"]))
        if change == "drop":
            del members[name]
        elif change == "garbage":
            members[name] = draw(runs(text_pieces))
        elif change == "mutate":
            members[name] = draw(mutated(members[name]))
        elif change == "html":
            members[name] = draw(runs(html_pieces, most=12))
        else:  # nested elements, deeper than any parser recurses
            depth = draw(st.integers(1, 100_000))
            members[name] = b"<div>" * depth + b"x" + b"</div>" * depth
        stored = draw(st.booleans())
        made = rezip(members, zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED)
    return draw(mutated(made, most=2))


@fuzz(40)
@given(data=epub_files())
def test_epub(data: bytes) -> None:
    check("fuzz.epub", data)


# --------------------------------------------------------------------------- e-mail and mbox

EMAIL_PIECES = [
    *(b"From: ", b"To: ", b"Cc: ", b"Subject: ", b"Date: ", b"Message-ID: ", b"\n", b"\r\n"),
    *(b"=?utf-8?q?caf=C3=A9?=", b"=?x-unknown?b?", b"=?", b"?=", b"<", b">", b",", b":", b'"'),
    *(b"Content-Type: multipart/mixed; boundary=b\n\n", b"--b\n", b"--b--\n", b" ", b"\t"),
    *(b"Content-Type: text/plain; charset=x-none\n", b"Content-Type: text/html\n", b"<h1>"),
    *(b"Content-Transfer-Encoding: base64\n", b"Content-Transfer-Encoding: quoted-printable\n"),
    *(b"Content-Disposition: attachment; filename=", b"filename*=utf-8''%C3%A9.txt", b"a.pdf"),
    *(b"Content-Type: message/rfc822\n\n", b"=\n", b"=ZZ", b"QUJD", b"body text "),
]
email_pieces = st.one_of(st.sampled_from(EMAIL_PIECES), text_pieces)
MAIL_BYTES = 16 * 2**10  # many tiny attachments or messages: each is parsed on its own


@st.composite
def email_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["real", "pieces", "nested"]))
    if kind == "real":
        subject = draw(words)
        made = draw(
            st.sampled_from(
                [make_email(subject or "s"), make_html_email(), make_attachment_only_email()]
            )
        )
    elif kind == "pieces":
        made = draw(runs(email_pieces, most=12))[:MAIL_BYTES]
    else:  # multiparts or attached messages inside each other, deeper than parsers recurse
        depth = draw(st.integers(1, 5_000))
        layer = draw(
            st.sampled_from(
                [
                    b"Content-Type: multipart/mixed; boundary=b\n\n--b\n",
                    b"Content-Type: message/rfc822\n\n",
                ]
            )
        )
        made = b"Subject: deep\n" + layer * depth + b"\ntext\n"
    return draw(mutated(made, most=3))


@fuzz(50)
@given(data=email_files())
def test_email(data: bytes) -> None:
    check("fuzz.eml", data)


@st.composite
def mbox_files(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["real", "pieces", "one"]))
    if kind == "real":
        made = make_mbox(draw(st.lists(words, min_size=1, max_size=4)))
    elif kind == "pieces":
        pieces = st.one_of(st.sampled_from([b"From ", b">From ", b"From a b\n"]), email_pieces)
        made = b"From x\n" + draw(runs(pieces, most=12))[:MAIL_BYTES]
    else:
        made = b"From x\n" + draw(email_files())[:MAIL_BYTES]
    return draw(mutated(made, most=3))


@fuzz(40)
@given(data=mbox_files())
def test_mbox(data: bytes) -> None:
    check("fuzz.mbox", data)


# --------------------------------------------------------------------------- any bytes, any name

ANY_SUFFIXES = [".txt", ".md", ".html", ".pdf", ".docx", ".jsonl", ".pptx", ".xlsx", ".csv"]
ANY_SUFFIXES += [".tsv", ".odt", ".rtf", ".epub", ".eml", ".mbox", ".png", ".tif"]


@fuzz(30)
@given(
    suffix=st.sampled_from(ANY_SUFFIXES),
    data=st.one_of(st.binary(max_size=4096), runs(text_pieces)),
)
def test_any_bytes_under_any_supported_name(suffix: str, data: bytes) -> None:
    check("any" + suffix, data)


def test_report_the_slowest_parse(capsys: pytest.CaptureFixture[str], record_property: Any) -> None:
    """Runs last (file order): prints the slowest example whatever pytest captures."""
    if not TIMINGS:
        pytest.skip("no fuzz example ran")
    seconds, name, size = max(TIMINGS)
    record_property("fuzz_examples", len(TIMINGS))
    record_property("slowest_parse_seconds", round(seconds, 3))
    with capsys.disabled():
        print(
            f"\nloader fuzz: {len(TIMINGS)} examples; slowest parse: {seconds:.2f} s "
            f"({name.rpartition('.')[2]}, {size} bytes)"
        )
