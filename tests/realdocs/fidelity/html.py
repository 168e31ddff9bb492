"""HTML fidelity: the loader's text of each real page against trafilatura's main text and
against the page's whole visible text; the boilerplate it keeps.

- Main text: recall and precision (`words.word_score`) against `trafilatura.extract` of the
  page, with the options the loader's main-content selection gives it
  (`ingest.loaders.html_main.TRAFILATURA_OPTIONS`) and with trafilatura's defaults. The loader
  renders its own blocks where trafilatura decides, so it should keep every word trafilatura
  keeps (recall), and add little (precision: headings, list items, tables trafilatura drops).
- Visible text: what a browser shows of the page (`visible_text`: the body less scripts,
  styles, templates and hidden elements). Recall here counts the navigation too, so it is
  lower by design; it says how much of the page the main text is.
- Permalink signs: the "¶" (and every other sign: "§", "#", an icon font's glyph) of the
  anchors that link a heading to itself (`permalink_anchors`) found in the loader's text; and
  the "¶" in it, whatever their source.
- Navigation: the words only the page's navigation has (`navigation_text`: `nav`, `header`,
  `footer`, `aside`, the navigation roles, and the generators' own navigation classes) that the
  loader kept, out of all such words.

    python -m tests.realdocs.fidelity.html      # one JSON line per file, then the summary
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lxml.etree
import lxml.html
import trafilatura

from tests.realdocs.fidelity import print_rows
from tests.realdocs.fidelity.words import WordScore, total, word_score, words
from tests.realdocs.sources import ROOT, sources

HTML_FOLDER = ROOT / "html"

Reader = Callable[[Path], str]
"""An HTML reader under test: a corpus page to its text."""

INVISIBLE_TAGS = ("head", "script", "style", "noscript", "template")
_HIDDEN_STYLE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden", re.I)
# Elements that end a line where a browser shows the page (the rest flow inline).
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "caption", "dd", "div", "dl", "dt",
        "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header",
        "hr", "li", "main", "nav", "ol", "p", "pre", "section", "table", "tbody", "td", "tfoot",
        "th", "thead", "tr", "ul",
    }
)  # fmt: skip
NAVIGATION_TAGS = ("nav", "header", "footer", "aside")
NAVIGATION_ROLES = ("navigation", "banner", "contentinfo", "search")
NAVIGATION_NAMES = frozenset(
    {
        # Sphinx (basic, classic, python_docs_theme, alabaster), its Read the Docs theme
        "related", "sphinxsidebar", "footer", "wy-nav-side", "wy-breadcrumbs", "rst-footer-buttons",
        "rst-versions",
        # MkDocs (mkdocs theme, readthedocs theme)
        "navbar", "bs-sidebar", "wy-nav-top",
        # Javadoc (OpenJDK 17), Doxygen
        "flex-header", "top-nav", "sub-nav", "bottom-nav", "legal-copy", "nav-path",
        "main-nav", "titlearea",
        # DocBook XSL, makeinfo (texi2html's navigation is tables without a class)
        "navheader", "navfooter", "nav-panel",
    }
)  # fmt: skip
"""Classes and ids of the navigation that the generators in the corpus put around a page."""
PERMALINK_CLASSES = frozenset({"headerlink", "anchorlink", "anchor-link", "permalink"})
PERMALINK_SIGNS = frozenset("\u00b6\u00a7#\U0001f517\u2693\u25c6\ufe0e\ufe0f")


def html_names() -> list[str]:
    return [source.name for source in sources(("html",))]


# -- the references ----------------------------------------------------------------------------


def trafilatura_text(data: bytes, *, as_the_loader: bool) -> str:
    """trafilatura's main text of the page: with the options the loader gives it, or with
    trafilatura's defaults."""
    from ingest.loaders.html_main import TRAFILATURA_OPTIONS

    options: dict[str, Any] = dict(TRAFILATURA_OPTIONS) if as_the_loader else {}
    return trafilatura.extract(data, **options) or ""


def _page(data: bytes) -> Any:
    root = lxml.html.document_fromstring(data)
    for element in list(root.iter()):
        # Comments and processing instructions have no str tag; an element inside one
        # dropped already has gone with it.
        invisible = not isinstance(element.tag, str) or element.tag in INVISIBLE_TAGS
        if (invisible or _hidden(element)) and element.getparent() is not None:
            element.drop_tree()
    return root


def _hidden(element: Any) -> bool:
    return (
        element.get("hidden") is not None
        or element.get("aria-hidden", "").lower() == "true"
        or _HIDDEN_STYLE.search(element.get("style", "")) is not None
    )


def _text(element: Any) -> str:
    """The element's text with a line break where a block starts or ends (lxml's
    `text_content` glues `<p>a</p><p>b</p>` into one word)."""
    pieces: list[str] = []
    for event, node in lxml.etree.iterwalk(element, events=("start", "end")):
        block = isinstance(node.tag, str) and node.tag in _BLOCK_TAGS
        if event == "start":
            pieces.append("\n" if block else "")
            pieces.append(node.text or "")
        else:
            pieces.append("\n" if block else "")
            if node is not element:
                pieces.append(node.tail or "")
    return "".join(pieces)


def visible_text(data: bytes) -> str:
    """What a browser shows of the page: the body's text, less scripts, styles, templates,
    comments and hidden elements, and less soft hyphens (shown only where a line breaks)."""
    root = _page(data)
    body = root.find("body")
    return _text(body if body is not None else root).replace("\u00ad", "")


