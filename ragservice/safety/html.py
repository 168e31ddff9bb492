"""Active HTML in answers: stripped, escaped or kept (`RAGSERVICE_ANSWER_HTML`).

A model can be steered by a retrieved passage into writing `<img src=x onerror=…>`, and a
document's title can be `T<script>…</script>`; a client that renders answers as HTML would run
it. So, by default (`strip`), every piece of markup in an answer is taken out or rebuilt by the
nh3 sanitizer (Ammonia): script and style go with their content, comments and declarations go,
an element nh3 does not allow (svg, iframe, img, object, form, …) loses its tags and keeps its
text, an allowed one (`<b>`, `<br>`, `<sup>`, `<a href>`, tables, …) is written out again by nh3
with only safe attributes (no event handlers, no `style`, no `javascript:` URLs). `escape`
writes every piece of markup as text (`&lt;b&gt;`); `keep` changes nothing.

Only markup is touched; everything between it is left exactly as written, so Markdown
(`**bold**`, `[text](url)`, lists, code spans) and prose such as `a < b` or `x > y` come
through unchanged. What counts as markup is what a browser's tokenizer sees as such: `<`
then an ASCII letter (a tag), `</` then a letter (an end tag), `<!` (a comment or declaration)
or `<?`, up to the `>` that ends it outside quoted attribute values. Markdown autolinks
(`<https://…>`, `<name@host>`) become the bare address. Two guards keep the rest inert:
markup with no end within `_MAX_MARKUP` characters (or none before the answer ends) has its
`<` written as `&lt;`, so a `>` later on (or in a footer after it) cannot close it; and a
text `<` right before markup that is taken out is written as `&lt;` too, so what follows the
removed part cannot join it into a new tag (`<<!---->img …>`).

`clean_html` does a whole text; `HtmlFilter` does a stream, holding back only an unfinished
piece of markup (or the content of a `<script>` being dropped), so that the pieces it returns
add up to exactly what `clean_html` returns for the whole. `AnswerText` is what answers go
through: the link filter (`links.py`), then this.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

import nh3

from ragservice.safety.links import LinkFilter, clean_links

Mode = Literal["strip", "escape", "keep"]

# Markup longer than this (or never closed) is not waited for: its `<` is written as text.
_MAX_MARKUP = 4096
_SPACE = "\t\n\f\r "
# nh3's defaults, less the elements that fetch something as the page renders (images: a
# Markdown image is the way to show one, and the link filter checks its host).
_TAGS = frozenset(nh3.ALLOWED_TAGS - {"img", "area", "map"})
# Elements whose content goes with them (nh3's `clean_content_tags`).
_DROP_CONTENT = frozenset(nh3.CLEAN_CONTENT_TAGS)
_CLEANER = nh3.Cleaner(tags=set(_TAGS), clean_content_tags=set(_DROP_CONTENT))
# Table parts are only parsed inside a table: nh3 is shown one inside its context.
_CONTEXT = {
    "caption": "<table>",
    "colgroup": "<table>",
    "tbody": "<table>",
    "thead": "<table>",
    "tfoot": "<table>",
    "tr": "<table><tbody>",
    "td": "<table><tbody><tr>",
    "th": "<table><tbody><tr>",
    "col": "<table><colgroup>",
}
# CommonMark autolinks: Markdown, not HTML.
_AUTOLINK = re.compile(
    r"<([A-Za-z][A-Za-z0-9+.-]{1,31}:[^\x00-\x20<>]*"
    r"|[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*)>"
)


def clean_html(text: str, mode: Mode) -> str:
    """`text` with its markup stripped, escaped or kept, as `mode` says."""
    if mode == "keep" or "<" not in text:
        return text
    return HtmlFilter(mode).finish(text)


class HtmlFilter:
    """`clean_html` over a stream: `feed` each piece, then `finish` once."""

    def __init__(self, mode: Mode) -> None:
        self._mode = mode
        self._held = ""
        self._dropping: str | None = None  # the element whose content is being dropped

    def feed(self, piece: str) -> str:
        """What of the text so far can be shown now, cleaned; the rest is held."""
        if self._mode == "keep":
            return piece
        self._held += piece
        shown, used = self._scan(self._held, final=False)
        self._held = self._held[used:]
        return shown

    def finish(self, piece: str = "") -> str:
        """`piece` and whatever is still held, cleaned; the filter starts afresh after."""
        if self._mode == "keep":
            return piece
        shown, _ = self._scan(self._held + piece, final=True)
        self._held, self._dropping = "", None
        return shown

    def _scan(self, text: str, *, final: bool) -> tuple[str, int]:
        """The cleaned text up to where more input could change it, and where that is."""
        out: list[str] = []
        at = 0
        lone: tuple[int, int] | None = None  # a text `<` right before `at`: (in out, in text)
        while at < len(text):
            if self._dropping is not None:
                at, ended = _content_end(text, at, self._dropping, final)
                if not ended:
                    break
                self._dropping = None
                continue
            lt = text.find("<", at)
            if lt < 0:
                out.append(text[at:])
                at = len(text)
                break
            if lt > at:
                out.append(text[at:lt])
                lone = None
            token = _token(text, lt, final)
            if token.kind == "open":  # unfinished: hold it, and a lone `<` before it
                if lone is not None:
                    del out[lone[0] :]
                    lt = lone[1]
                return "".join(out), lt
            written = self._write(token, text[lt : token.end])
            if lone is not None and not written.startswith(("<", "&")):
                out[lone[0]] = "&lt;" + out[lone[0]][1:]  # what follows cannot join it
            out.append(written)
            lone = (len(out) - 1, lt) if token.kind == "text" and token.end < len(text) else None
            if lone is not None and text[token.end] != "<":
                lone = None
            at = token.end
        return "".join(out), at

    def _write(self, token: _Token, raw: str) -> str:
        """What one token becomes."""
        if token.kind == "text":
            return raw
        if token.kind == "long":
            return "&lt;"
        if (link := _AUTOLINK.fullmatch(raw)) is not None:
            return link[1]
        if self._mode == "escape":
            return html.escape(raw, quote=False)
        if token.kind == "start":
            if token.name in _DROP_CONTENT:
                self._dropping = token.name
                return ""
            return _clean_start_tag(raw, token.name) if token.name in _TAGS else ""
        if token.kind == "end" and token.name in _TAGS:
            return f"</{token.name}>"
        return ""  # comments, declarations, end tags of elements not allowed


class AnswerText:
    """What answer text goes through: links to other hosts out (`links.py`), then HTML."""

    def __init__(self, hosts: Collection[str], mode: Mode) -> None:
        self._hosts = hosts
        self._mode = mode

    def clean(self, text: str) -> str:
        """A whole text, cleaned."""
        return clean_html(clean_links(text, self._hosts), self._mode)

    def stream(self) -> AnswerStream:
        """A filter for text that comes in pieces."""
        return AnswerStream(LinkFilter(self._hosts), HtmlFilter(self._mode))


class AnswerStream:
    """`AnswerText.clean` over a stream: `feed` each piece, then `finish` once."""

    def __init__(self, links: LinkFilter, markup: HtmlFilter) -> None:
        self._links = links
        self._markup = markup

    def feed(self, piece: str) -> str:
        return self._markup.feed(self._links.feed(piece))

    def finish(self) -> str:
        return self._markup.finish(self._links.finish())


# -- the tokenizer -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Token:
    """What starts at a `<`: `text` (a `<` or `</` that is just text), `start` or `end` (a
    tag, `name` in lower case), `other` (a comment, declaration or processing instruction),
    `long` (markup that does not end in time), or `open` (cannot tell yet); `end` is where
    it stops."""

    kind: Literal["text", "start", "end", "other", "long", "open"]
    end: int
    name: str = ""


def _token(text: str, lt: int, final: bool) -> _Token:
    """The token at `text[lt]` (a `<`), as a browser's tokenizer would read it."""
    after = text[lt + 1 : lt + 3]
    if not after or after == "/":
        return _Token("text", lt + len(after) + 1) if final else _Token("open", lt)
    if after[0].isascii() and after[0].isalpha():
        return _markup(text, lt, _tag_end(text, lt + 1), final, "start", lt + 1)
    if after[0] == "/" and after[1].isascii() and after[1].isalpha():
        return _markup(text, lt, _tag_end(text, lt + 2), final, "end", lt + 2)
    if after[0] == "/":
        return _Token("text", lt + 2)  # `</` then not a letter: text (a comment at worst)
    if after[0] == "?":
        return _markup(text, lt, _find_end(text, lt + 2, ">"), final, "other")
    if after[0] == "!":
        return _declaration(text, lt, final)
    return _Token("text", lt + 1)


