"""The HTML loader on real pages nobody here wrote (tests/realdocs/html: Sphinx in three
themes, MkDocs in two, Javadoc, Doxygen, DocBook, texi2html, makeinfo, AsciiDoc, a page written
by hand): every word trafilatura finds to be the main text is kept, permalinks and navigation
are not, and no line of text becomes a heading."""

from __future__ import annotations

import json
import re
from functools import cache

import lxml.html
import pytest

from ingest.loaders.html_files import parse_html
from ragservice.limits.documents import DocumentLimits
from tests.realdocs.fidelity.html import (
    HTML_FOLDER,
    fidelity,
    html_names,
    permalink_anchors,
    trafilatura_text,
    visible_text,
)
from tests.realdocs.fidelity.words import word_score, words

LIMITS = DocumentLimits(max_pages=2000, max_chars=50_000_000)
MIN_RECALL = 0.95
NAVIGATION = {
    "sphinx-python-sorting.html": ["Previous topic", "Report a Bug", "Socket Programming HOWTO"],
    "sphinx-python-secrets.html": ["Next topic", "Show Source", "Generic Operating System"],
    "sphinx-rtd-csvkit-tricks.html": ["View page source", "Release process", "Changelog"],
    "sphinx-alabaster-jansson-tutorial.html": ["Upgrading from 1.x", "Powered by Sphinx"],
    "mkdocs-writing-your-docs.html": ["Edit on GitHub", "Getting Started", "Developer Guide"],
    "mkdocs-rtd-typer-prompt.html": ["Printing and Colors", "Required CLI Options"],
    "javadoc-commons-lang3-charsetutils.html": ["Skip navigation links", "All rights reserved"],
    "doxygen-jsoncpp-reader.html": ["JsonCpp project page", "Generated on"],
    "docbook-debian-reference-i18n.html": ["Chapter 7. GUI System", "Chapter 9. System tips"],
    "texi2html-gettext-template.html": ["[Top]", "[Contents]", "[Index]"],
    "asciidoc-gittutorial.html": ["Last updated"],
}
"""What each page's generator puts around the text (its menus, sidebars, footers), as the page
shows it; none of it is in the main text."""
_HEADING = re.compile(r"^(#{1,6}) (.*)$")
_FENCE = re.compile(r"^```")


@cache
def text_of(name: str) -> str:
    return parse_html((HTML_FOLDER / name).read_bytes(), LIMITS).text


def page_headings(name: str) -> set[str]:
    root = lxml.html.document_fromstring((HTML_FOLDER / name).read_bytes())
    found = root.iter("h1", "h2", "h3", "h4", "h5", "h6")
    return {" ".join(words(h.text_content())) for h in found}


def our_headings(text: str) -> list[str]:
    """The Markdown headings of `text`, code blocks left out."""
    headings: list[str] = []
    in_code = False
    for line in text.splitlines():
        if _FENCE.match(line):
            in_code = not in_code
        elif not in_code and (match := _HEADING.match(line)):
            headings.append(match[2])
    return headings


def test_the_corpus_has_the_generators_it_claims() -> None:
    assert len(html_names()) >= 10
    assert set(NAVIGATION) <= set(html_names())


@pytest.mark.parametrize("name", html_names())
def test_every_word_trafilatura_keeps_is_kept(name: str) -> None:
    data = (HTML_FOLDER / name).read_bytes()
    score = word_score(words(text_of(name)), words(trafilatura_text(data, as_the_loader=True)))
    assert score.recall >= MIN_RECALL, (name, score)


@pytest.mark.parametrize("name", html_names())
def test_no_permalink_sign_is_kept(name: str) -> None:
    data = (HTML_FOLDER / name).read_bytes()
    text = text_of(name)
    anchors = permalink_anchors(data)
    # A "¶" the page writes in its text (MkDocs' page on permalinks does) is its text.
    assert text.count("\u00b6") == visible_text(data).count("\u00b6") - anchors["\u00b6"]
    assert all(sign not in text for sign in anchors if sign not in "#")
    assert not [h for h in our_headings(text) if h.rstrip().endswith(tuple(anchors))]


@pytest.mark.parametrize("name", sorted(NAVIGATION))
def test_navigation_is_kept_out(name: str) -> None:
    text = text_of(name)
    page = " ".join(visible_text((HTML_FOLDER / name).read_bytes()).split())
    for phrase in NAVIGATION[name]:
        assert phrase in page, phrase  # the page shows it ...
        assert phrase not in text, phrase  # ... beside its main text