def navigation_text(data: bytes) -> str:
    """The visible text of the page's navigation (outermost navigation elements only)."""
    root = _page(data)
    found = [element for element in root.iter() if _is_navigation(element)]
    outermost = [e for e in found if not any(_is_navigation(a) for a in e.iterancestors())]
    return "\n".join(_text(element) for element in outermost)


def _is_navigation(element: Any) -> bool:
    if not isinstance(element.tag, str):
        return False
    names = set(element.get("class", "").split()) | {element.get("id", "")}
    return (
        element.tag in NAVIGATION_TAGS
        or element.get("role", "") in NAVIGATION_ROLES
        or bool(names & NAVIGATION_NAMES)
    )


def permalink_anchors(data: bytes) -> Counter[str]:
    """The signs of the anchors that link an element to itself (Sphinx's `a.headerlink`, an
    anchor to `#…` whose text is only a sign): each sign and how many anchors show it."""
    signs: Counter[str] = Counter()
    for anchor in _page(data).iter("a"):
        text = anchor.text_content().strip()
        classes = set(anchor.get("class", "").split())
        same_page = anchor.get("href", "").startswith("#")
        if text and (classes & PERMALINK_CLASSES or (same_page and is_sign(text))):
            signs[text] += 1
    return signs


def is_sign(text: str) -> bool:
    """A text of permalink signs only: "¶", "§", "#", "🔗", "⚓", "◆", an icon font's glyph."""
    return 0 < len(text) <= 3 and all(
        c in PERMALINK_SIGNS or unicodedata.category(c) == "Co" for c in text
    )


# -- ours --------------------------------------------------------------------------------------


def loader_reader() -> Reader:
    """This project's loader (`ingest.loaders.html_files.parse_html`)."""
    from ingest.loaders.html_files import parse_html
    from ragservice.limits.documents import DocumentLimits

    limits = DocumentLimits(max_pages=2000, max_chars=50_000_000)

    def read(path: Path) -> str:
        return parse_html(path.read_bytes(), limits).text

    return read


# -- the measure -------------------------------------------------------------------------------


def _extra(ours: list[str], main: list[str], navigation: list[str]) -> tuple[int, int]:
    """Of the words only the navigation has (not the main text), how many ours has beyond
    the main text's; and how many such words there are."""
    only_navigation = Counter(navigation) - Counter(main)
    beyond_main = Counter(ours) - Counter(main)
    return (beyond_main & only_navigation).total(), only_navigation.total()


def measure(name: str, read: Reader | None = None) -> dict[str, Any]:
    """Every measure of one corpus page, read by the loader or by `read`."""
    path = HTML_FOLDER / name
    data = path.read_bytes()
    started = time.perf_counter()
    ours = (read or loader_reader())(path)
    seconds = time.perf_counter() - started
    mine = words(ours)
    as_loader = words(trafilatura_text(data, as_the_loader=True))
    scores = {
        "trafilatura": word_score(mine, as_loader),
        "trafilatura_defaults": word_score(
            mine, words(trafilatura_text(data, as_the_loader=False))
        ),
        "visible": word_score(mine, words(visible_text(data))),
    }
    kept, navigation = _extra(mine, as_loader, words(navigation_text(data)))
    anchors = permalink_anchors(data)
    return {
        "file": name,
        "our_words": len(mine),
        **{f"recall_{k}": round(s.recall, 4) for k, s in scores.items()},
        **{f"precision_{k}": round(s.precision, 4) for k, s in scores.items()},
        "pilcrows": ours.count("\u00b6"),
        "permalink_anchors": anchors.total(),
        "permalink_signs_kept": sum(min(ours.count(s), n) for s, n in anchors.items()),
        "navigation_words": navigation,
        "navigation_words_kept": kept,
        "seconds": round(seconds, 4),
        "_scores": scores,
    }


def fidelity(
    read: Reader | None = None, names: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One JSON-ready dict per corpus page (`measure`) and the summary over all of them,
    read by this project's loader, or by `read` (another library, for a benchmark)."""
    measured = [measure(name, read) for name in (names or html_names())]
    scores: dict[str, list[WordScore]] = {}
    for row in measured:
        for key, score in row.pop("_scores").items():
            scores.setdefault(key, []).append(score)
    navigation = sum(row["navigation_words"] for row in measured)
    summary = {
        "files": len(measured),
        **{f"recall_{k}": round(total(s).recall, 4) for k, s in scores.items()},
        **{f"precision_{k}": round(total(s).precision, 4) for k, s in scores.items()},
        "lowest_recall_trafilatura": min(
            (row["recall_trafilatura"] for row in measured), default=1.0
        ),
        "pilcrows": sum(row["pilcrows"] for row in measured),
        "permalink_anchors": sum(row["permalink_anchors"] for row in measured),
        "permalink_signs_kept": sum(row["permalink_signs_kept"] for row in measured),
        "navigation_words_kept_share": round(
            sum(row["navigation_words_kept"] for row in measured) / max(1, navigation), 4
        ),
        "seconds": round(sum(row["seconds"] for row in measured), 3),
    }
    return measured, summary


def main() -> None:
    print_rows(*fidelity())


if __name__ == "__main__":
    main()
