"""Plain text and Markdown: decoded as they are; a Markdown file's title is its first `# `."""

from __future__ import annotations

import re

from ingest.loaders.cleaning import clean_title, decode_bytes
from ingest.loaders.parsing import Parsed
from ragservice.limits.documents import DocumentLimits


def parse_text(data: bytes, _limits: DocumentLimits) -> Parsed:
    return Parsed(decode_bytes(data), None, "text")


def parse_markdown(data: bytes, _limits: DocumentLimits) -> Parsed:
    text = decode_bytes(data)
    return Parsed(text, _markdown_title(text), "markdown")


_FENCE = re.compile(r" {0,3}(```|~~~)")
# Only the opening: a single regex for the whole line (`#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*`)
# backtracks quadratically on a long run of spaces inside the title.
_ATX_H1_OPEN = re.compile(r" {0,3}#[ \t]+")


def _markdown_title(text: str) -> str | None:
    """The first `# ` heading, not counting `# comments` inside fenced code."""
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (heading := _atx_h1(line)) is not None:
            return clean_title(heading)
    return None


def _atx_h1(line: str) -> str | None:
    """The text of a level-1 ATX heading line, or None when the line is not one.

    CommonMark: up to three spaces, `#`, at least one space or tab, the text; a closing run of
    `#` after a space or tab and trailing spaces and tabs are not part of the text.
    """
    opening = _ATX_H1_OPEN.match(line)
    if opening is None:
        return None
    text = line[opening.end() :]
    if not text:
        # Nothing but blanks after the `#`: the heading's text is the last of at least two.
        return line[-1] if opening.end() - line.index("#") > 2 else None
    text = text.rstrip(" \t")
    unclosed = text.rstrip("#")
    if unclosed != text and unclosed[-1:] in (" ", "\t"):
        text = unclosed.rstrip(" \t")
    return text
