"""RTF: its plain text (striprtf), paragraphs as lines; the title from the `\\info` group.

RTF is 7-bit text with escapes (`\\'e9`), which striprtf decodes by the file's code page
(Windows-1252 unless it says otherwise); the bytes themselves are decoded as text files are,
for the writers that put UTF-8 in an RTF. A file that does not start with `{\\rtf` is refused,
so that any text file renamed `.rtf` is not read as "plain text without control words".
"""

from __future__ import annotations

import re

from striprtf.striprtf import rtf_to_text

from ingest.loaders.cleaning import clean_text, clean_title, decode_bytes
from ingest.loaders.markdown_text import over_the_limit
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ragservice.limits.documents import DocumentLimits

_TITLE = re.compile(r"\{\\title\s([^{}\\]{0,500})\}")


def parse_rtf(data: bytes, limits: DocumentLimits) -> Parsed:
    text = decode_bytes(data)
    if not text.lstrip().startswith("{\\rtf"):
        raise ParseError("not a valid RTF file: it does not start with {\\rtf")
    with bad_content("not a valid RTF file"):
        plain = clean_text(rtf_to_text(text, errors="replace"))  # type: ignore[no-untyped-call]
    if len(plain) > limits.max_chars:
        raise over_the_limit(limits)
    title = _TITLE.search(text[:65536])
    return Parsed(plain.strip("\n"), clean_title(title.group(1)) if title else None, "text")
