"""PPTX: each slide a `# <title>` section with its text, bullets, tables and speaker notes.

A slide's section starts with its title (`# Slide N` when it has none), so every slide has
text and its number (but an empty slide: it has no text, and starts where the text so far
ends): `page_starts` holds one start per slide and `page_unit` is "slide", for citations such
as `slide 4`. Then its shapes in the order the slide stores them (groups
opened): text frames as paragraphs, with the paragraphs of a bulleted body (or with a bullet
of their own) as `- ` items indented by their level; tables as Markdown tables, the first
non-empty row the header (a table of one row or one column, a box around text, as
paragraphs); a chart as a paragraph `Chart: <its title>` with its axes' titles, the words a
reader sees on it (its numbers are in the workbook embedded behind it, not on the slide's
text); pictures have no text to give. The speaker notes close the slide as a paragraph that
starts `Notes: `.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator

import pptx
from pptx.chart.axis import AxisTitle, _BaseAxis
from pptx.chart.chart import Chart, ChartTitle
from pptx.enum.shapes import MSO_SHAPE_TYPE, PP_PLACEHOLDER
from pptx.shapes.base import BaseShape
from pptx.slide import Slide
from pptx.table import Table
from pptx.text.text import TextFrame, _Paragraph

from ingest.loaders.archives import open_archive
from ingest.loaders.cleaning import clean_text, clean_title, collapse
from ingest.loaders.markdown_text import MarkdownText, too_many_pages
from ingest.loaders.parsing import Parsed, bad_content
from ingest.loaders.tables import markdown_table
from ragservice.limits.documents import DocumentLimits

# Placeholders whose paragraphs are bullets unless a paragraph says otherwise (`a:buNone`).
_BULLETED = (PP_PLACEHOLDER.BODY, PP_PLACEHOLDER.OBJECT, PP_PLACEHOLDER.VERTICAL_BODY)
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"


def parse_pptx(data: bytes, limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid PPTX file"):
        open_archive(data, "PPTX")  # refuses a zip bomb before python-pptx unpacks it
        deck = pptx.Presentation(io.BytesIO(data))
        slides = list(deck.slides)
        if len(slides) > limits.max_pages:
            raise too_many_pages(len(slides), "slides", limits)
        out = MarkdownText(limits)
        starts = [_slide(out, number, slide) for number, slide in enumerate(slides, start=1)]
        first = _slide_title(slides[0]) if slides else None
        title = clean_title(deck.core_properties.title) or clean_title(first)
    metadata = {"slides": len(slides)}
    return Parsed(out.text(), title, "markdown", metadata, tuple(starts), "slide")


def _slide(out: MarkdownText, number: int, slide: Slide) -> int:
    """Write one slide's section; where it starts. A slide with nothing on it (no title, no
    text, no notes) writes nothing and starts where the text so far ends, as an empty PDF
    page does: a lone `# Slide 5` would be a chunk of nothing."""
    title = _slide_title(slide)
    heading = slide.shapes.title
    blocks = [block for block in _blocks(slide.shapes, heading) if block.strip()]
    notes = _notes(slide)
    if not (title or blocks or notes):
        return out.end
    start = out.heading(1, title or f"Slide {number}")
    for block in [*blocks, notes]:
        out.add(block)
    return start


def _notes(slide: Slide) -> str:
    if not slide.has_notes_slide:
        return ""
    frame = slide.notes_slide.notes_text_frame
    notes = "\n".join(collapse(p.text) for p in frame.paragraphs).strip() if frame else ""
    return "Notes: " + notes if notes else ""


def _slide_title(slide: Slide) -> str | None:
    shape = slide.shapes.title
    if shape is None:
        return None
    return collapse(clean_text(shape.text_frame.text)) or None


def _blocks(shapes: Iterable[BaseShape], title: BaseShape | None) -> Iterator[str]:
    """The text blocks of `shapes` but the `title` (the slide's heading), in their order;
    groups opened."""
    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            yield from _blocks(shape.shapes, title)  # type: ignore[attr-defined]
        elif getattr(shape, "has_table", False):
            yield _table(shape.table)  # type: ignore[attr-defined]
        elif getattr(shape, "has_chart", False):
            yield _chart(shape.chart)  # type: ignore[attr-defined]
        elif shape.has_text_frame and (title is None or shape.shape_id != title.shape_id):
            yield _text_frame(shape.text_frame, _bulleted(shape))  # type: ignore[attr-defined]


def _bulleted(shape: BaseShape) -> bool:
    return shape.is_placeholder and shape.placeholder_format.type in _BULLETED


def _text_frame(frame: TextFrame, bulleted: bool) -> str:
    lines: list[str] = []
    for paragraph in frame.paragraphs:
        text = collapse(clean_text(paragraph.text))
        if not text:
            continue
        if _has_bullet(paragraph, bulleted):
            lines.append("  " * paragraph.level + "- " + text)
        else:
            lines.append(("\n" if lines else "") + text)  # a paragraph of its own
    return "\n".join(lines)


def _has_bullet(paragraph: _Paragraph, bulleted: bool) -> bool:
    """A paragraph's own bullet setting, else its placeholder's habit (or a nested level)."""
    properties = paragraph._p.pPr
    if properties is not None:
        if properties.find(_A + "buNone") is not None:
            return False
        if any(properties.find(_A + tag) is not None for tag in ("buChar", "buAutoNum")):
            return True
    return bulleted or paragraph.level > 0


def _table(table: Table) -> str:
    """A Markdown table, its first non-empty row the header (a merged cell's text in its
    first cell); a table of one row or one column as paragraphs."""
    rows = [[cell.text for cell in row.cells] for row in table.rows]
    found = markdown_table(rows)
    return found or "\n\n".join(collapse(clean_text(text)) for row in rows for text in row)


def _chart(chart: Chart) -> str:
    """`Chart: <title> (<axis title>, <axis title>)`, or "" for a chart without titles."""
    title = _title_text(chart.chart_title) if chart.has_title else ""
    axes = [_title_text(axis.axis_title) for axis in _axes(chart) if axis.has_title]
    named = [text for text in axes if text]
    if not title and not named:
        return ""
    return "Chart: " + " ".join([title, f"({', '.join(named)})" if named else ""]).strip()


def _title_text(title: ChartTitle | AxisTitle) -> str:
    return collapse(clean_text(title.text_frame.text)) if title.has_text_frame else ""


def _axes(chart: Chart) -> Iterator[_BaseAxis]:
    """The chart's category and value axes; a pie chart has none (python-pptx raises)."""
    for name in ("category_axis", "value_axis"):
        try:
            yield getattr(chart, name)
        except ValueError:
            continue
