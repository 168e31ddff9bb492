"""Generated PDFs, images and a DOCX for the table, reading-order and OCR tests (and the
benchmarks): fpdf2 writes the PDFs, Pillow draws the "scans"; nothing binary is committed.

Each generator returns the file's bytes; the texts it holds are module constants, so a test
can compare what a loader reads back with what was written.
"""

from __future__ import annotations

import io
import random
from collections.abc import Sequence
from pathlib import Path

import docx
from fpdf import FPDF
from fpdf.fonts import FontFace
from PIL import Image, ImageDraw, ImageFont

TABLE_HEADER = ("Region", "Product", "Units", "Revenue")
TABLE_ROWS = [
    ("North", "Anvils", "120", "3400"),
    ("South", "Brackets", "75", "1210"),
    ("East", "Cables", "310", "2890"),
    ("West", "Dowels", "48", "560"),
    ("Central", "Engines", "9", "18200"),
    ("Islands", "Fittings", "260", "990"),
    ("Coast", "Gaskets", "133", "1475"),
]
BEFORE_TABLE = "The sales table below lists units and revenue for every region this year."
AFTER_TABLE = "Figures are unaudited and may change when the accounts are closed."

LEFT_COLUMN = [
    "Alpha one begins the left column with a sentence about rivers.",
    "Alpha two continues the left column and mentions mountain passes.",
    "Alpha three ends the left column with a note on harvest festivals.",
]
RIGHT_COLUMN = [
    "Omega one opens the right column and speaks of harbour cranes.",
    "Omega two follows in the right column about lighthouse keepers.",
    "Omega three closes the right column describing winter storms.",
]

SCAN_LINES = [
    "Scanned invoice number 4471",
    "Delivery of forty copper pipes",
    "Payment is due within thirty days",
]
PARAGRAPH = (
    "Ordinary paragraphs of running text must never be mistaken for a table, even when "
    "several lines in a row happen to share words at similar positions. This paragraph is "
    "long enough to wrap over many lines of the page, and it continues with more words so "
    "that the text strategy of the table finder sees a dense block of prose. Good loaders "
    "read it as plain text from the first word to the last one, in order."
)

_WORDS = (
    "the a river harbour market village council winter summer bridge garden mill "
    "farmer teacher doctor engine letter season morning evening north south quiet "
    "bright old new small large careful early late green stone copper timber wool "
    "grain salt built crossed opened counted carried painted measured repaired sold "
    "with from near under over after before between during"
)
_DEJAVU = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")


def _pdf() -> FPDF:
    pdf = FPDF(format="A4", unit="pt")
    pdf.set_auto_page_break(True, margin=40)
    pdf.set_font("Helvetica", size=11)
    return pdf


def _table(pdf: FPDF, rows: Sequence[Sequence[str]], ruled: bool) -> None:
    layout = "ALL" if ruled else "NONE"
    with pdf.table(
        borders_layout=layout,
        headings_style=FontFace(emphasis="BOLD"),
        line_height=16,
        text_align="LEFT",
    ) as table:
        for row in rows:
            line = table.row()
            for cell in row:
                line.cell(cell)


def table_pdf(ruled: bool = True) -> bytes:
    """One page: a sentence, the sales table (header and seven rows), a sentence."""
    pdf = _pdf()
    pdf.add_page()
    pdf.multi_cell(0, 16, BEFORE_TABLE)
    pdf.ln(10)
    _table(pdf, [TABLE_HEADER, *TABLE_ROWS], ruled)
    pdf.ln(10)
    pdf.multi_cell(0, 16, AFTER_TABLE)
    return bytes(pdf.output())


def long_table_rows(count: int) -> list[tuple[str, str, str]]:
    return [
        (f"item {i:03d}", f"part number {1000 + i}", f"{(i * 37) % 500} units")
        for i in range(count)
    ]


def long_table_pdf(count: int = 120) -> bytes:
    """A ruled table of `count` rows over several pages (fpdf2 repeats the header row on each)."""
    pdf = _pdf()
    pdf.add_page()
    _table(pdf, [("Item", "Part", "Stock"), *long_table_rows(count)], ruled=True)
    return bytes(pdf.output())


def paragraph_pdf() -> bytes:
    """Prose only: the table finder must find no table in it."""
    pdf = _pdf()
    pdf.add_page()
    for _ in range(3):
        pdf.multi_cell(0, 16, PARAGRAPH)
        pdf.ln(8)
    return bytes(pdf.output())


