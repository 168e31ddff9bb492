"""Plain text and Markdown: decoded as they are; a Markdown file's title is its first `# `."""

from __future__ import annotations

import re

from ingest.loaders.cleaning import clean_title, decode_bytes
from ingest.loaders.limits import DocumentLimits
from ingest.loaders.parsing import Parsed


def parse_text(data: bytes, _limits: DocumentLimits) -> Parsed:
    return Parsed(decode_bytes(data), None, "text")


def parse_markdown(data: bytes, _limits: DocumentLimits) -> Parsed:
    text = decode_bytes(data)
    return Parsed(text, _markdown_title(text), "markdown")


_FENCE = re.compile(r" {0,3}(```|~~~)")
_ATX_H1 = re.compile(r" {0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*")


def _markdown_title(text: str) -> str | None:
    """The first `# ` heading, not counting `# comments` inside fenced code."""
    fenced = False
    for line in text.split("\n"):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (match := _ATX_H1.fullmatch(line)):
            return clean_title(match.group(1))
    return None
