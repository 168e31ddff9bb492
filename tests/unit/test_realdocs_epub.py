"""The EPUB loader on real books nobody here wrote (tests/realdocs/epub: made by calibre, DocBook,
ConTeXt, SiSU and Sphinx): every book is accepted and read whole, as a tolerant reader reads
it. Where no book in the corpus shows a quirk (a percent-encoded href, a UTF-8 name stored
without the zip's UTF-8 flag, no `META-INF/container.xml`), a real book with that one change
shows it."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from functools import cache

import pytest

from ingest.loaders.epub_files import parse_epub
from ingest.loaders.parsing import ParseError
from ragservice.limits.documents import DocumentLimits
from tests.realdocs.fidelity.epub import EPUB_FOLDER, epub_names, fidelity, reference_text
from tests.realdocs.fidelity.words import word_score, words

LIMITS = DocumentLimits(max_pages=2000, max_chars=50_000_000)
MIN_RECALL = 0.95
QUICK_START = "calibre-quick-start.epub"  # EPUB 2: package at the root, text/*.xhtml, an NCX
TASK = "text/task_1_organizing.xhtml"


@cache
def text_of(name: str) -> str:
    return parse_epub((EPUB_FOLDER / name).read_bytes(), LIMITS).text


def rezipped(
    data: bytes,
    *,
    rename: Callable[[str], str] = lambda name: name,
    package: Callable[[str], str] = lambda text: text,
) -> bytes:
    """The book with its members renamed and its package document (`content.opf`) edited."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as book, zipfile.ZipFile(out, "w") as copy:
        for info in book.infolist():
            content = book.read(info)
            if info.filename.endswith("content.opf"):
                content = package(content.decode("utf-8")).encode("utf-8")
            info = zipfile.ZipInfo(rename(info.filename), info.date_time)
            copy.writestr(info, content, zipfile.ZIP_DEFLATED)
    return out.getvalue()


def without_utf8_flag(data: bytes, placeholder: str, name: str) -> bytes:
    """The archive with the ASCII member name `placeholder` replaced by `name`'s UTF-8 bytes
    (as long), the flag that says a name is UTF-8 left unset: zipfile sets it for any name it
    writes that is not ASCII, and tools that leave it out (Publican) abound."""
    raw = name.encode("utf-8")
    assert len(raw) == len(placeholder) and data.count(placeholder.encode()) == 2
    return data.replace(placeholder.encode(), raw)


@pytest.mark.parametrize("name", epub_names())
def test_every_book_is_accepted_and_read_whole(name: str) -> None:
    data = (EPUB_FOLDER / name).read_bytes()
    reference, _reader = reference_text(data)
    score = word_score(words(text_of(name)), words(reference))
    assert score.recall >= MIN_RECALL, (name, score)
    assert score.precision >= MIN_RECALL, (name, score)


def test_manifest_hrefs_with_fragments_name_each_file_once() -> None:
    """SiSU's manifest and spine name `about-manual.xhtml` seven times (`#o8`, `#o12`, …)."""
    text = text_of("sisu-live-manual.epub")
    assert text.count("While we believe that everything in this manual is important") == 1
    assert text.count("We encourage you to return to more in-depth study of the manual") == 1
    parsed = parse_epub((EPUB_FOLDER / "sisu-live-manual.epub").read_bytes(), LIMITS)
    assert parsed.title == "Live Systems Manual"
    assert parsed.metadata["chapters"] == 47


def test_a_manifest_naming_files_not_in_the_archive_is_read() -> None:
    """ConTeXt's manifest names two images it never put in the archive."""
    parsed = parse_epub((EPUB_FOLDER / "context-epub-mkiv-demo.epub").read_bytes(), LIMITS)
    assert "Figure\n\n2\n\nSecond" in parsed.text  # and no soft hyphens in the words
    assert (parsed.title, parsed.metadata["author"]) == ("epub-mkiv-demo", "context mkiv")


def test_footnotes_in_asides_are_kept() -> None:
    text = text_of("sphinx-developers-reference.epub")
    assert "people who don't want to read vacation notices" in text


