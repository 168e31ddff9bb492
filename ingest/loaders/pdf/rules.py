"""The lines a PDF page draws, read by pdfium, and the ruled tables they make.

Every straight horizontal or vertical stroke of the page's path objects (and of the forms it
shows) is a rule: a table's grid, a box around text, a footnote or booktabs rule. The object's
points are in its own space, mapped to the page by its matrix (and by each enclosing form's).
Ruled tables are found from the rules as pdfplumber's "lines" strategy finds them (its edge
merging, intersections and cells, which need no more than the edges), without parsing the page
a second time with pdfminer: the cells are then filled with pdfium's words (`tables`).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pypdfium2
import pypdfium2.raw as pdfium_c
from pdfplumber import table as plumber_table

_STRAIGHT = 1.0  # points: a segment this far from level (or plumb) still counts as straight
_MIN_RULE = 3.0  # points: pdfplumber's default `edge_min_length`
_TOLERANCE = 3.0  # points: pdfplumber's default snap, join and intersection tolerances
_MAX_SEGMENTS = 20_000  # a page drawing more is a figure: its rules are not read
_MAX_EDGES = 400  # per orientation, after merging: more is a chart or a drawing, not a table
_MAX_FORM_DEPTH = 8

_Matrix = tuple[float, float, float, float, float, float]
_IDENTITY: _Matrix = (1.0, 0.0, 0.0, 1.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class Rule:
    """A straight stroke, top-down in points (`top = -y`): horizontal when `top == bottom`."""

    x0: float
    x1: float
    top: float
    bottom: float

    @property
    def horizontal(self) -> bool:
        return self.bottom - self.top < self.x1 - self.x0


@dataclass(frozen=True, slots=True)
class Grid:
    """A ruled table: its rows of cell boxes (x0, top, x1, bottom), None where a merged cell
    covers the position."""

    rows: tuple[tuple[tuple[float, float, float, float] | None, ...], ...]
    x0: float
    x1: float
    top: float
    bottom: float


def page_rules(page: pypdfium2.PdfPage) -> list[Rule]:
    """The page's straight strokes, at least `_MIN_RULE` long."""
    rules: list[Rule] = []
    segments = 0
    for obj, matrix in _path_objects(page):
        rules.extend(_object_rules(obj, matrix))
        segments += pdfium_c.FPDFPath_CountSegments(obj)
        if segments > _MAX_SEGMENTS:
            return []
    return rules


def _path_objects(page: pypdfium2.PdfPage) -> Iterator[tuple[Any, _Matrix]]:
    """Each path object with the matrix that takes its points to the page."""
    raw = page.raw
    count = pdfium_c.FPDFPage_CountObjects(raw)
    objects = [pdfium_c.FPDFPage_GetObject(raw, i) for i in range(count)]
    # (object, the matrix of the forms around it, how deep in forms it is)
    stack: list[tuple[Any, _Matrix, int]] = [(obj, _IDENTITY, 0) for obj in reversed(objects)]
    while stack:
        obj, outer, depth = stack.pop()
        kind = pdfium_c.FPDFPageObj_GetType(obj)
        if kind == pdfium_c.FPDF_PAGEOBJ_PATH:
            yield obj, _compose(_matrix(obj), outer)
        elif kind == pdfium_c.FPDF_PAGEOBJ_FORM and depth < _MAX_FORM_DEPTH:
            inner = _compose(_matrix(obj), outer)
            children = pdfium_c.FPDFFormObj_CountObjects(obj)
            for index in reversed(range(max(0, children))):
                child = pdfium_c.FPDFFormObj_GetObject(obj, index)
                if child:
                    stack.append((child, inner, depth + 1))


def _matrix(obj: Any) -> _Matrix:
    found = pdfium_c.FS_MATRIX()
    if not pdfium_c.FPDFPageObj_GetMatrix(obj, ctypes.byref(found)):
        return _IDENTITY
    return (found.a, found.b, found.c, found.d, found.e, found.f)


