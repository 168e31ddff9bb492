"""Active HTML out of answers (`safety/html.py`): strip, escape or keep, Markdown and prose
untouched, and a stream cleaned exactly as the whole text however it is split."""

from __future__ import annotations

import re

import nh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragservice.safety.html import AnswerText, HtmlFilter, Mode, clean_html

MARKDOWN = (
    "# Leave\n\n**Sixteen weeks** for *every* parent [1], see [the policy](/hr/leave).\n\n"
    "- a < b and x > y, p < 0.05, 1 <2, x <- y, a << b, </ x>\n"
    "- `code span` and `a && b`; 5 > 3 & 2 < 4\n"
    "> a quote\n\n```python\nif n > 0:\n    pass\n```\n"
    "1. one\n2. two &amp; three &lt;four&gt;\n"
)

STRIPPED = [
    ("<img src=x onerror=alert(1)>hi", "hi"),
    ("<svg onload=alert(1)><circle/></svg>x", "x"),
    ('<iframe srcdoc="<script>alert(1)</script>">y</iframe>', "y"),
    ("T<script>alert(1)</script>", "T"),
    ("<SCRIPT>a</SCRIPT >b<style>p{}</style>c", "bc"),
    ("<script>a</scripts>b</script>c", "c"),  # only its own end tag ends a script
    ("<script>never closed", ""),
    ('<b onclick="x" style="color:red">bold</b>', "<b>bold</b>"),
    (
        '<a href="javascript:alert(1)" title="a>b">l</a>',
        '<a title="a&gt;b" rel="noopener noreferrer">l</a>',
    ),
    (
        "<table><tr><td colspan=2 onclick=x>c</td></tr></table>",
        '<table><tr><td colspan="2">c</td></tr></table>',
    ),
    ("<br/>line<hr><sup>2</sup>", "<br>line<hr><sup>2</sup>"),
    ("<!-- hidden -->a<!DOCTYPE html><?php x ?>b<!-->c", "abc"),
    ("<math><mi xlink:href=javascript:alert(1)>x</mi></math>", "x"),
    ("<div/onmouseover='alert(1)'>d</div>", "<div>d</div>"),
    ("unclosed <img src=x onerror=alert(1)", "unclosed &lt;img src=x onerror=alert(1)"),
    # What is left around removed markup cannot join into a new tag.
    ("<<!---->img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)>"),
    ("<<script>x</script>img src=x onerror=y>", "&lt;img src=x onerror=y>"),
    # Markdown autolinks are Markdown: the bare address.
    ("see <https://docs.ok/a> or <me@docs.ok>", "see https://docs.ok/a or me@docs.ok"),
    ("<https:/onclick=alert(1)>", "https:/onclick=alert(1)"),
]


@pytest.mark.parametrize(("text", "cleaned"), STRIPPED)
def test_strip_takes_out_active_markup_and_keeps_the_text(text: str, cleaned: str) -> None:
    assert clean_html(text, "strip") == cleaned


@pytest.mark.parametrize("mode", ["strip", "escape", "keep"])
def test_markdown_and_prose_come_through_unchanged(mode: Mode) -> None:
    assert clean_html(MARKDOWN, mode) == MARKDOWN
    stream = HtmlFilter(mode)
    assert "".join(stream.feed(c) for c in MARKDOWN) + stream.finish() == MARKDOWN


def test_escape_shows_markup_as_text_and_keep_changes_nothing() -> None:
    text = 'T<script>alert(1)</script> <img src=x onerror="a&b"> <b>ok</b>'
    assert clean_html(text, "escape") == (
        'T&lt;script&gt;alert(1)&lt;/script&gt; &lt;img src=x onerror="a&amp;b"&gt; '
        "&lt;b&gt;ok&lt;/b&gt;"
    )
    assert clean_html(text, "keep") == text


def test_a_tag_split_across_tokens_is_held_until_it_closes() -> None:
    stream = HtmlFilter("strip")
    assert stream.feed("Sixteen weeks <im") == "Sixteen weeks "
    assert stream.feed("g src=x on") == ""
    assert stream.feed("error=alert(1)>[1]. a <") == "[1]. a "
    assert stream.feed(" b <scr") == "< b "
    assert stream.feed("ipt>alert(1)</scr") == ""
    assert stream.feed("ipt> done") == " done"
    assert stream.finish() == ""


def test_markup_that_never_ends_is_not_waited_for() -> None:
    stream = HtmlFilter("strip")
    assert stream.feed("a <b title='" + "x" * 5000) == "a &lt;b title='" + "x" * 5000
    assert stream.feed("'>") == "'>"


def test_answers_lose_foreign_links_then_active_html() -> None:
    text = AnswerText({"docs.ok"}, "strip")
    answer = "[a](https://evil.example/x) <a href=https://docs.ok/y onclick=z>b</a> <svg>c"
    expected = 'a <a href="https://docs.ok/y" rel="noopener noreferrer">b</a> c'
    assert text.clean(answer) == expected
    stream = text.stream()
    assert "".join(stream.feed(c) for c in answer) + stream.finish() == expected


FRAGMENTS = [
    "<", ">", "/", "</", "!", "?", "=", '"', "'", " ", "\n", "-", "--", "!--", "-->", "&", "`",
    "**", "a", "b", "img", "script", "style", "svg", "td", "table", "iframe", " src=x",
    " onerror=alert(1)", " style=x", "https://x.y", "@", ":", "x" * 50,
]  # fmt: skip
TAGS = nh3.ALLOWED_TAGS - {"img", "area", "map"}


def _assert_inert(text: str) -> None:
    """Every tag in `text` is an allowed one without handlers, styles or scripts in it."""
    assert not re.search(r"<[!?]", text)
    for tag in re.finditer(r"<(/?)([A-Za-z][^\t\n\f\r />]*)([^>]*)", text):
        assert tag[2] in TAGS, text
        assert not re.search(r"(?i)[\s/]on|style|javascript", tag[3]), text


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join), st.data())
def test_a_stream_adds_up_to_the_whole_however_it_is_split(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    for mode in ("strip", "escape"):
        whole = clean_html(text, mode)
        stream = HtmlFilter(mode)
        assert "".join(stream.feed(piece) for piece in pieces) + stream.finish() == whole
        assert clean_html(whole, mode) == whole  # cleaning is idempotent
    _assert_inert(clean_html(text, "strip"))
    assert not re.search(r"<[A-Za-z!?]|</[A-Za-z]", clean_html(text, "escape"))