def test_chapters_without_a_heading_take_their_title_from_the_ncx() -> None:
    data = (EPUB_FOLDER / QUICK_START).read_bytes()
    with zipfile.ZipFile(io.BytesIO(data)) as book:
        chapter = book.read(TASK).decode("utf-8")
    heading = '<h2 class="center" id="task1">Task 1: Organizing</h2>'
    assert heading in chapter
    headless = chapter.replace(heading, "")
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as book, zipfile.ZipFile(out, "w") as copy:
        for info in book.infolist():
            copy.writestr(info, headless if info.filename == TASK else book.read(info))
    text = parse_epub(out.getvalue(), LIMITS).text
    assert "\n\n# Task 1: Organizing\n\nThe first part of organizing is getting" in text


@pytest.mark.parametrize(
    ("rename", "href"),
    [
        ("text/task 1 organizing.xhtml", "text/task%201%20organizing.xhtml"),
        ("text/tâche 1.xhtml", "text/t%C3%A2che%201.xhtml"),
        ("text/Task_1_Organizing.xhtml", TASK),  # a name's case changed on the way
    ],
    ids=["percent-encoded", "utf8-percent-encoded", "case"],
)
def test_an_href_is_read_as_a_tolerant_reader_reads_it(rename: str, href: str) -> None:
    data = (EPUB_FOLDER / QUICK_START).read_bytes()
    changed = rezipped(
        data,
        rename=lambda name: rename if name == TASK else name,
        package=lambda opf: opf.replace(f'href="{TASK}"', f'href="{href}"'),
    )
    assert parse_epub(changed, LIMITS).text == text_of(QUICK_START)


def test_a_utf8_name_stored_without_its_flag_is_found() -> None:
    """zipfile reads such a name as cp437 ("t├óche"); the package names it in UTF-8."""
    data = (EPUB_FOLDER / QUICK_START).read_bytes()
    placeholder, name = "text/tXXche 1.xhtml", "text/t\u00e2che 1.xhtml"
    changed = rezipped(
        data,
        rename=lambda member: placeholder if member == TASK else member,
        package=lambda opf: opf.replace(f'href="{TASK}"', f'href="{name}"'),
    )
    raw = without_utf8_flag(changed, placeholder, name)
    with zipfile.ZipFile(io.BytesIO(raw)) as book:
        assert name.encode("utf-8").decode("cp437") in book.namelist()
    assert parse_epub(raw, LIMITS).text == text_of(QUICK_START)


def test_a_book_without_a_container_is_read_by_its_one_package_document() -> None:
    """Debian Edu's manuals pack everything in a folder `epub/`, the container too."""
    data = (EPUB_FOLDER / QUICK_START).read_bytes()
    assert parse_epub(rezipped(data, rename=lambda name: f"epub/{name}"), LIMITS).text == (
        text_of(QUICK_START)
    )


def test_a_spine_whose_files_are_all_missing_is_refused() -> None:
    data = (EPUB_FOLDER / QUICK_START).read_bytes()
    gone = rezipped(data, rename=lambda name: name.replace("text/", "gone/"))
    with pytest.raises(ParseError, match="none of the spine's documents is in the archive"):
        parse_epub(gone, LIMITS)


def test_the_summary_over_the_corpus() -> None:
    rows, summary = fidelity()
    assert summary["files"] == len(rows) >= 3
    assert summary["accepted"] == summary["files"]  # ebooklib itself refuses two
    assert summary["ebooklib_accepts"] < summary["files"]
    assert summary["lowest_recall"] >= MIN_RECALL


ANSWERS = {
    "epub-calibre-1": "Click the \u2018Send to device\u2019 button in the top tool bar.",
    "epub-docbook-1": "cxxtestgen --error-printer -o runner.cpp MyTestSuite1.h",
    "epub-context-1": "there is no default/fallback css loaded",
    "epub-sisu-1": "\\# apt-get install live-build",
    "epub-sisu-2": "install qemu, in which case the program name is qemu instead of kvm",
    "epub-sphinx-1": "with [VAC] prepended to the subject of your message",
    "epub-sphinx-2": "5.11.1. When and how to do an NMU",
    "epub-calibre-convert-1": "A: Take a look at SNMPTT-GUI.",
}
"""Where each question's answer is: words the loader's text of its book must hold."""


def test_every_question_is_answered_by_its_book() -> None:
    lines = (EPUB_FOLDER / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line) for line in lines]
    assert len({q["id"] for q in questions}) == len(questions) == len(ANSWERS)
    for question in questions:
        folder, name = question["file"].split("/")
        assert folder == "epub" and name in epub_names() and question["question"].strip()
        assert ANSWERS[question["id"]] in text_of(name), question["id"]
