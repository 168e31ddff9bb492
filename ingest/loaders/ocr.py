"""OCR of page images with tesseract (through pytesseract), for scans and pictures of text.

pytesseract and Debian's tesseract-ocr are optional (the `ocr` extra): both are looked for
only when a file needs OCR, and a file that needs it without them fails alone, with a reason
that says what to install. `RAGSERVICE_OCR=off` keeps text-less pages empty instead.

tesseract runs as a subprocess of the parsing sandbox's child, so the child's CPU limit does
not bound it; each page is bounded by `DocumentLimits.ocr_page_seconds` (pytesseract kills
tesseract past it), and before each page the sandbox is told (`set_page_hook`) so it can add
that allowance to the file's own limits. tesseract runs one thread (`OMP_THREAD_LIMIT=1`):
parsers run one per ingest thread already, and its threads gain little on one page.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from typing import Any

from PIL import Image

from ingest.loaders.parsing import ParseError
from ragservice.limits.documents import DocumentLimits

MAX_IMAGE_PIXELS = 89_000_000
"""The most pixels an image may have to be decoded for OCR (a frame of an image file, an image
on a scanned PDF page): a 26 x 38 inch scan at 300 dpi, about where Pillow warns of a
decompression bomb. A larger one is refused by the size its header declares, before any pixel is
decoded: a file of a few kilobytes can declare gigapixels."""
_MAX_PIXELS = 60_000_000  # about a 22 x 30 inch page at 300 dpi; more is scaled down
_INSTALL = "install Debian's tesseract-ocr, or set RAGSERVICE_OCR=off"

_page_hook: Callable[[], None] | None = None


def set_page_hook(hook: Callable[[], None] | None) -> None:
    """Call `hook` before each page is OCR'd (the sandbox's child extends its limits)."""
    global _page_hook
    _page_hook = hook


def ocr_enabled(limits: DocumentLimits) -> bool:
    return limits.ocr != "off"


def require_engine(what: str) -> Any:
    """The pytesseract module, ready; ParseError naming `what` if it or tesseract is missing."""
    try:
        import pytesseract
    except ImportError:
        raise ParseError(
            f"{what} needs OCR, but pytesseract is not installed (pip install "
            "'ragservice[ocr]' and Debian's tesseract-ocr, or set RAGSERVICE_OCR=off)"
        ) from None
    command = str(pytesseract.pytesseract.tesseract_cmd)
    if shutil.which(command) is None:
        raise ParseError(f"{what} needs OCR, but tesseract is not installed ({_INSTALL})")
    return pytesseract


def check_image_size(width: int, height: int, where: str = "") -> None:
    """ParseError unless a `width` x `height` image is within `MAX_IMAGE_PIXELS`; `where`
    (`frame 2: `, `page 3: `) names it in a file of several."""
    if width * height > MAX_IMAGE_PIXELS:
        raise ParseError(
            f"image too large ({where}{width} x {height} pixels, at most {MAX_IMAGE_PIXELS:,}): "
            "refused before decoding"
        )


def ocr_image(image: Image.Image, limits: DocumentLimits, what: str) -> str:
    """The text tesseract reads in `image` (`what` names the page in errors)."""
    engine = require_engine(what)
    if _page_hook is not None:
        _page_hook()
    os.environ["OMP_THREAD_LIMIT"] = "1"
    try:
        text = engine.image_to_string(
            _prepared(image), lang=limits.ocr_languages, timeout=limits.ocr_page_seconds
        )
    except engine.TesseractError as exc:  # a RuntimeError too: first
        raise ParseError(f"OCR of {what} failed: {_tesseract_reason(exc)}") from exc
    except RuntimeError as exc:  # pytesseract's timeout
        raise ParseError(
            f"OCR of {what} took longer than {limits.ocr_page_seconds:g} s "
            "(RAGSERVICE_OCR_PAGE_SECONDS)"
        ) from exc
    except OSError as exc:  # tesseract vanished, or could not be started
        raise ParseError(f"{what} needs OCR, but tesseract could not run ({_INSTALL})") from exc
    return str(text)


def _prepared(image: Image.Image) -> Image.Image:
    """Grey, and no larger than tesseract needs (a huge image only costs time and memory)."""
    grey = image if image.mode == "L" else image.convert("L")
    pixels = grey.width * grey.height
    if pixels <= _MAX_PIXELS:
        return grey
    scale = (_MAX_PIXELS / pixels) ** 0.5
    size = (max(1, int(grey.width * scale)), max(1, int(grey.height * scale)))
    return grey.resize(size, Image.Resampling.LANCZOS)


def _tesseract_reason(exc: Exception) -> str:
    message = getattr(exc, "message", "") or str(exc)
    lines = [line for line in str(message).splitlines() if line.strip()]
    detail = " ".join(lines[:2])[:200] or type(exc).__name__
    if "Failed loading language" in detail or "Error opening data file" in detail:
        return f"{detail} (install tesseract's language data, or set RAGSERVICE_OCR_LANGUAGES)"
    return detail
