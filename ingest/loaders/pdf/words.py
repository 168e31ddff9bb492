"""A PDF page's words and drawn lines, read by pdfium, for `layout` and `rules`.

pdfium (C) reads a page's characters, their boxes and their fonts in a few milliseconds. Its
character indexes are UTF-16 code units: a character outside the Basic Multilingual Plane (a
mathematical italic letter) takes two, so characters are read by index, never by position in
the page's text string (which is shorter by one for each such pair, and would shift every box
after it). pdfium also tells apart what the page only implies: the spaces and line ends it
generates between words split them, and a hyphen it sees breaking a word at a line's end comes
as U+0002, kept here as a hyphen that `text` may join across the line.

Boxes are top-down in points: `top = -y`, so larger is lower on the page.
"""

from __future__ import annotations

import ctypes
import math
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c

from ingest.loaders.pdf.blocks import Word

_CHAR_GAP = 3.0  # points: characters further apart than this on a line are separate words
_UPRIGHT = 0.1  # radians: a character turned further is rotated text (a watermark, a label)
_UPRIGHT_SHARE = 0.5  # rotated text is dropped where upright characters are at least this share
_MARK_SIZE = 0.85  # a mark set this much smaller than the text after it is no part of a word
_OFF_PAGE = 2.0  # points: a word this far outside the page's crop box is not on the page
_LINE_HYPHEN = 0x02  # pdfium's mark for a hyphen that breaks a word at the end of a line
# Latin ligatures (U+FB00 ff … U+FB06 st) as one character: BM25 and the embedding want the
# letters, which their compatibility decomposition spells out.
_LIGATURES = range(0xFB00, 0xFB07)
# Fixed-pitch fonts by name, where the font descriptor does not say (TeX's fonts never do):
# Computer/Latin Modern typewriter (CMTT10, LMMono10, SFTT1000, txtt), Courier, DejaVu Sans Mono,
# Consolas, Menlo, Inconsolata, TeX Gyre Cursor, Source Code Pro, Fira Code.
_MONO_NAME = re.compile(r"mono|courier|typewriter|consol|menlo|inconsolata|cursor|code|tt\d")
_FIXED_PITCH = 1  # the font descriptor's flag
_BOLD = 600  # a font weight this heavy or more is bold
_BOLD_NAME = re.compile(r"bold|black|heavy|demi|medi|-bd|bx\d")
_FONT_NAME_BYTES = 128


@dataclass(slots=True)
class _Char:
    text: str
    left: float
    bottom: float
    right: float
    top: float
    baseline: float
    upright: bool = True


def has_image(page: pypdfium2.PdfPage) -> bool:
    return next(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]), None) is not None


def pdfium_words(page: pypdfium2.PdfPage) -> list[Word]:
    """The page's words: runs of characters that are not spaces, on one line, close together,
    each with its box, baseline and font (fixed-pitch, bold, size). Words off the
    page (beamer parks hidden overlays thousands of points away) are left out, and so is
    rotated text on a page of upright text (a "Draft" stamp, a rotated margin note)."""
    text_page = page.get_textpage()
    try:
        chars = list(_chars(text_page))
        upright = sum(1 for _, char in chars if char is not None and char.upright)
        drop_rotated = upright >= _UPRIGHT_SHARE * sum(1 for _, c in chars if c is not None)
        if drop_rotated:
            chars = [(i, c if c is None or c.upright else None) for i, c in chars]
        words = list(_words(text_page, chars))
    finally:
        text_page.close()
    left, bottom, right, top = page.get_bbox()  # the crop box within the media box
    return [
        word
        for word in words
        if left - _OFF_PAGE <= (word.x0 + word.x1) / 2 <= right + _OFF_PAGE
        and bottom - _OFF_PAGE <= -(word.top + word.bottom) / 2 <= top + _OFF_PAGE
    ]


def _words(
    text_page: pypdfium2.PdfTextPage, chars: list[tuple[int, _Char | None]]
) -> Iterator[Word]:
    current: list[_Char] = []
    first_index = 0
    for index, char in chars:
        if char is None:  # a space, a line end, a control character
            if current:
                yield _word(current, _font(text_page, first_index))
                current = []
            continue
        if current and not _near(current, char):
            yield _word(current, _font(text_page, first_index))
            current = []
        if not current:
            first_index = index
        current.append(char)
    if current:
        yield _word(current, _font(text_page, first_index))


