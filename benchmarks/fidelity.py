"""How well the loader reads real documents (tests/realdocs), beside the readers a user would
pick instead: pdftotext, PyMuPDF and pymupdf4llm, markitdown, unstructured, pypdfium2 and
pdfplumber, on the same files and through the same measures (tests/realdocs/fidelity).

- PDF (`fidelity/pdf.py`): word recall and precision against `pdftotext -layout`'s text and
  against pypdfium2's, per text page (running heads and feet taken out of the references);
  glued runs (25 letters or more, no space, absent from the reference); on the two-column
  pages, reference sentences found and how many of them in order; hand-checked table cells
  found at their row and column (Markdown tables: only readers that write them score); seconds
  a page. `pdftotext -layout` is the reference and pypdfium2 the second one, so each scores
  near 1.0 against its own text: read those two columns crosswise.
- HTML, EPUB, e-mail, office documents and sheets (`fidelity/{html,epub,mail,office}.py`): what
  each module measures (words against the libraries' own full text; for HTML, main-text recall
  against trafilatura's and against the full visible text, boilerplate kept), files rejected,
  seconds a file. A format whose measure module is not there yet is reported as absent.

Peers run in their own virtual environment (`--peers PYTHON`; `make bench-fidelity` builds
`.venv-peers`) through `benchmarks/fidelity_peers.py`, one process per peer and format, so the
project's environment never imports them and interpreter start-up stays out of the timings;
each peer reads its first file once, untimed, and the loader warms up likewise (its first PDF
read once; the other formats' modules run twice, the second run counted). The network is cut
in the runner: nothing downloads. A file a reader fails on (or gets no text from) is rejected,
with its reason, and its words count as missed; a peer that cannot run offline is absent.

    .venv/bin/python benchmarks/fidelity.py                                  # the loader alone
    .venv/bin/python benchmarks/fidelity.py --peers .venv-peers/bin/python   # make bench-fidelity
    .venv/bin/python benchmarks/fidelity.py --peers .venv-peers/bin/python --markdown

Prints a line per file and reader, a table per format (Markdown with `--markdown`, as in
docs/benchmarks.md), then a JSON line per format ({"format": "pdf", "readers": {...}}) and a
last, overall one ({"format": "all", ...}).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# This folder has a file named like the `ingest` package: keep it off the import path.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from tests.realdocs.fidelity import pdf  # noqa: E402
from tests.realdocs.fidelity.words import total  # noqa: E402
from tests.realdocs.sources import corpus_files  # noqa: E402

RUNNER = _HERE / "fidelity_peers.py"
LOADER = "loader"
# The measure module of each format other than PDF, and the corpus folders it reads.
MODULES: dict[str, tuple[str, ...]] = {
    "html": ("html",),
    "epub": ("epub",),
    "mail": ("mail",),
    "office": ("office", "sheets"),
}
TIMEOUT_S = 1800
Summary = dict[str, Any]


# -- peers, through the runner -----------------------------------------------------------------


def list_peers(python: str) -> dict[str, Any]:
    """{"peers": {name: {"version"} or {"absent"}}, "formats": {name: suffixes}}."""
    done = subprocess.run(
        [python, str(RUNNER), "--list"], capture_output=True, text=True, env=_env(), check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{python} cannot run {RUNNER.name}: {done.stderr.strip()[-500:]}")
    listed: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return listed


def _env() -> dict[str, str]:
    """The runner's environment: its own packages only (it cuts its network itself)."""
    return {**os.environ, "PYTHONPATH": ""}


def run_peer(python: str, peer: str, files: Sequence[Path], timeout: float) -> dict[Path, Summary]:
    """Each file's line from the runner; a file without one gets an `error`."""
    command = [python, str(RUNNER), peer, *map(str, files)]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=_env(), timeout=timeout, check=False
        )
        stdout, why = done.stdout, f"the reader's process ended ({done.returncode})"
        why += f": {done.stderr.strip()[-300:]}" if done.stderr.strip() else ""
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        why = f"timed out after {timeout:.0f} s"
    return runner_lines(stdout, files, why)


def runner_lines(stdout: str, files: Sequence[Path], missing: str) -> dict[Path, Summary]:
    found: dict[Path, Summary] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            found[Path(row["file"])] = row
    return {path: found.get(path, {"file": str(path), "error": missing}) for path in files}


# -- PDF ---------------------------------------------------------------------------------------


def pdf_files() -> list[Path]:
    return [pdf.PDF_FOLDER / name for name in pdf.pdf_names()]


