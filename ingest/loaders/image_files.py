"""Images (PNG, JPEG, TIFF): their text, read by OCR; each frame of a multi-frame TIFF is a page.

An image has no text but what OCR reads, so with `RAGSERVICE_OCR=off` it is a per-file error.
Pillow only reads the header when it opens a file, so the size is checked before any pixel is
decoded: a small file can claim a huge image (a decompression bomb), refused as "image too large"
(`ocr.MAX_IMAGE_PIXELS`, the limit of every image OCR decodes).
"""

from __future__ import annotations

import io

from PIL import (
    Image,
    ImageSequence,
    JpegImagePlugin,
    PngImagePlugin,
    TiffImagePlugin,
    UnidentifiedImageError,
)

from ingest.loaders.cleaning import clean_text
from ingest.loaders.ocr import check_image_size, ocr_enabled, ocr_image
from ingest.loaders.parsing import Parsed, ParseError, bad_content
from ingest.loaders.pdf import page_starts
from ragservice.limits.documents import DocumentLimits
from ragservice.types import PAGE_SEPARATOR

_FORMATS = ["PNG", "JPEG", "TIFF"]
_HEADER_READERS = (
    PngImagePlugin.PngImageFile,
    JpegImagePlugin.JpegImageFile,
    TiffImagePlugin.TiffImageFile,
)
"""Pillow's readers of those formats: constructed on a file, each reads its header alone."""
_NOT_AN_IMAGE = "not a valid image: not a PNG, JPEG or TIFF file Pillow can read"


def parse_image(data: bytes, limits: DocumentLimits) -> Parsed:
    if not ocr_enabled(limits):
        raise ParseError("an image's text can only be read by OCR, and OCR is off (RAGSERVICE_OCR)")
    image = _open(data)
    with bad_content("not a valid image"):
        frames = getattr(image, "n_frames", 1)
        if frames > limits.max_pages:
            raise ParseError(
                f"the image has {frames} frames; the limit is {limits.max_pages} "
                "(RAGSERVICE_MAX_DOCUMENT_PAGES)"
            )
        pages = _read_frames(image, frames, limits)
    text = PAGE_SEPARATOR.join(page for page in pages if page)
    metadata = {"pages": len(pages), "ocr": True, "ocr_pages": list(range(1, len(pages) + 1))}
    return Parsed(text, None, "text", metadata, page_starts(pages))


def _open(data: bytes) -> Image.Image:
    """The image, its header read and no pixel decoded; ParseError for what is not one, and
    for an image over the limit (its first frame: `_read_frames` checks each)."""
    check_image_size(*_declared_size(data))  # Pillow's own check refuses at twice this size
    try:
        return Image.open(io.BytesIO(data), formats=_FORMATS)
    except UnidentifiedImageError:  # its message names an object's address, not the file
        raise ParseError(_NOT_AN_IMAGE) from None


def _declared_size(data: bytes) -> tuple[int, int]:
    """The width and height the file's header declares."""
    for reader in _HEADER_READERS:
        try:
            return reader(io.BytesIO(data)).size
        except Exception:  # not this format (or a damaged header): the next one
            continue
    raise ParseError(_NOT_AN_IMAGE)


def _read_frames(image: Image.Image, frames: int, limits: DocumentLimits) -> list[str]:
    pages: list[str] = []
    total = 0
    for number, frame in enumerate(ImageSequence.Iterator(image), start=1):
        check_image_size(frame.width, frame.height, f"frame {number}: " if frames > 1 else "")
        what = f"frame {number} of the image" if frames > 1 else "the image"
        text = clean_text(ocr_image(frame.copy(), limits, what).strip())
        total += len(text)
        if total > limits.max_chars:
            raise ParseError(
                f"the text is over {limits.max_chars} characters (RAGSERVICE_MAX_DOCUMENT_CHARS)"
            )
        pages.append(text)
    return pages
