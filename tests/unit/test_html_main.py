"""Main-content extraction (`ingest/loaders/html_main.py`) on realistic pages
(tests/fixtures/html): menus, cookie banners, sidebars, related links and footers built from
plain `div`s are dropped, the main text kept."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ingest.loaders.html_files import html_text, parse_html
from ragservice.limits.documents import DocumentLimits

PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "html"
EXPECTED: dict[str, dict[str, list[str]]] = json.loads((PAGES / "expected.json").read_text())
LIMITS = DocumentLimits(max_pages=10, max_chars=1_000_000)
_WORD = re.compile(r"\w+")


def key(text: str) -> str:
    return f" {' '.join(_WORD.findall(text.casefold()))} "


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_main_text_is_kept_and_the_boilerplate_dropped(name: str) -> None:
    parsed = parse_html((PAGES / name).read_bytes(), LIMITS)
    text = key(parsed.text)
    assert [s for s in EXPECTED[name]["main"] if key(s) not in text] == []
    kept = [s for s in EXPECTED[name]["boilerplate"] if key(s) in text]
    # The news page's inline advertisement sits between two paragraphs of the story, in a <p>.
    allowed = {"Find your dream kitchen at Brightwood Interiors this weekend."}
    assert set(kept) <= allowed


def test_the_tag_rules_alone_keep_the_div_boilerplate() -> None:
    """What trafilatura adds: without it, most boilerplate sentences survive."""
    page = (PAGES / "news_article.html").read_bytes()
    before, _ = html_text(page, main_content=False)
    after, _ = html_text(page, main_content=True)
    assert "We use cookies" in before and "We use cookies" not in after
    assert "Most read" in before and "Most read" not in after


def test_structure_and_title_survive() -> None:
    parsed = parse_html((PAGES / "docs_page.html").read_bytes(), LIMITS)
    assert parsed.title == "Configuring retries - Lattice Queue documentation"
    assert parsed.text.startswith("# Configuring retries\n\n")
    assert "## The retry policy" in parsed.text
    assert "- A permanent error skips the remaining attempts." in parsed.text
    assert '```\nqueue = lattice.declare(\n    "invoices",' in parsed.text
    table = parse_html((PAGES / "table_page.html").read_bytes(), LIMITS).text
    assert "Area | Blue bin | Green bin | Food caddy" in table
    assert "Elmwood | Friday, odd weeks | Friday, even weeks | Every Friday" in table


@pytest.mark.parametrize(
    "chosen",
    [None, "", "Books due that day can be returned on Tuesday without a fine."],
    ids=["nothing", "empty", "too-little"],
)
def test_when_trafilatura_finds_nothing_or_too_little_every_block_is_kept(
    monkeypatch: pytest.MonkeyPatch, chosen: str | None
) -> None:
    from ingest.loaders import html_main

    page = (PAGES / "table_page.html").read_bytes()
    before, _ = html_text(page, main_content=False)
    monkeypatch.setattr(html_main, "_chosen_text", lambda _html: chosen)
    assert html_text(page, main_content=True)[0] == before


ARTICLE = (
    "<p>Returns are accepted within thirty days of delivery for a full refund to the card.</p>"
    "<p>Items must be unused and in their original packaging, with the receipt enclosed.</p>"
)


@pytest.mark.parametrize(
    "anchor",
    [
        '<a class="headerlink" href="#returns" title="Permalink to this heading">\u00b6</a>',
        '<a class="headerlink" href="#returns">Link to this heading</a>',
        '<a href="#returns">\u00a7</a>',
        '<a href="#returns" class="anchor">#</a>',
        '<a href="#returns">\U0001f517</a>',
        '<a href="#returns" title="Permanent link">\uf0c1</a>',  # an icon font's glyph
    ],
)
def test_a_permalink_is_dropped(anchor: str) -> None:
    page = f"<html><body><main><h2>Returns{anchor}</h2>{ARTICLE}</main></body></html>"
    text, _ = html_text(page.encode())
    assert text.startswith("## Returns\n\nReturns are accepted"), text


def test_a_link_to_a_footnote_or_another_page_stays() -> None:
    page = (
        '<html><body><main><h2>Returns <a href="/policy">\u00a7</a></h2>'
        f'{ARTICLE}<p>See the conditions<a href="#note-1">*</a>.</p></main></body></html>'
    )
    text, _ = html_text(page.encode())
    assert text.startswith("## Returns \u00a7\n\n")
    assert "See the conditions*." in text


@pytest.mark.parametrize(
    ("markup", "line"),
    [
        ("<p># 3 items per order</p>", "\\# 3 items per order"),
        ("<p>#include &lt;stdio.h&gt;</p>", "\\#include <stdio.h>"),
        ("<p>```not code```</p>", "\\```not code```"),
        ("<table><tr><td>#</td><td>Item</td></tr></table>", "\\# | Item"),
        ("<ul><li># first</li></ul>", "- \\# first"),
    ],
)
def test_text_that_starts_like_markdown_is_escaped(markup: str, line: str) -> None:
    page = f"<html><body><main><h2># Orders</h2>{markup}{ARTICLE}</main></body></html>"
    text, _ = html_text(page.encode(), main_content=False)
    assert text.splitlines()[0] == "## # Orders"  # a heading's text is left as it is
    assert line in text.splitlines()


def test_a_footnote_aside_stays_and_a_sidebar_aside_goes() -> None:
    page = (
        f"<html><body><main>{ARTICLE}"
        '<aside class="footnote brackets" id="id2" role="note"><p>Cards are refunded in'
        " three to five working days.</p></aside>"
        '<aside epub:type="footnote"><p>Gift cards are not refunded.</p></aside>'
        "<aside><p>Trending: our summer sale</p></aside></main></body></html>"
    )
    text, _ = html_text(page.encode(), main_content=False)
    assert "Cards are refunded in three to five working days." in text
    assert "Gift cards are not refunded." in text
    assert "summer sale" not in text


def test_soft_hyphens_are_no_part_of_a_word() -> None:
    page = "<html><body><main><h2>Re\u00adturns</h2><p>Re\u00adfunds in thirty days.</p>"
    text, _ = html_text(f"{page}</main></body></html>".encode(), main_content=False)
    assert text == "## Returns\n\nRefunds in thirty days."