def _declaration(text: str, lt: int, final: bool) -> _Token:
    """`<!--…-->` (or its abrupt forms `<!-->`, `<!--->`, and `--!>`), or `<!…>`."""
    head = text[lt : lt + 6]
    if not final and len(head) < 6 and "<!--->".startswith(head):
        return _Token("open", lt)  # `<!`, `<!-`, `<!--`, `<!---`: which form is not known yet
    if head.startswith("<!-->"):
        return _Token("other", lt + 5)
    if head == "<!--->":
        return _Token("other", lt + 6)
    if head.startswith("<!--"):
        ends = [_find_end(text, lt + 4, mark) for mark in ("-->", "--!>")]
        found = [end for end in ends if end is not None]
        return _markup(text, lt, min(found) if found else None, final, "other")
    return _markup(text, lt, _find_end(text, lt + 2, ">"), final, "other")


def _markup(
    text: str,
    lt: int,
    end: int | None,
    final: bool,
    kind: Literal["start", "end", "other"],
    name_at: int = 0,
) -> _Token:
    """A token that ends at `end` (None: not yet), unless that is too far away."""
    if end is not None and end - lt <= _MAX_MARKUP:
        name = ""
        if kind != "other":
            stop = name_at
            while stop < end and text[stop] not in _SPACE + "/>":
                stop += 1
            name = text[name_at:stop].lower()
        return _Token(kind, end, name)
    if end is None and not final and len(text) - lt < _MAX_MARKUP:
        return _Token("open", lt)
    return _Token("long", lt + 1)