def measure_pdf(reader: str, rows: dict[Path, Summary]) -> Summary:
    """Every PDF measure of one reader, from its rows: pages (or an error) and seconds. A
    rejected file is measured as empty pages: its words count as missed, as the other formats'
    modules count them."""
    results: list[pdf.PdfFidelity] = []
    rejected: dict[str, str] = {}
    the_truth = pdf.truth()
    for path, row in rows.items():
        pages = row.get("pages") or [row.get("text", "")]
        why = row.get("error") or ("" if any(page.strip() for page in pages) else "no text")
        if why:
            rejected[path.name] = why
            pages = []
            print(f"{reader:>18}  {path.name:<34} rejected: {why[:80]}")
        read = fixed(padded(pages, path.name), row.get("seconds", 0.0))
        results.append(pdf.measure(path.name, read, the_truth))
        if not why:
            print(f"{reader:>18}  {pdf_line(results[-1])}")
    return pdf_summary(results, rejected)


def fixed(pages: list[str], seconds: float) -> pdf.Reader:
    """A reader whose pages were read already (by a peer's process)."""
    return lambda _data: (pages, seconds)


def padded(pages: list[str], name: str) -> list[str]:
    """A reader's pages, as many as the reference has (a reader may drop empty last pages)."""
    count = len(pdf.reference_pages(name))
    return [*pages, *[""] * (count - len(pages))]


def loader_pdf_rows(files: Iterable[Path]) -> dict[Path, Summary]:
    """The loader's pages of each PDF, in this process, in the shape of the runner's lines."""
    read = pdf.loader_reader()
    rows: dict[Path, Summary] = {}
    files = list(files)
    if files:
        read(files[0].read_bytes())  # warm-up, untimed, as the peers' runner does
    for path in files:
        try:
            pages, seconds = read(path.read_bytes())
        except Exception as exc:  # the loader refusing a file is a result
            rows[path] = {"file": str(path), "error": f"{type(exc).__name__}: {exc}"[:500]}
        else:
            rows[path] = {"file": str(path), "pages": pages, "seconds": seconds}
    return rows


def pdf_line(result: pdf.PdfFidelity) -> str:
    row = result.as_json()
    return (
        f"{result.name:<34} recall {row['recall']:.3f} precision {row['precision']:.3f}"
        f"  (pdfium {row['recall_pdfium']:.3f}/{row['precision_pdfium']:.3f})"
        f"  glued {row['glued_runs']:>3}"
        f"  order {row.get('order_in_place', 0)}/{row.get('order_sentences', 0)}"
        f"  cells {row.get('table_cells_found', 0)}/{row.get('table_cells', 0)}"
        f"  {row['seconds_per_page']:.4f} s/page"
    )


PDF_COUNTS = ("order_sentences", "order_found", "order_in_place", "table_cells")
PDF_COUNTS += ("table_cells_found",)


def pdf_summary(results: Sequence[pdf.PdfFidelity], rejected: dict[str, str]) -> Summary:
    """Words pooled over every text page of every file read; counts summed."""
    words = total(r.against_pdftotext for r in results)
    pdfium = total(r.against_pdfium for r in results)
    pages = sum(r.pages for r in results)
    read = sum(r.pages for r in results if r.name not in rejected)
    rows = [r.as_json() for r in results]
    return {
        "files": len(results),
        "rejected": len(rejected),
        "pages": pages,
        "text_pages": sum(r.text_pages for r in results),
        "recall": round(words.recall, 4),
        "precision": round(words.precision, 4),
        "recall_pdfium": round(pdfium.recall, 4),
        "precision_pdfium": round(pdfium.precision, 4),
        "glued_runs": sum(len(r.glued) for r in results),
        **{key: sum(int(row.get(key, 0)) for row in rows) for key in PDF_COUNTS},
        "seconds_per_page": round(sum(r.seconds for r in results) / max(1, read), 4),
        "rejected_files": rejected,
    }


# -- the other formats, through their measure modules ------------------------------------------


def measure_module(name: str) -> Any:
    """tests/realdocs/fidelity/<name>.py, or None while it is not there."""
    qualified = f"tests.realdocs.fidelity.{name}"
    try:
        return importlib.import_module(qualified)
    except ModuleNotFoundError as exc:
        if exc.name != qualified:
            raise
        return None


