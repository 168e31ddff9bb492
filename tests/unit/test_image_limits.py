"""Every image OCR would decode is refused over `MAX_IMAGE_PIXELS` by the size it declares,
before a pixel is decoded: a PNG, a JPEG, a TIFF's later frame, an image on a scanned PDF page.
The files are a few kilobytes each, made here (the PNG bomb: tests/integration/test_image_bomb)."""

from __future__ import annotations

import io
import shutil
import struct
import zlib

import pytest
from PIL import Image

from ingest.loaders.image_files import parse_image
from ingest.loaders.ocr import MAX_IMAGE_PIXELS, check_image_size
from ingest.loaders.parsing import ParseError
from ingest.loaders.pdf import parse_pdf
from ragservice.limits.documents import DocumentLimits
from tests.integration.test_image_bomb import bomb_png
from tests.pdfs import assemble

LIMITS = DocumentLimits(max_pages=20, max_chars=1_000_000)


def too_large(where: str, width: int, height: int) -> str:
    return f"image too large ({where}{width} x {height} pixels, at most {MAX_IMAGE_PIXELS:,})"


def test_the_limit_is_on_the_pixels() -> None:
    check_image_size(MAX_IMAGE_PIXELS, 1)
    with pytest.raises(ParseError, match=r"^image too large \(\d+ x 2 pixels"):
        check_image_size(MAX_IMAGE_PIXELS, 2)


def test_a_png_over_the_limit_is_refused_before_decoding() -> None:
    # 10000 x 10000: under twice Pillow's own limit, where Pillow only warns.
    for width, height in [(10_000, 10_000), (20_000, 20_000)]:
        with pytest.raises(ParseError) as refused:
            parse_image(bomb_png(width, height), LIMITS)
        assert str(refused.value).startswith(too_large("", width, height))


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) says `width` x `height`."""
    out = io.BytesIO()
    Image.new("L", (16, 16), 255).save(out, "JPEG")
    data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")
    struct.pack_into(">HH", data, sof + 5, height, width)
    return bytes(data)


def test_a_jpeg_over_the_limit_is_refused() -> None:
    with pytest.raises(ParseError) as refused:
        parse_image(jpeg_declaring(60_000, 60_000), LIMITS)
    assert str(refused.value).startswith(too_large("", 60_000, 60_000))


def tiff_of_frames(*sizes: tuple[int, int]) -> bytes:
    """A little-endian grey TIFF, one IFD a frame, each declaring its size; only the first
    frame's pixels are there (the others are never read)."""
    out = bytearray(b"II*\x00" + struct.pack("<I", 8))
    for number, (width, height) in enumerate(sizes):
        pixels = width * height if number == 0 else 16
        entries = [
            (256, 4, width),  # ImageWidth
            (257, 4, height),  # ImageLength
            (258, 3, 8),  # BitsPerSample
            (259, 3, 1),  # Compression: none
            (262, 3, 1),  # PhotometricInterpretation: black is zero
            (273, 4, 0),  # StripOffsets, set below
            (277, 3, 1),  # SamplesPerPixel
            (278, 4, height),  # RowsPerStrip
            (279, 4, pixels),  # StripByteCounts
        ]
        ifd_size = 2 + 12 * len(entries) + 4
        strip = len(out) + ifd_size
        last = number == len(sizes) - 1
        following = 0 if last else strip + pixels
        out += struct.pack("<H", len(entries))
        for tag, kind, value in entries:
            value = strip if tag == 273 else value
            packed = struct.pack("<HH", value, 0) if kind == 3 else struct.pack("<I", value)
            out += struct.pack("<HHI", tag, kind, 1) + packed
        out += struct.pack("<I", following)
        out += b"\xff" * pixels
    return bytes(out)


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="tesseract is not installed")
def test_a_tiff_frame_over_the_limit_is_refused() -> None:
    data = tiff_of_frames((64, 64), (30_000, 30_000))
    assert Image.open(io.BytesIO(data)).n_frames == 2
    with pytest.raises(ParseError) as refused:
        parse_image(data, LIMITS)
    assert str(refused.value).startswith(too_large("frame 2: ", 30_000, 30_000))


def pdf_with_image(width: int, height: int) -> bytes:
    """A one-page PDF whose only content is a 1-bit image of `width` x `height` (all black,
    compressed about 1000:1): a scan to OCR, as pdfium sees it."""
    row = b"\x00" * ((width + 7) // 8)
    packer = zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    content = b"q 500 0 0 700 50 50 cm /Im0 Do Q"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        b"/Resources << /XObject << /Im0 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceGray "
        b"/BitsPerComponent 1 /Filter /FlateDecode /Length %d >>\nstream\n%s\nendstream"
        % (width, height, len(pixels), pixels),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
    ]
    return assemble(objects)


def test_an_image_on_a_scanned_pdf_page_over_the_limit_is_refused() -> None:
    with pytest.raises(ParseError) as refused:
        parse_pdf(pdf_with_image(20_000, 20_000), LIMITS)
    assert str(refused.value).startswith(too_large("page 1: ", 20_000, 20_000))


def test_with_ocr_off_a_pdf_page_image_is_never_decoded_nor_refused() -> None:
    off = DocumentLimits(max_pages=20, max_chars=1_000_000, ocr="off")
    assert parse_pdf(pdf_with_image(20_000, 20_000), off).text == ""
