"""Office, spreadsheet and CSV fidelity: each real file's words as the loader gives them against
the full text of the library that reads the format, and whether the loader accepts the file.

The references (`reference_places`) are each library's own view of everything a reader could
want from the file, independent of this project's loaders:

- DOCX (python-docx): every paragraph of the body, tables (nested ones too) and text boxes
  included, each once (a text box's fallback copy for old readers left out), and every header
  and footer part, once each: a header is written once per section, not once per page, and
  holds what a person reads there (a title, a company, "Draft"). Equations (OMML), which
  python-docx does not read but Word, LibreOffice and pandoc show, are added from their XML.
- PPTX (python-pptx): per slide, every shape's text frame, groups opened, every table cell,
  each chart's title and axis titles, and the speaker notes.
- XLSX (openpyxl, `data_only`: the values Excel cached for formulas): per sheet, every cell's
  value; a date at midnight as its date, a whole float as an integer (`_cell_value`).
- CSV and TSV (the csv module): every field, split on commas (tabs for a TSV). Words are runs
  of letters and digits, so a file split on the wrong delimiter still yields its words.
- ODT (odfpy): `teletype.extractText` of each paragraph and heading of the body (of the body
  whole, it runs the last word of a paragraph into the next one's first), the table of
  contents, footnotes and comments included.
- RTF (striprtf): `rtf_to_text`.

A file is accepted when the reader gives text; a refusal (or no text) of a file whose library
reads words from it is a file lost. The alternatives cannot be credited with places, so only
this project's loader gets a `place_recall`.

Words are compared as multisets (`words.word_score`): recall is the share of the reference's
words the loader gave, precision the share of the loader's words in the reference (headings
such as `# Slide 3` and `Notes:` are the loader's own). For decks and workbooks, `place_recall`
counts only the words found on the right slide or sheet (the loader's text cut at its
`page_starts`), the place a citation names.

`measure_all(read)` runs any reader (`Callable[[Path], str]`, e.g. markitdown's) through the
same measure; without one it runs this project's loaders. It returns one JSON-able dict per
file and a summary dict.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.realdocs.fidelity.words import WordScore, total, word_score, words
from tests.realdocs.sources import ROOT, sources

FOLDERS = ("office", "sheets")
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_M = "{http://schemas.openxmlformats.org/officeDocument/2006/math}"
_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"
Reader = Callable[[Path], str]
"""Another library under test: a file's path to its whole text."""

Place = tuple[str, str]
"""(the place's name: `slide 3`, `sheet "Q3"`, or "" for a document without places, its text)"""


# -- the libraries' own texts ------------------------------------------------------------------


def reference_places(path: Path) -> list[Place]:
    """The library's full text of the file, per slide or sheet where it has them."""
    kind = path.suffix.lower()
    if kind == ".pptx":
        return _pptx_reference(path)
    if kind == ".xlsx":
        return _xlsx_reference(path)
    readers: dict[str, Callable[[Path], str]] = {
        ".docx": _docx_reference,
        ".csv": _csv_reference,
        ".tsv": _csv_reference,
        ".odt": _odt_reference,
        ".rtf": _rtf_reference,
    }
    return [("", readers[kind](path))]


def reference_text(path: Path) -> str:
    return "\n".join(text for _, text in reference_places(path))


def _docx_reference(path: Path) -> str:
    import docx
    from docx.opc.constants import RELATIONSHIP_TYPE as RT
    from docx.text.paragraph import Paragraph

    document = docx.Document(str(path))
    parts = [document.element.body]
    for relation in document.part.rels.values():
        if relation.reltype in (RT.HEADER, RT.FOOTER) and not relation.is_external:
            parts.append(relation.target_part.element)
    paragraphs = [
        f"{Paragraph(p, document.part).text} {_equations(p)}"
        for part in parts
        for p in part.iter(_W + "p")
        if not any(above.tag == _FALLBACK for above in p.iterancestors())
    ]
    return "\n".join(paragraphs)


def _equations(paragraph: Any) -> str:
    """The text of a paragraph's equations (OMML), which python-docx does not read, each as
    Word shows it: its runs' text run together ("x+a")."""
    equations = (
        "".join(t.text or "" for t in math.iter(_M + "t"))
        for math in paragraph.iter(_M + "oMath")
        if next(math.iterancestors(_W + "p")) is paragraph
    )
    return " ".join(equations)


