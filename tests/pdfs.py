"""Real PDFs written by the tests themselves: Helvetica text, one or more lines per page."""

from __future__ import annotations

from collections.abc import Sequence


def make_pdf(pages: Sequence[str | Sequence[str]], title: str | None = None) -> bytes:
    """A minimal valid PDF with an exact xref table; each page is one line of text, or a
    list of lines (pypdf reads them back one per line)."""
    count = len(pages)
    font = 3 + 2 * count
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(count))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {count} >>".encode(),
    ]
    for i, page in enumerate(pages):
        stream = _content([page] if isinstance(page, str) else list(page))
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R "
            f"/Resources << /Font << /F1 {font} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    info = ""
    if title is not None:
        objects.append(f"<< /Title ({title}) >>".encode("latin-1"))
        info = f" /Info {len(objects)} 0 R"
    return assemble(objects, info)


def assemble(objects: Sequence[bytes], info: str = "") -> bytes:
    """A PDF of `objects` (numbered from 1, the first the catalog) with an exact xref table;
    `info`: what the trailer adds (an `/Info` reference)."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R{info} >>\n".encode()
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


def _content(lines: list[str]) -> bytes:
    """The page's content stream: the lines top down, 14 points apart."""
    shown = " T* ".join(f"({_literal(line)}) Tj" for line in lines)
    return f"BT /F1 12 Tf 14 TL 72 720 Td {shown} ET".encode("latin-1")


def _literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


# A five-page report: pages 1 to 3 hold about 40 tokens each (a chunk each with a budget of
# 48 tokens and no overlap); the sentence on pages 4 and 5 runs across the page break and fits
# one chunk. Only page 3 speaks of a zebra census.
REPORT_PAGES = [
    [
        "The annual report opens with a letter from the board to all shareholders.",
        "Revenue grew in every region, led by strong demand for our cloud services.",
        "The board thanks the staff for a year of steady work and careful spending.",
    ],
    [
        "Operating costs fell as the company closed two older data centres.",
        "Energy use per server dropped by a fifth after the move to newer hardware.",
        "Capital spending went mostly to storage and network equipment this year.",
    ],
    [
        "The wildlife fund we sponsor ran its zebra census on the northern plains.",
        "Volunteers counted four thousand animals across eleven separate herds there.",
        "The census results guide where the fund builds water points next season.",
    ],
    ["Outlook: the board expects revenue to keep growing next year"],
    ["as new customers adopt the platform in Asia and South America."],
]
REPORT_CHUNK_TOKENS = 48


def report_pdf() -> bytes:
    return make_pdf(REPORT_PAGES, title="Annual Report")
