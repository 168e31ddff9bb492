"""EPUBs, e-mails and mailboxes written by the tests themselves (no binaries in the repository)."""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from datetime import UTC, datetime
from email.message import EmailMessage
from email.utils import format_datetime

from ebooklib import epub

from tests.pdfs import make_pdf

# (file name, TOC title, XHTML body): the second chapter has no heading of its own.
CHAPTERS: tuple[tuple[str, str, str], ...] = (
    ("chap_01.xhtml", "The Harbour", "<h1>The Harbour</h1><p>Boats came in at dawn.</p>"),
    ("chap_02.xhtml", "Interlude", "<p>The gulls were quiet that morning.</p>"),
    (
        "chap_03.xhtml",
        "The Storm",
        "<h1>The Storm</h1><h2>Evening</h2><p>Waves broke over the pier.</p>"
        "<ul><li>sails</li><li>nets</li></ul>",
    ),
)


def make_epub(
    chapters: Sequence[tuple[str, str, str]] = CHAPTERS,
    title: str = "Tales of the Coast",
    author: str = "A. Writer",
    spine: Sequence[int] | None = None,
) -> bytes:
    """An EPUB 3 with a navigation document and an NCX; the chapters in manifest and table of
    contents order, and in the spine in that order too unless `spine` gives their indexes."""
    book = epub.EpubBook()
    book.set_identifier("tales-0001")
    book.set_title(title)
    book.set_language("en")
    book.add_author(author)
    items = []
    for file_name, toc_title, body in chapters:
        item = epub.EpubHtml(title=toc_title, file_name=file_name, lang="en")
        head = f"<head><title>{html.escape(title)}</title></head>"
        item.content = f"<html>{head}<body>{body}</body></html>"
        book.add_item(item)
        items.append(item)
    book.toc = tuple(items)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *(items[i] for i in (range(len(items)) if spine is None else spine))]
    out = io.BytesIO()
    epub.write_epub(out, book)
    return out.getvalue()


SENT = datetime(2024, 3, 5, 9, 30, tzinfo=UTC)
MESSAGE_ID = "<figures-1@example.com>"
ATTACHED_PDF = make_pdf(["Invoice 42: three crates of apples."], "Invoice")
ATTACHED_TEXT = "Packing list: apples, pears.\n"


def make_email(
    subject: str = "Quarterly figures",
    body: str = "Hello team,\n\nthe figures are attached.\n\nBest, Ann",
    *,
    attach: bool = True,
) -> bytes:
    """A text e-mail from Ann to Bob (Carol in copy) with a PDF and a .txt attached."""
    message = _headers(subject)
    message.set_content(body)
    if attach:
        message.add_attachment(
            ATTACHED_PDF, maintype="application", subtype="pdf", filename="invoice.pdf"
        )
        message.add_attachment(ATTACHED_TEXT, filename="packing list.txt")
        message.set_boundary("==boundary-mixed==")  # not random: the same bytes every run
    return message.as_bytes()


def make_html_email() -> bytes:
    """An e-mail whose only body is HTML (a heading, a paragraph and a list)."""
    message = _headers("Newsletter: spring")
    message.set_content(
        "<html><body><h1>Spring news</h1><p>The orchard is in bloom.</p>"
        "<ul><li>apples</li><li>cherries</li></ul></body></html>",
        subtype="html",
    )
    return message.as_bytes()


def make_attachment_only_email() -> bytes:
    """An e-mail with no text body, only an attachment."""
    message = _headers("Scan")
    message.make_mixed()
    message.add_attachment(ATTACHED_PDF, maintype="application", subtype="pdf", filename="scan.pdf")
    message.set_boundary("==boundary-scan==")
    return message.as_bytes()


def make_mbox(subjects: Sequence[str] = ("First", "Second", "Third")) -> bytes:
    """An mbox of one plain message per subject; each body has a line starting "From " (which
    the mbox escapes as ">From ")."""
    out = bytearray()
    for number, subject in enumerate(subjects, start=1):
        body = f"Message {number} about {subject.lower()}.\nFrom the desk of Ann.\n"
        message = make_email(subject, body, attach=False)
        escaped = message.replace(b"\nFrom ", b"\n>From ")
        out += b"From ann@example.com Tue Mar  5 09:30:00 2024\n" + escaped + b"\n"
    return bytes(out)


def _headers(subject: str) -> EmailMessage:
    message = EmailMessage()
    message["From"] = "Ann Example <ann@example.com>"
    message["To"] = "Bob <bob@example.com>, dave@example.com"
    message["Cc"] = "Carol <carol@example.com>"
    message["Subject"] = subject
    message["Date"] = format_datetime(SENT)
    message["Message-ID"] = MESSAGE_ID
    return message