def _pptx_reference(path: Path) -> list[Place]:
    import pptx

    deck = pptx.Presentation(str(path))
    places: list[Place] = []
    for number, slide in enumerate(deck.slides, start=1):
        texts = list(_pptx_shapes(slide.shapes))
        if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
            texts.append(slide.notes_slide.notes_text_frame.text)
        places.append((f"slide {number}", "\n".join(texts)))
    return places


def _pptx_shapes(shapes: Iterable[Any]) -> Iterable[str]:
    from pptx.enum.shapes import MSO_SHAPE_TYPE

    for shape in shapes:
        if shape.shape_type == MSO_SHAPE_TYPE.GROUP:
            yield from _pptx_shapes(shape.shapes)
        elif shape.has_text_frame:
            yield shape.text_frame.text
        elif getattr(shape, "has_table", False):
            yield from (cell.text for row in shape.table.rows for cell in row.cells)
        elif getattr(shape, "has_chart", False):
            yield from _chart_titles(shape.chart)


def _chart_titles(chart: Any) -> Iterable[str]:
    titles = [chart.chart_title] if chart.has_title else []
    for name in ("category_axis", "value_axis"):
        try:
            axis = getattr(chart, name)
        except ValueError:  # a pie chart has no axes
            continue
        titles += [axis.axis_title] if axis.has_title else []
    return [title.text_frame.text for title in titles if title.has_text_frame]


def _xlsx_reference(path: Path) -> list[Place]:
    import openpyxl

    try:
        book = openpyxl.load_workbook(str(path), data_only=True)
    except KeyError:
        # A part the workbook names is missing (a drawing): read-only mode reads no drawings.
        book = openpyxl.load_workbook(str(path), data_only=True, read_only=True)
    try:
        places: list[Place] = []
        for sheet in book.worksheets:
            if hasattr(sheet, "reset_dimensions"):
                sheet.reset_dimensions()  # read-only: a declared dimension may cut rows short
            rows = sheet.iter_rows(values_only=True)
            places.append((f'sheet "{sheet.title}"', _sheet_text(rows)))
        return places
    finally:
        book.close()


def _sheet_text(rows: Iterable[Sequence[object]]) -> str:
    return "\n".join(" ".join(_cell_value(value) for value in row) for row in rows)


def _cell_value(value: object) -> str:
    """A value as a spreadsheet shows it by default: `12` for 12.0, a date without a time of
    midnight, anything else as Python writes it."""
    if value is None:
        return ""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, dt.datetime) and value.time() == dt.time():
        return value.date().isoformat()
    return str(value)


def _decoded(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")


def _csv_reference(path: Path) -> str:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    text = _decoded(path.read_bytes())
    rows = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    return "\n".join(" ".join(row) for row in rows)


def _odt_reference(path: Path) -> str:
    from odf.opendocument import load

    return "\n".join(_odt_paragraphs(load(str(path)).text))


def _odt_paragraphs(element: Any) -> Iterable[str]:
    """`teletype.extractText` of each paragraph and heading: of the body as a whole, it
    glues the last word of a paragraph to the first of the next."""
    from odf import teletype
    from odf.namespaces import TEXTNS

    for node in element.childNodes:
        if getattr(node, "qname", None) in ((TEXTNS, "p"), (TEXTNS, "h")):
            yield str(teletype.extractText(node))
        elif getattr(node, "childNodes", None):
            yield from _odt_paragraphs(node)


def _rtf_reference(path: Path) -> str:
    from striprtf.striprtf import rtf_to_text

    text = rtf_to_text(_decoded(path.read_bytes()), errors="replace")  # type: ignore[no-untyped-call]
    return str(text)


# -- this project's loaders --------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    """What the loader made of a file: its text cut at its places, or why it refused it."""

    places: list[Place]
    refused: str = ""

    @property
    def text(self) -> str:
        return "\n\n".join(text for _, text in self.places)


def load(path: Path) -> Loaded:
    """The file through this project's parser for its suffix (in this process, as the
    sandbox's child runs it), cut at its slides or sheets."""
    from ingest.loaders.parsing import ParseError
    from ingest.loaders.sandbox import PARSERS
    from ragservice.limits.documents import DocumentLimits

    limits = DocumentLimits(max_pages=2000, max_chars=50_000_000, ocr="off")
    parse = PARSERS[path.suffix.lower()][1]
    try:
        parsed = parse(path.read_bytes(), limits)
    except ParseError as exc:
        return Loaded([], str(exc))
    if not parsed.text.strip():
        return Loaded([], "no text")
    if parsed.page_unit == "page" or len(parsed.page_starts) < 1:
        return Loaded([("", parsed.text)])
    bounds = [*parsed.page_starts, len(parsed.text)]
    places = [
        (_place_name(parsed.page_unit, i, parsed.page_names), parsed.text[start : bounds[i + 1]])
        for i, start in enumerate(parsed.page_starts)
    ]
    return Loaded(places)


def _place_name(unit: str, index: int, names: Sequence[str]) -> str:
    if unit == "slide":
        return f"slide {index + 1}"
    return f'sheet "{names[index]}"' if index < len(names) and names[index] else ""


# -- the measure -------------------------------------------------------------------------------


@dataclass
class OfficeFidelity:
    file: str
    accepted: bool
    refused: str = ""
    places: int = 0
    seconds: float = 0.0
    score: WordScore = field(default_factory=lambda: WordScore(0, 0, 0))
    place_score: WordScore | None = None
    worst_places: list[tuple[str, float]] = field(default_factory=list)
    reference_error: str = ""

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "file": self.file,
            "accepted": self.accepted,
            "refused": self.refused,
            "places": self.places,
            "seconds": round(self.seconds, 4),
            "reference_words": self.score.reference,
            "recall": round(self.score.recall, 4),
            "precision": round(self.score.precision, 4),
        }
        if self.reference_error:
            found["reference_error"] = self.reference_error
        if self.place_score is not None:
            found["place_recall"] = round(self.place_score.recall, 4)
            found["worst_places"] = [[name, round(r, 4)] for name, r in self.worst_places[:3]]
        return found