def two_column_pdf(title: str = "") -> bytes:
    """One page of two columns whose lines are written across the page, left line then right
    line at each height (as many PDF producers write them): the file's own order interleaves
    the columns, so only positions give the reading order. `title`: a line across both
    columns above them."""
    pdf = _pdf()
    pdf.add_page()
    if title:
        pdf.text(pdf.l_margin + 60, 50, title)
    width = (pdf.w - 2 * pdf.l_margin - 30) / 2
    columns = [_wrapped(pdf, LEFT_COLUMN, width), _wrapped(pdf, RIGHT_COLUMN, width)]
    for row in range(max(map(len, columns))):
        for x, lines in zip((pdf.l_margin, pdf.l_margin + width + 30), columns, strict=True):
            if row < len(lines) and lines[row]:
                pdf.text(x, 80 + row * 16, lines[row])
    return bytes(pdf.output())


def _wrapped(pdf: FPDF, sentences: Sequence[str], width: float) -> list[str]:
    """The sentences wrapped to `width`, an empty line between them (a paragraph gap)."""
    lines: list[str] = []
    for sentence in sentences:
        wrapped = pdf.multi_cell(width, 16, sentence, dry_run=True, output="LINES")
        lines.extend(wrapped if isinstance(wrapped, list) else [sentence])
        lines.append("")
    return lines


def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """DejaVu Sans where installed, else Pillow's bundled font (scalable since Pillow 10.1)."""
    if _DEJAVU.exists():
        return ImageFont.truetype(str(_DEJAVU), size)
    return ImageFont.load_default(size=size)


def text_image(lines: Sequence[str], dpi: int = 300, width_in: float = 8.27) -> Image.Image:
    """Black text on a white page at `dpi`: 12-point type, 1.5 lines apart, 1-inch margins."""
    size = round(12 * dpi / 72)
    lines = list(lines)
    height = int(2 * dpi + len(lines) * size * 1.5)
    image = Image.new("L", (int(width_in * dpi), height), 255)
    draw = ImageDraw.Draw(image)
    face = font(size)
    for i, line in enumerate(lines):
        draw.text((dpi, dpi + i * size * 1.5), line, fill=0, font=face)
    return image


def scanned_pdf(pages: Sequence[Sequence[str]] = (SCAN_LINES,), dpi: int = 300) -> bytes:
    """An image-only PDF (no text layer): each page is `text_image` of its lines."""
    images = [text_image(lines, dpi).convert("RGB") for lines in pages]
    out = io.BytesIO()
    images[0].save(out, "PDF", resolution=dpi, save_all=True, append_images=images[1:])
    return out.getvalue()


def text_png(lines: Sequence[str] = SCAN_LINES) -> bytes:
    out = io.BytesIO()
    text_image(lines).save(out, "PNG", dpi=(300, 300))
    return out.getvalue()


def text_tiff(pages: Sequence[Sequence[str]]) -> bytes:
    """A multi-frame TIFF, one frame per page."""
    images = [text_image(lines) for lines in pages]
    out = io.BytesIO()
    images[0].save(out, "TIFF", save_all=True, append_images=images[1:], dpi=(300, 300))
    return out.getvalue()


def table_docx() -> bytes:
    """A paragraph, then a table whose header spans a merged cell, then a paragraph."""
    document = docx.Document()
    document.add_paragraph(BEFORE_TABLE)
    table = document.add_table(rows=1 + 3, cols=3)
    header = ("Name", "Role | title", "Office")
    for col, text in enumerate(header):
        table.cell(0, col).text = text
    body = [("Ada", "Engineer", "Leeds"), ("Grace", "Admiral\nretired", "Arlington")]
    for row, values in enumerate(body, start=1):
        for col, text in enumerate(values):
            table.cell(row, col).text = text
    merged = table.cell(3, 0).merge(table.cell(3, 1))
    merged.text = "Shared desk"
    table.cell(3, 2).text = "Paris"
    document.add_paragraph(AFTER_TABLE)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def sentences(count: int, seed: int = 7) -> list[str]:
    """`count` plain sentences from a fixed word list (the same on every run)."""
    words = _WORDS.split()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        chosen = [rng.choice(words) for _ in range(rng.randint(6, 11))]
        out.append(" ".join(chosen).capitalize() + ".")
    return out
