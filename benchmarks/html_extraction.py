"""Main-content extraction from HTML pages: the loader with and without trafilatura's choice.

    python benchmarks/html_extraction.py [--pages tests/fixtures/html]

The pages are written for the purpose (a news article, a blog post, a docs page, a forum thread,
a product page, a page that is mostly a table, a short notice), with menus, cookie banners,
sidebars, related links and footers built from plain `div`s. `expected.json` lists, per page,
the sentences of its main content and of its boilerplate. A sentence counts as kept when its
words appear, in order, in the extracted text (case and punctuation aside). For each page and
overall: the recall of main-content sentences and the share of boilerplate sentences kept, for
the tag rules alone (`before`) and with trafilatura (`after`), and the time per page.
Prints a table and a final JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

# This folder has a file named like the `ingest` package: keep it off the import path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from ingest.loaders.html_files import html_text  # noqa: E402

_WORD = re.compile(r"\w+")
REPEATS = 5


def key(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def share_kept(sentences: list[str], text: str) -> float:
    found = f" {key(text)} "
    return sum(f" {key(s)} " in found for s in sentences) / len(sentences)


def measure(page: bytes, expected: dict[str, list[str]], main_content: bool) -> dict[str, float]:
    started = time.perf_counter()
    for _ in range(REPEATS):
        text, _title = html_text(page, main_content=main_content)
    return {
        "main_recall": round(share_kept(expected["main"], text), 4),
        "boilerplate_kept": round(share_kept(expected["boilerplate"], text), 4),
        "ms": round((time.perf_counter() - started) / REPEATS * 1000, 2),
    }


def overall(rows: dict[str, dict[str, dict[str, float]]], which: str) -> dict[str, float]:
    values = [row[which] for row in rows.values()]
    return {
        name: round(sum(v[name] for v in values) / len(values), 4)
        for name in ("main_recall", "boilerplate_kept", "ms")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=Path, default=Path("tests/fixtures/html"))
    args = parser.parse_args()
    expected: dict[str, Any] = json.loads((args.pages / "expected.json").read_text())
    html_text(b"<p>warm-up</p>")  # imports and first-call set-up stay out of the timings
    rows = {}
    for name, sentences in expected.items():
        page = (args.pages / name).read_bytes()
        rows[name] = {
            "before": measure(page, sentences, main_content=False),
            "after": measure(page, sentences, main_content=True),
        }
    print(
        f"{'page':<22}{'recall before/after':>22}{'boilerplate before/after':>27}{'ms after':>10}"
    )
    for name, row in rows.items():
        before, after = row["before"], row["after"]
        print(
            f"{name:<22}{before['main_recall']:>11.2f} / {after['main_recall']:<8.2f}"
            f"{before['boilerplate_kept']:>14.2f} / {after['boilerplate_kept']:<10.2f}"
            f"{after['ms']:>8.1f}"
        )
    summary = {
        "pages": len(rows),
        "main_sentences": sum(len(s["main"]) for s in expected.values()),
        "boilerplate_sentences": sum(len(s["boilerplate"]) for s in expected.values()),
        "before": overall(rows, "before"),
        "after": overall(rows, "after"),
        "by_page": rows,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