@pytest.mark.parametrize("name", html_names())
def test_every_heading_is_one_of_the_pages_headings(name: str) -> None:
    """No line of text turns into a Markdown heading ("#include" in Doxygen's prose)."""
    headings = page_headings(name)
    assert [h for h in our_headings(text_of(name)) if " ".join(words(h)) not in headings] == []


def test_a_line_starting_with_a_hash_is_escaped() -> None:
    assert "\n\\#include <json/reader.h>\n" in text_of("doxygen-jsoncpp-reader.html")
    assert "\n\\#ThreadSafe#\n" in text_of("javadoc-commons-lang3-charsetutils.html")


def test_terms_definitions_and_wrapped_headings_are_kept() -> None:
    """What trafilatura drops beside the text it keeps: texi2html's option names (`dt`),
    Doxygen's notes (`dd`) and signatures, DocBook's headings in three `div`s, makeinfo's
    nanorc settings (`dt`)."""
    gettext = text_of("texi2html-gettext-template.html")
    quoted = "\u2018-f file\u2019\n\n\u2018--files-from=file\u2019\n\n"  # in curly quotes
    assert quoted + "Read the names of the input files" in gettext
    doxygen = text_of("doxygen-jsoncpp-reader.html")
    assert "Deprecated:\n\nUse CharReader and CharReaderBuilder." in doxygen
    assert "Json::Reader::Reader | ( | const Features & | features | )" in doxygen
    docbook = text_of("docbook-debian-reference-i18n.html")
    assert "\n## 8.1. The locale\n" in docbook
    assert "\n### 8.2.3. The input method support with IBus\n" in docbook
    assert "\nset jumpyscrolling\n\nScroll the buffer" in text_of("makeinfo-nano-manual.html")


def test_a_paragraph_the_source_wraps_is_kept() -> None:
    """Sphinx writes a paragraph over several lines of the page's source, and trafilatura keeps
    those line breaks: its text read line by line matched none of the paragraph."""
    text = text_of("sphinx-python-sorting.html")
    assert (
        "Python lists have a built-in list.sort() method that modifies the list in-place. "
        "There is also a sorted() built-in function that builds a new sorted list from an "
        "iterable." in text
    )


def test_the_summary_over_the_corpus() -> None:
    rows, summary = fidelity(names=["sphinx-python-secrets.html", "mkdocs-writing-your-docs.html"])
    assert [row["file"] for row in rows] == [
        "sphinx-python-secrets.html",
        "mkdocs-writing-your-docs.html",
    ]
    assert summary["recall_trafilatura"] >= MIN_RECALL
    assert summary["permalink_signs_kept"] == 0
    assert summary["navigation_words_kept_share"] <= 0.05
    assert 0 < summary["recall_visible"] < 1


ANSWERS = {
    "html-sphinx-1": "key=str.lower",
    "html-sphinx-2": "Sorts are guaranteed to be stable.",
    "html-sphinx-3": "32 bytes (256 bits) of randomness is sufficient",
    "html-sphinx-rtd-1": "To use STDIN as an input to these tools, use - as the filename.",
    "html-sphinx-alabaster-1": "gcc -o github_commits github_commits.c -ljansson -lcurl",
    "html-mkdocs-1": "MkDocs will allow you to name your index pages as README.md instead",
    "html-mkdocs-2": "ask for the missing value with prompt=True",
    "html-javadoc-1": "Squeezes any repetitions of a character that is mentioned in the supplied",
    "html-doxygen-1": "Use CharReader and CharReaderBuilder.",
    "html-docbook-1": "# dpkg-reconfigure locales",
    "html-texinfo-1": "--files-from=file",
    "html-texinfo-2": "set jumpyscrolling\n\nScroll the buffer contents per half-screen",
    "html-handwritten-1": "In February 2001, nano was declared an official GNU program by Richard",
    "html-asciidoc-1": "alice$ git log -p HEAD..FETCH_HEAD",
}
"""Where each question's answer is: words the loader's text of its page must hold."""


def test_every_question_is_answered_by_its_page() -> None:
    lines = (HTML_FOLDER / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line) for line in lines]
    assert len({q["id"] for q in questions}) == len(questions) == len(ANSWERS)
    for question in questions:
        folder, name = question["file"].split("/")
        assert folder == "html" and name in html_names() and question["question"].strip()
        assert ANSWERS[question["id"]] in text_of(name), question["id"]
