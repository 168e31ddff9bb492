"""Office, spreadsheet and text-format files the tests build themselves: a deck, a workbook,
CSV and TSV, an ODT and an RTF, each small and with known content in a known order, the
places of a DOCX that python-docx's block iterator does not see, and zip bombs in office
clothing. (Real files nobody here wrote are in tests/realdocs.)"""

from __future__ import annotations

import datetime as dt
import io
import zipfile

import docx
import openpyxl
import pptx
from docx.oxml import parse_xml
from odf import dc, table, text
from odf.opendocument import OpenDocumentText
from pptx.chart.data import CategoryChartData
from pptx.enum.chart import XL_CHART_TYPE
from pptx.util import Inches

# --------------------------------------------------------------------------- PPTX

DECK_TITLE = "Quarterly Review"


def make_deck(core_title: str | None = None) -> bytes:
    """Five slides: a title slide, bullets with notes, a table, an untitled text box, and an
    empty slide (which has no text but keeps its number)."""
    deck = pptx.Presentation()
    if core_title is not None:
        deck.core_properties.title = core_title
    layouts = deck.slide_layouts
    first = deck.slides.add_slide(layouts[0])  # Title Slide
    first.shapes.title.text = DECK_TITLE
    first.placeholders[1].text = "Finance team"

    bullets = deck.slides.add_slide(layouts[1])  # Title and Content
    bullets.shapes.title.text = "Highlights"
    body = bullets.placeholders[1].text_frame
    body.text = "Revenue grew 12%"
    for words, level in (("Europe led", 1), ("Costs stayed flat", 0)):
        paragraph = body.add_paragraph()
        paragraph.text, paragraph.level = words, level
    bullets.notes_slide.notes_text_frame.text = "Mention the Europe numbers."

    numbers = deck.slides.add_slide(layouts[5])  # Title Only
    numbers.shapes.title.text = "Numbers"
    shape = numbers.shapes.add_table(3, 3, Inches(1), Inches(2), Inches(6), Inches(2))
    for r, row in enumerate([["Region", "Q2", "Q3"], ["Europe", "10", "12"], ["A|B", "8", "9"]]):
        for c, value in enumerate(row):
            shape.table.cell(r, c).text = value

    closing = deck.slides.add_slide(layouts[6])  # Blank
    box = closing.shapes.add_textbox(Inches(1), Inches(1), Inches(4), Inches(1))
    box.text_frame.text = "Closing remarks"
    deck.slides.add_slide(layouts[6])  # empty
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def make_chart_deck() -> bytes:
    """One slide with nothing but a chart titled "Revenue by region", its axes titled
    "Quarter" and "EUR", and one slide with a table of one row."""
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[6])  # Blank
    data = CategoryChartData()
    data.categories = ["Q1", "Q2"]
    data.add_series("Europe", (10.0, 12.0))
    kind, box = XL_CHART_TYPE.COLUMN_CLUSTERED, (Inches(1), Inches(1), Inches(6), Inches(4))
    chart = slide.shapes.add_chart(kind, *box, data).chart
    chart.has_title = True
    chart.chart_title.text_frame.text = "Revenue by region"
    for axis, title in ((chart.category_axis, "Quarter"), (chart.value_axis, "EUR")):
        axis.has_title = True
        axis.axis_title.text_frame.text = title
    boxed = deck.slides.add_slide(deck.slide_layouts[6])
    shape = boxed.shapes.add_table(1, 2, Inches(1), Inches(1), Inches(6), Inches(1))
    shape.table.cell(0, 0).text, shape.table.cell(0, 1).text = "Left words", "Right words"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


# --------------------------------------------------------------------------- DOCX

_WORD_NS = (
    'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main" '
    'xmlns:mc="http://schemas.openxmlformats.org/markup-compatibility/2006" '
    'xmlns:wps="http://schemas.microsoft.com/office/word/2010/wordprocessingShape" '
    'xmlns:v="urn:schemas-microsoft-com:vml"'
)
_WRAPPED_BLOCKS = (
    # A block-level content control, as Word writes a cover page or a form field.
    "<w:sdt><w:sdtContent><w:p><w:r><w:t>Inside a content control</w:t></w:r></w:p>"
    "</w:sdtContent></w:sdt>",
    # A tracked insertion and a tracked deletion.
    "<w:p><w:r><w:t xml:space='preserve'>Kept </w:t></w:r><w:ins><w:r><w:t>inserted</w:t>"
    "</w:r></w:ins><w:del><w:r><w:delText>deleted</w:delText></w:r></w:del></w:p>",
    # A text box anchored in a paragraph, with the fallback copy Word writes beside it.
    "<w:p><w:r><w:t>Anchor</w:t></w:r><w:r><mc:AlternateContent><mc:Choice Requires='wps'>"
    "<w:drawing><wps:txbx><w:txbxContent><w:p><w:r><w:t>Boxed words</w:t></w:r></w:p>"
    "</w:txbxContent></wps:txbx></w:drawing></mc:Choice><mc:Fallback><w:pict><v:textbox>"
    "<w:txbxContent><w:p><w:r><w:t>Boxed words</w:t></w:r></w:p></w:txbxContent>"
    "</v:textbox></w:pict></mc:Fallback></mc:AlternateContent></w:r></w:p>",
)


def make_wrapped_docx() -> bytes:
    """A DOCX whose body holds a content control, tracked changes and a text box (with its
    fallback copy), after a plain first paragraph."""
    document = docx.Document()
    document.add_paragraph("Plain first")
    body = document.element.body
    for xml in _WRAPPED_BLOCKS:
        tag, rest = xml.split(">", 1)  # the namespaces go on each block's root element
        body.insert(len(body) - 1, parse_xml(f"{tag} {_WORD_NS}>{rest}"))  # before sectPr
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