def _find_end(text: str, start: int, mark: str) -> int | None:
    found = text.find(mark, start)
    return None if found < 0 else found + len(mark)


def _tag_end(text: str, at: int) -> int | None:
    """Where the tag whose name starts at `at` ends (after its `>`), reading it as a browser
    does: a `>` inside a quoted attribute value does not end it. None: it has not ended."""
    n = len(text)
    i = at
    while i < n and text[i] not in _SPACE + "/>":  # the name
        i += 1
    while i < n:
        if text[i] == ">":
            return i + 1
        if text[i] in _SPACE + "/":
            i += 1
            continue
        i += 1  # an attribute's name (a leading `=` belongs to it)
        while i < n and text[i] not in _SPACE + "/>=":
            i += 1
        while i < n and text[i] in _SPACE:
            i += 1
        if i < n and text[i] == "=":
            i += 1
            while i < n and text[i] in _SPACE:
                i += 1
            if i < n and text[i] in "\"'":
                close = text.find(text[i], i + 1)
                if close < 0:
                    return None
                i = close + 1
            else:
                while i < n and text[i] not in _SPACE + ">":
                    i += 1
    return None


def _content_end(text: str, at: int, name: str, final: bool) -> tuple[int, bool]:
    """Where the dropped content of `name` (script, style) stops, and whether its end tag was
    found there (False: held from that point, or dropped to the end when `final`)."""
    closing = re.compile(rf"</{name}(?=[{_SPACE}/>]|\Z)", re.IGNORECASE | re.ASCII)
    for match in closing.finditer(text, at):
        if match.end() == len(text) and not final:
            return match.start(), False
        end = _tag_end(text, match.start() + 2)
        if end is None:
            return (len(text), False) if final else (match.start(), False)
        return end, True
    if not final:  # a `</scr` at the end may still become the end tag
        lt = text.rfind("<", max(at, len(text) - len(name) - 1))
        if lt >= 0 and f"</{name}".startswith(text[lt:].lower()):
            return lt, False
    return len(text), False


@functools.lru_cache(maxsize=256)
def _clean_start_tag(raw: str, name: str) -> str:
    """An allowed start tag as nh3 writes it with only the attributes it allows ("" when it
    drops the element)."""
    cleaned = _CLEANER.clean(_CONTEXT.get(name, "") + raw)
    found = re.search(rf"<{re.escape(name)}[ >]", cleaned)
    if found is None:
        return ""
    return cleaned[found.start() : cleaned.index(">", found.start()) + 1]