def _chars(text_page: pypdfium2.PdfTextPage) -> Iterator[tuple[int, _Char | None]]:
    """Each character by pdfium's index, a surrogate pair as one; None where words break."""
    raw = text_page.raw
    count = pdfium_c.FPDFText_CountChars(raw)
    index = 0
    while index < count:
        code = pdfium_c.FPDFText_GetUnicode(raw, index)
        width = 1
        if 0xD800 <= code < 0xDC00 and index + 1 < count:
            low = pdfium_c.FPDFText_GetUnicode(raw, index + 1)
            if 0xDC00 <= low < 0xE000:
                code, width = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00), 2
        text = "-" if code == _LINE_HYPHEN else _printable(code)
        if code in _LIGATURES:
            text = unicodedata.normalize("NFKC", chr(code))
        if text is None:
            yield index, None
        else:
            left, bottom, right, top = text_page.get_charbox(index, loose=True)
            if width == 2:  # the pair's second half has the glyph's box too
                l2, b2, r2, t2 = text_page.get_charbox(index + 1, loose=True)
                left, bottom = min(left, l2), min(bottom, b2)
                right, top = max(right, r2), max(top, t2)
            angle = pdfium_c.FPDFText_GetCharAngle(raw, index)
            upright = angle < 0 or min(angle, 2 * math.pi - angle) <= _UPRIGHT
            baseline = _origin_y(raw, index, bottom)
            yield index, _Char(text, left, bottom, right, top, baseline, upright)
        index += width


def _origin_y(raw: Any, index: int, fallback: float) -> float:
    """The character's baseline (the y of its origin)."""
    x, y = ctypes.c_double(), ctypes.c_double()
    if pdfium_c.FPDFText_GetCharOrigin(raw, index, ctypes.byref(x), ctypes.byref(y)):
        return y.value
    return fallback


def _printable(code: int) -> str | None:
    if code in (0xFFFE, 0xFFFF) or 0xD800 <= code < 0xE000:
        return None
    char = chr(code)
    if char.isspace() or (not char.isprintable() and char != "\ufffd"):
        return None
    return char


def _near(current: list[_Char], char: _Char) -> bool:
    """Whether `char` continues the word: close after its last character, its baseline within
    half a line's height (a subscript or superscript stays with its letter, as pdftotext keeps
    it; boxes would not do: a math font's box is taller than the text font's on the same
    line) — but a word does not start with a raised smaller mark (a footnote's number)."""
    last, first = current[-1], current[0]
    height = max(last.top - last.bottom, char.top - char.bottom) or 1.0
    if char.left - last.right > _CHAR_GAP or abs(char.baseline - first.baseline) >= 0.5 * height:
        return False
    return not _leading_mark(current, char)


def _leading_mark(current: list[_Char], char: _Char) -> bool:
    """Whether the word so far is a raised, smaller mark before `char` (a footnote number)."""
    size = char.top - char.bottom
    raised = all(c.baseline - char.baseline > 0.2 * size for c in current)
    smaller = all(c.top - c.bottom < _MARK_SIZE * size for c in current)
    return raised and smaller


def _word(chars: list[_Char], font: _Font) -> Word:
    return Word(
        "".join(char.text for char in chars),
        min(char.left for char in chars),
        max(char.right for char in chars),
        -max(char.top for char in chars),
        -min(char.bottom for char in chars),
        font.mono,
        -chars[0].baseline,
        font.size,
        font.bold,
    )


@dataclass(frozen=True, slots=True)
class _Font:
    mono: bool
    bold: bool
    size: float


def _font(text_page: pypdfium2.PdfTextPage, index: int) -> _Font:
    """The font of the character at `index`: fixed-pitch by its descriptor's flag or its
    name; bold by its weight or its name; its size in points."""
    buffer = ctypes.create_string_buffer(_FONT_NAME_BYTES)
    flags = ctypes.c_int(0)
    raw = text_page.raw
    length = pdfium_c.FPDFText_GetFontInfo(
        raw, index, buffer, _FONT_NAME_BYTES, ctypes.byref(flags)
    )
    name = buffer.raw[: max(0, min(length, _FONT_NAME_BYTES) - 1)].decode("latin-1").lower()
    name = name.rpartition("+")[2]
    mono = bool(flags.value & _FIXED_PITCH) or _MONO_NAME.search(name) is not None
    weight = pdfium_c.FPDFText_GetFontWeight(raw, index)
    # TeX's Type 1 fonts report weights that mean nothing (SFBX1000: 250): the name tells.
    bold = weight >= _BOLD or _BOLD_NAME.search(name) is not None
    return _Font(mono, bold, float(pdfium_c.FPDFText_GetFontSize(raw, index)))