def files(folders: Sequence[str] = FOLDERS) -> list[Path]:
    return [source.path for source in sources(folders)]


def measure(path: Path, read: Reader | None = None) -> OfficeFidelity:
    """Every measure of one file, read by `read` (None: this project's loader)."""
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    try:
        reference = reference_places(path)
    except Exception as exc:  # the library cannot read it: nothing to measure against
        return OfficeFidelity(name, False, reference_error=f"{type(exc).__name__}: {exc}")
    started = time.perf_counter()
    if read is None:
        loaded = load(path)
    else:
        try:
            text = read(path)
            loaded = Loaded([("", text)] if text.strip() else [], "" if text.strip() else "no text")
        except Exception as exc:  # another library's failure is its refusal
            loaded = Loaded([], f"{type(exc).__name__}: {exc}")
    seconds = time.perf_counter() - started
    result = OfficeFidelity(name, not loaded.refused, loaded.refused, len(reference), seconds)
    theirs = [word for _, text in reference for word in words(text)]
    result.score = word_score(words(loaded.text), theirs)
    if read is None and any(place for place, _ in reference):
        _places(result, reference, loaded)
    return result


def _places(result: OfficeFidelity, reference: list[Place], loaded: Loaded) -> None:
    ours = {place: text for place, text in loaded.places}
    scores: list[WordScore] = []
    for place, text in reference:
        score = word_score(words(ours.get(place, "")), words(text))
        scores.append(score)
        if score.reference:
            result.worst_places.append((place, score.recall))
    result.worst_places.sort(key=lambda item: item[1])
    result.place_score = total(scores)


def summary(results: Sequence[OfficeFidelity]) -> dict[str, Any]:
    """The measures over all files: words summed over files (micro), the mean and the worst
    file recall, and the files refused."""
    scores = [r.score for r in results]
    overall = total(scores)
    placed = [r.place_score for r in results if r.place_score is not None]
    recalls = [s.recall for s in scores]
    return {
        "files": len(results),
        "accepted": sum(r.accepted for r in results),
        "refused": [r.file for r in results if not r.accepted],
        "reference_words": overall.reference,
        "recall": round(overall.recall, 4),
        "precision": round(overall.precision, 4),
        "mean_recall": round(sum(recalls) / len(recalls), 4) if recalls else 1.0,
        "worst_recall": round(min(recalls), 4) if recalls else 1.0,
        "place_recall": round(total(placed).recall, 4) if placed else None,
        "seconds": round(sum(r.seconds for r in results), 3),
    }


def measure_all(
    read: Reader | None = None, paths: Iterable[Path] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each corpus file (or `paths`) read by `read` (None: this project's loaders): one dict
    per file and the summary."""
    results = [measure(path, read) for path in (paths if paths is not None else files())]
    return [result.as_json() for result in results], summary(results)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="files (default: the corpus)")
    args = parser.parse_args(argv)
    per_file, overall = measure_all(None, [p.resolve() for p in args.paths] or None)
    for item in per_file:
        print(json.dumps(item))
    print(json.dumps(overall))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