def entry_point(module: Any) -> Callable[..., Any] | None:
    """The module's measure of all its files: a public function of its own, callable with no
    argument (the loader) or with one reader (a file to its text)."""
    preferred = ("measure_all", "measure_files", "measure", "fidelity", "run")
    own = [
        value
        for key, value in vars(module).items()
        if inspect.isfunction(value) and value.__module__ == module.__name__ and key[0] != "_"
    ]
    fits = [f for f in own if _optional_reader(f)]
    fits.sort(key=lambda f: preferred.index(f.__name__) if f.__name__ in preferred else 99)
    return fits[0] if fits else None


def _optional_reader(function: Callable[..., Any]) -> bool:
    parameters = list(inspect.signature(function).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return bool(parameters) and all(
        p.default is not inspect.Parameter.empty or p.kind not in positional for p in parameters
    )


def split_result(value: Any) -> tuple[Any, Summary]:
    """A module's result as (per file, overall): a pair, or a dict holding both."""
    if hasattr(value, "as_json"):
        value = value.as_json()
    if isinstance(value, tuple) and len(value) == 2:
        return value[0], dict(value[1])
    if isinstance(value, dict):
        for key in ("overall", "summary", "total", "all"):
            if isinstance(value.get(key), dict):
                files = {k: v for k, v in value.items() if k != key}
                return files.get("files", files), dict(value[key])
        return value, {}
    return value, {}


def cached_reader(rows: dict[Path, Summary], fallback: Callable[[Path], Summary]) -> Any:
    """A `Callable[[Path], str]` over a peer's rows (read ahead by one process); a file read
    ahead with an error raises it, a file not read ahead is read alone."""

    def read(path: Path) -> str:
        row = rows.get(Path(path)) or fallback(Path(path))
        if "error" in row:
            raise PeerFailed(row["error"])
        pages = row.get("pages")
        return "\n\n".join(pages) if pages is not None else str(row.get("text", ""))

    return read


class PeerFailed(RuntimeError):
    """A peer could not read a file (its reason is the message)."""


def measure_other(
    reader: str, format_name: str, module: Any, rows: dict[Path, Summary] | None, alone: Any
) -> Summary:
    """One reader through a format's module: the loader when `rows` is None, else a peer,
    whose files were read ahead by one process (the module times a cached read: the peer's
    own seconds replace its figure)."""
    measure = entry_point(module)
    if measure is None:
        return {"absent": f"{module.__name__} has no measure callable without arguments"}
    if rows is None:
        measure()  # warm-up (imports, first-use set-up), as the peers' runner does
        files, summary = split_result(measure())
    else:
        try:
            files, summary = split_result(measure(cached_reader(rows, alone)))
        except PeerFailed:  # the module lets a reader's failure through: such files read empty
            kept = {path: row for path, row in rows.items() if "error" not in row}
            empty = {path: {"text": ""} for path in rows if path not in kept}
            files, summary = split_result(measure(cached_reader({**kept, **empty}, alone)))
    for row in files if isinstance(files, list) else []:
        print(f"{reader:>18}  {file_line(row, format_name)}")
    return with_rates(summary, files, rows)


def file_line(row: Any, format_name: str) -> str:
    """A module's row for one file: its name, its main figures, and a refusal."""
    if not isinstance(row, dict):
        return str(row)[:120]
    name = Path(str(row.get("file", "?"))).name
    keys = [k for k in COLUMNS.get(format_name, {}) if isinstance(row.get(k), float)]
    keys = keys or [k for k, v in row.items() if "recall" in k and isinstance(v, float)]
    figures = "  ".join(f"{key} {row[key]:.3f}" for key in keys[:4])
    refused = "" if row.get("accepted", True) else f"  refused: {str(row.get('refused'))[:60]}"
    return f"{name:<34} {figures}{refused}"


def with_rates(summary: Summary, files: Any, rows: dict[Path, Summary] | None) -> Summary:
    """The module's summary, with files rejected (and why) and seconds a file, the same way
    for every reader."""
    count = int(summary.get("files") or (len(rows) if rows else 0))
    rejected = _refused(files)
    if rows is None:
        seconds = float(summary.get("seconds") or 0.0)
    else:
        rejected |= {path.name: row["error"] for path, row in rows.items() if "error" in row}
        seconds = sum(row.get("seconds", 0.0) for row in rows.values())
    accepted = summary.get("accepted")
    refused = count - accepted if isinstance(accepted, int) else 0
    return {
        **summary,
        "files": count,
        "rejected": max(refused, len(rejected)),
        "seconds": round(seconds, 3),
        "seconds_per_file": round(seconds / max(1, count), 4),
        "rejected_files": rejected,
        "per_file": files,
    }


def _refused(files: Any) -> dict[str, str]:
    """The files a module's rows say were not accepted, with the reason they give."""
    found: dict[str, str] = {}
    for row in files if isinstance(files, list) else []:
        if isinstance(row, dict) and row.get("accepted") is False:
            reason = row.get("refused") or row.get("failures") or row.get("reference_error")
            name = Path(str(row.get("file", "?"))).name
            found[name] = reason if isinstance(reason, str) else json.dumps(reason)[:300]
    return found


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


# -- printing ----------------------------------------------------------------------------------

PDF_COLUMNS = {
    "recall": "recall",
    "precision": "precision",
    "recall_pdfium": "recall (pdfium)",
    "precision_pdfium": "precision (pdfium)",
    "glued_runs": "glued runs",
    "order": "two-column sentences in order",
    "tables": "table cells",
    "seconds_per_page": "s/page",
    "rejected": "rejected",
}
# The figures each format's table shows, where its module reports them (else every number).
COLUMNS: dict[str, dict[str, str]] = {
    "pdf": PDF_COLUMNS,
    "html": {
        "recall_trafilatura": "main-text recall (trafilatura)",
        "precision_trafilatura": "precision (trafilatura)",
        "recall_visible": "recall (visible text)",
        "pilcrows": "¶ kept",
        "navigation_words_kept_share": "navigation words kept",
        "seconds_per_file": "s/file",
        "rejected": "rejected",
    },
    "epub": {
        "recall": "recall",
        "precision": "precision",
        "lowest_recall": "worst book's recall",
        "seconds_per_file": "s/file",
        "rejected": "rejected",
    },
    "mail": {
        "recall": "recall",
        "precision": "precision",
        "header_recall": "header recall",
        "lowest_recall": "worst file's recall",
        "seconds_per_file": "s/file",
        "rejected": "rejected",
    },
    "office": {
        "recall": "recall",
        "precision": "precision",
        "place_recall": "recall on the right slide/sheet",
        "worst_recall": "worst file's recall",
        "seconds_per_file": "s/file",
        "rejected": "rejected",
    },
}
HEADLINE = {"html": "recall_trafilatura"}
"""The recall the overall line averages, where a format's is not called `recall`."""


def cell(summary: Summary, key: str) -> str:
    if key == "order":
        return _ratio(summary.get("order_in_place", 0), summary.get("order_sentences", 0))
    if key == "tables":
        return _ratio(summary.get("table_cells_found", 0), summary.get("table_cells", 0))
    value = summary.get(key)
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}" if "seconds" in key else f"{value:.3f}"
    return str(value)