def _compose(inner: _Matrix, outer: _Matrix) -> _Matrix:
    """The matrix that applies `inner`, then `outer` (PDF's row-vector convention)."""
    a, b, c, d, e, f = inner
    a2, b2, c2, d2, e2, f2 = outer
    return (
        a * a2 + b * c2,
        a * b2 + b * d2,
        c * a2 + d * c2,
        c * b2 + d * d2,
        e * a2 + f * c2 + e2,
        e * b2 + f * d2 + f2,
    )


def _apply(matrix: _Matrix, x: float, y: float) -> tuple[float, float]:
    a, b, c, d, e, f = matrix
    return a * x + c * y + e, b * x + d * y + f


def _object_rules(obj: Any, matrix: _Matrix) -> Iterator[Rule]:
    """The straight segments of one path object: each line-to from the point before, and the
    closing segment of a closed subpath (a rectangle's fourth side)."""
    x, y = ctypes.c_float(), ctypes.c_float()
    start = current = (0.0, 0.0)
    for index in range(pdfium_c.FPDFPath_CountSegments(obj)):
        segment = pdfium_c.FPDFPath_GetPathSegment(obj, index)
        if not segment or not pdfium_c.FPDFPathSegment_GetPoint(segment, x, y):
            continue
        point = _apply(matrix, x.value, y.value)
        kind = pdfium_c.FPDFPathSegment_GetType(segment)
        if kind == pdfium_c.FPDF_SEGMENT_MOVETO:
            start = point
        elif kind == pdfium_c.FPDF_SEGMENT_LINETO:
            yield from _straight(current, point)
        if pdfium_c.FPDFPathSegment_GetClose(segment):
            yield from _straight(point, start)
            point = start
        current = point


def _straight(a: tuple[float, float], b: tuple[float, float]) -> Iterator[Rule]:
    (xa, ya), (xb, yb) = a, b
    if abs(ya - yb) <= _STRAIGHT and abs(xa - xb) >= _MIN_RULE:
        top = -(ya + yb) / 2
        yield Rule(min(xa, xb), max(xa, xb), top, top)
    elif abs(xa - xb) <= _STRAIGHT and abs(ya - yb) >= _MIN_RULE:
        middle = (xa + xb) / 2
        yield Rule(middle, middle, -max(ya, yb), -min(ya, yb))


# -- ruled tables ------------------------------------------------------------------------------


def ruled_grids(rules: Sequence[Rule]) -> list[Grid]:
    """The tables the rules draw (pdfplumber's lines strategy on these edges): at least two
    rows and two columns of cells."""
    edges = [_edge(rule) for rule in rules]
    if not any(e["orientation"] == "v" for e in edges):
        return []
    merged = plumber_table.merge_edges(edges, *([_TOLERANCE] * 4))
    merged = [e for e in merged if e["width" if e["orientation"] == "h" else "height"] >= _MIN_RULE]
    if max(_counts(merged)) > _MAX_EDGES:
        return []
    crossings = plumber_table.edges_to_intersections(merged, _TOLERANCE, _TOLERANCE)
    cells = plumber_table.intersections_to_cells(crossings)
    grids: list[Grid] = []
    for group in plumber_table.cells_to_tables(cells):
        rows = tuple(tuple(row.cells) for row in plumber_table.Table(None, group).rows)  # type: ignore[arg-type]
        if len(rows) >= 2 and max(len(row) for row in rows) >= 2:
            x0, top, x1, bottom = plumber_table.Table(None, group).bbox  # type: ignore[arg-type]
            grids.append(Grid(rows, float(x0), float(x1), float(top), float(bottom)))
    return grids


def _edge(rule: Rule) -> dict[str, Any]:
    orientation = "h" if rule.horizontal else "v"
    return {
        "x0": rule.x0,
        "x1": rule.x1,
        "top": rule.top,
        "bottom": rule.bottom,
        "width": rule.x1 - rule.x0,
        "height": rule.bottom - rule.top,
        "orientation": orientation,
        "object_type": "line",
    }


def _counts(edges: Sequence[dict[str, Any]]) -> tuple[int, int]:
    vertical = sum(1 for e in edges if e["orientation"] == "v")
    return vertical, len(edges) - vertical
