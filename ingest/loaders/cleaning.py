"""Text cleaning: decode file bytes (BOM, UTF-8, else a guessed charset) and make text safe to
store (no NUL or other control characters, valid UTF-8, NFC)."""

from __future__ import annotations

import codecs
import math
import re
import unicodedata
from typing import Any

from charset_normalizer import from_bytes

_LINE_BREAKS = re.compile("\r\n?|[\x0b\x0c]")
# All C0 controls but \t and \n; \r, \v and \f are already line breaks by then.
_CONTROL_CHARS = re.compile("[\x00-\x08\x0e-\x1f]")
# A str can only hold surrogates unpaired; they cannot be encoded as UTF-8.
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Make `text` safe to store: no NUL or other control characters, valid UTF-8, NFC.

    Line breaks become `\\n` (vertical tab and form feed too, since they separate lines and
    pages); trailing whitespace of the whole text is removed.
    """
    text = _LINE_BREAKS.sub("\n", text)
    text = _CONTROL_CHARS.sub("", text)
    text = _SURROGATES.sub("\ufffd", text)
    return unicodedata.normalize("NFC", text).rstrip()


# UTF-32-LE's BOM starts with UTF-16-LE's, so it must be tried first.
BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_bytes(data: bytes) -> str:
    """Decode file bytes to clean text: BOM, else strict UTF-8, else a detected encoding."""
    return clean_text(_decode(data))


def _decode(data: bytes) -> str:
    for bom, encoding in BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(encoding, errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode(guess_encoding(data) or "utf-8", errors="replace")


def guess_encoding(data: bytes) -> str | None:
    """The likely encoding of bytes that are not UTF-8 (charset detection), or None."""
    # Stray NUL bytes make charset-normalizer answer UTF-16; they are dropped later anyway.
    # Text that is mostly NUL bytes, though, may really be BOM-less UTF-16.
    sample = data.replace(b"\x00", b"") if data.count(0) * 4 < len(data) else data
    matches = from_bytes(sample)
    best = matches.best()
    if best is None:
        return None
    # Short texts tie between many code pages and the alphabetically first one wins (cp1006
    # for b"caf\xe9"). Windows-1252 is by far the most common legacy encoding, so when one of
    # the tied guesses reads the bytes exactly as cp1252 does, say cp1252.
    western = sample.decode("cp1252", errors="replace")
    tied = (m for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence))
    return "cp1252" if any(str(m) == western for m in tied) else best.encoding


def collapse(text: str) -> str:
    return " ".join(text.split())


def clean_title(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    return clean_text(collapse(str(value))) or None


def clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(str(key)): clean_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [clean_json(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON allows NaN and Infinity in practice; jsonb does not
    return value