def _ratio(found: int, out_of: int) -> str:
    return f"{found}/{out_of}" if out_of else "-"


def columns_for(format_name: str, readers: dict[str, Summary]) -> list[tuple[str, str]]:
    """The format's chosen figures that some reader has; else every number reported."""
    reported = {key for summary in readers.values() for key in summary}
    chosen = COLUMNS.get(format_name, {})
    if format_name == "pdf":
        return list(chosen.items())
    shown = [(key, title) for key, title in chosen.items() if key in reported - {"rejected"}]
    if shown:
        return [*shown, ("rejected", "rejected")] if "rejected" in chosen else shown
    keys: list[str] = []
    for summary in readers.values():
        for key, value in summary.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and key not in keys:
                keys.append(key)
    return [(key, key.replace("_", " ")) for key in keys]


def table_rows(
    format_name: str, readers: dict[str, Summary], names: dict[str, str]
) -> list[list[str]]:
    columns = columns_for(format_name, readers)
    rows = [["reader", *[title for _, title in columns]]]
    for reader, summary in readers.items():
        if "absent" in summary:
            rows.append([names.get(reader, reader), "absent", *[""] * (len(columns) - 1)])
        else:
            rows.append([names.get(reader, reader), *[cell(summary, k) for k, _ in columns]])
    return rows


def markdown_table(format_name: str, readers: dict[str, Summary], names: dict[str, str]) -> str:
    head, *body = table_rows(format_name, readers, names)
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in body)])


def text_table(format_name: str, readers: dict[str, Summary], names: dict[str, str]) -> str:
    rows = table_rows(format_name, readers, names)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(lines)