# --------------------------------------------------------------------------- XLSX

Q3_ROWS = 45  # data rows below the header, rows 2 to 46
BLANK_ROW = 30
Q3_TOTAL = sum((row - 1) * 10 for row in range(2, Q3_ROWS + 2) if row != BLANK_ROW)
"""The total row's formula's cached value."""


def q3_item(row: int) -> str:
    return f"item {row}"


def make_workbook(*, cached_total: bool = True) -> bytes:
    """Two sheets: "Summary" (a table starting at column B, with a date, a float, a whole
    float and a boolean) and "Q3" (a header and `Q3_ROWS` rows, a blank row `BLANK_ROW`, a total row
    whose SUM formula has `Q3_TOTAL` as its cached value, as Excel would save it)."""
    book = openpyxl.Workbook()
    summary = book.active
    summary.title = "Summary"
    summary.append([None, "Metric", "Value"])
    summary.append([None, "Opened", dt.datetime(2024, 7, 1)])
    summary.append([None, "Ratio", 2.5])
    summary.append([None, "Count", 3.0])
    summary.append([None, "Audited", True])
    q3 = book.create_sheet("Q3")
    q3.append(["Item", "Amount", "Note"])
    for row in range(2, Q3_ROWS + 2):
        if row != BLANK_ROW:
            q3.append([q3_item(row), (row - 1) * 10, "pipe | inside" if row == 12 else None])
        else:
            q3.append([])
    total_row = Q3_ROWS + 2
    q3.cell(total_row, 1, "Total")
    q3.cell(total_row, 2, f"=SUM(B2:B{total_row - 1})")
    book.properties.title = "Results 2024"
    out = io.BytesIO()
    book.save(out)
    if not cached_total:
        return out.getvalue()
    # openpyxl saves a formula without a value; Excel saves the value it computed beside it.
    formula = f"<f>SUM(B2:B{total_row - 1})</f><v></v>".encode()
    cached = f"<f>SUM(B2:B{total_row - 1})</f><v>{Q3_TOTAL}</v>".encode()
    return rewrite_member(out.getvalue(), "xl/worksheets/sheet2.xml", formula, cached)


def rewrite_member(data: bytes, name: str, old: bytes, new: bytes) -> bytes:
    """The zip archive `data` with `old` replaced by `new` in member `name` (which must hold it)."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as source, zipfile.ZipFile(out, "w") as target:
        for member in source.infolist():
            body = source.read(member)
            if member.filename == name:
                assert old in body, (name, old)
                body = body.replace(old, new)
            target.writestr(member, body)
    return out.getvalue()


# --------------------------------------------------------------------------- CSV and TSV

CSV_TEXT = (
    "city;population;note\r\n"
    "Oslo;709000;capital\r\n"
    '"Bergen";291000;"rainy; ""wet"""\r\n'
    "\r\n"
    "Tromsø;77000;north|far\r\n"
)
TSV_TEXT = "name\tscore\nada\t10\nbob\t\n\ncy\t7\n"

# --------------------------------------------------------------------------- ODT


def make_odt() -> bytes:
    """A title in the metadata, two headings, paragraphs, a list and a table."""
    document = OpenDocumentText()
    document.meta.addElement(dc.Title(text="Field Notes"))
    body = document.text
    body.addElement(text.H(outlinelevel=1, text="Introduction"))
    body.addElement(text.P(text="The first paragraph."))
    body.addElement(text.H(outlinelevel=2, text="Details"))
    items = text.List()
    for words in ("alpha point", "beta point"):
        item = text.ListItem()
        item.addElement(text.P(text=words))
        items.addElement(item)
    body.addElement(items)
    grid = table.Table(name="Sizes")
    grid.addElement(table.TableColumn(numbercolumnsrepeated=2))
    for cells in (["Kind", "Size"], ["small", "1"], ["large", "9"]):
        row = table.TableRow()
        for value in cells:
            cell = table.TableCell()
            cell.addElement(text.P(text=value))
            row.addElement(cell)
        grid.addElement(row)
    body.addElement(grid)
    body.addElement(text.P(text="The last paragraph."))
    out = io.BytesIO()
    document.write(out)
    return out.getvalue()


# --------------------------------------------------------------------------- RTF

RTF_TEXT = (
    r"{\rtf1\ansi\deff0{\fonttbl{\f0 Times;}}{\info{\title Memo Title}}"
    r"\f0 Dear team,\par The caf\'e9 opens at nine.\par {\b Bold} words.\par}"
)

# --------------------------------------------------------------------------- zip bombs


def with_zeros_member(data: bytes, name: str, megabytes: int = 20) -> bytes:
    """`data` (a zip archive) with one more member of zeros: about 1000:1 packed."""
    buffer = io.BytesIO(data)
    with (
        zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive,
        archive.open(name, "w") as member,
    ):
        for _ in range(megabytes):
            member.write(bytes(2**20))
    return buffer.getvalue()


def with_many_packed_members(data: bytes, folder: str, count: int = 24) -> bytes:
    """`data` with `count` members of 1 MiB of well-packed XML each: too little for the
    per-member check, far too much together for the file's size."""
    buffer = io.BytesIO(data)
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        for i in range(count):
            archive.writestr(f"{folder}/packed{i}.xml", b"<a/>" * (2**20 // 4))
    return buffer.getvalue()