def overall(formats: dict[str, dict[str, Summary]]) -> dict[str, Summary]:
    """Per reader, across the formats it read: files, files rejected, and the mean of the
    formats' recall (each format's headline recall, `HEADLINE`)."""
    found: dict[str, Summary] = {}
    recalls: dict[str, list[float]] = {}
    for format_name, readers in formats.items():
        for reader, summary in readers.items():
            if "absent" in summary:
                continue
            into = found.setdefault(reader, {"formats": [], "files": 0, "rejected": 0})
            into["formats"].append(format_name)
            into["files"] += int(summary.get("files") or 0)
            into["rejected"] += int(summary.get("rejected") or 0)
            recall = summary.get(HEADLINE.get(format_name, "recall"))
            if isinstance(recall, int | float):
                recalls.setdefault(reader, []).append(float(recall))
    for reader, into in found.items():
        into["recall_mean"] = _mean(recalls.get(reader, []))
    return found


# -- the run -----------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", help="the Python of the peers' environment (.venv-peers)")
    parser.add_argument("--only", default="", help="these peers only (comma-separated)")
    parser.add_argument("--formats", default="", help="these formats only: pdf,html,...")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables too")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds per peer run")
    args = parser.parse_args()
    peers = list_peers(args.peers) if args.peers else {"peers": {}, "formats": {}}
    chosen = {p for p in args.only.split(",") if p}
    wanted = {f for f in args.formats.split(",") if f}
    available = {
        name: facts for name, facts in peers["peers"].items() if not chosen or name in chosen
    }
    names = {
        LOADER: LOADER,
        **{n: f"{n} {f.get('version', '')}".strip() for n, f in available.items()},
    }
    results: dict[str, dict[str, Summary]] = {}
    absent: list[str] = []
    for format_name in ("pdf", *MODULES):
        if wanted and format_name not in wanted:
            continue
        readers = run_format(format_name, args.peers, available, peers["formats"], args.timeout)
        if readers is None:
            absent.append(format_name)
            continue
        results[format_name] = readers
        print(f"\n{format_name}\n{text_table(format_name, readers, names)}\n")
    if args.markdown:
        for format_name, readers in results.items():
            print(f"\n{format_name}\n\n{markdown_table(format_name, readers, names)}\n")
    for format_name, readers in results.items():
        lean = {r: {k: v for k, v in s.items() if k != "per_file"} for r, s in readers.items()}
        print(json.dumps({"format": format_name, "readers": lean}))
    last = {"format": "all", "readers": overall(results), "absent_formats": absent}
    print(json.dumps({**last, "peers": available}))


def run_format(
    format_name: str,
    python: str | None,
    peers: dict[str, dict[str, str]],
    suffixes: dict[str, list[str]],
    timeout: float,
) -> dict[str, Summary] | None:
    """Every reader's summary for one format; None when the format is absent (no files, or no
    measure module)."""
    folders = ("pdf",) if format_name == "pdf" else MODULES[format_name]
    files = corpus_files(folders)
    module = None if format_name == "pdf" else measure_module(format_name)
    if not files or (format_name != "pdf" and module is None):
        print(f"{format_name}: absent ({'no measure module' if files else 'no files'})")
        return None
    if format_name == "pdf":
        files = pdf_files()
    readers: dict[str, Summary] = {}
    readers[LOADER] = (
        measure_pdf(LOADER, loader_pdf_rows(files))
        if module is None
        else measure_other(LOADER, format_name, module, None, None)
    )
    for peer, facts in peers.items():
        accepts = suffixes.get(peer, [])
        given = [f for f in files if _reads(accepts, f)]
        if given and "absent" in facts:
            readers[peer] = {"absent": facts["absent"]}
        elif given and python:
            rows = run_peer(python, peer, given, timeout)
            if module is None:
                readers[peer] = measure_pdf(peer, rows)
            else:
                alone = _alone(python, peer, accepts, timeout)
                readers[peer] = measure_other(peer, format_name, module, rows, alone)
    return readers


def _alone(
    python: str, peer: str, accepts: Sequence[str], timeout: float
) -> Callable[[Path], Summary]:
    """A peer reading one file a module asks for that was not read ahead."""

    def read(path: Path) -> Summary:
        if not _reads(accepts, path):
            return {"file": str(path), "error": f"{peer} does not read {path.suffix} files"}
        return run_peer(python, peer, [path], timeout)[path]

    return read


def _reads(suffixes: Sequence[str], path: Path) -> bool:
    return "*" in suffixes or path.suffix.lower() in suffixes


if __name__ == "__main__":
    main()
