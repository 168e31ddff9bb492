"""EPUB, e-mail and mbox loaders against files the tests write (tests/corpus_mail.py)."""

from __future__ import annotations

import io
import zipfile
from email.message import EmailMessage

import pytest

from ingest.loaders import DocumentLimits, load_bytes, replies
from ingest.loaders.email_files import parse_email
from ingest.loaders.epub_files import parse_epub
from ingest.loaders.formats import SUPPORTED_SUFFIXES
from ingest.loaders.mbox_files import parse_mbox
from ingest.loaders.parsing import ParseError
from ragservice.types import LoadedDocument, LoadFailure, SkippedFile
from tests.corpus_mail import (
    ATTACHED_PDF,
    ATTACHED_TEXT,
    CHAPTERS,
    MESSAGE_ID,
    make_attachment_only_email,
    make_email,
    make_epub,
    make_html_email,
    make_mbox,
)

LIMITS = DocumentLimits(max_pages=50, max_chars=100_000, parse_seconds=20, parse_memory_mib=1024)


def one(name: str, data: bytes) -> LoadedDocument | LoadFailure:
    [result] = load_bytes(name, data, limits=LIMITS)
    return result


def loaded(name: str, data: bytes) -> LoadedDocument:
    result = one(name, data)
    assert isinstance(result, LoadedDocument), result
    return result


def failed(name: str, data: bytes) -> str:
    result = one(name, data)
    assert isinstance(result, LoadFailure), result
    return result.reason


HEADING = (
    "From: Ann Example <ann@example.com>\n"
    "To: Bob <bob@example.com>, dave@example.com\n"
    "Cc: Carol <carol@example.com>\n"
    "Date: Tue, 05 Mar 2024 09:30:00 +0000\n"
)
"""The header block of the corpus's messages (tests/corpus_mail.py), less their subject."""


def body(text: str) -> str:
    """A message's text after its header block."""
    return text.split("\n\n", 1)[1]


def test_the_new_suffixes_are_supported() -> None:
    assert {".epub", ".eml", ".mbox"} <= set(SUPPORTED_SUFFIXES)


# --------------------------------------------------------------------------- EPUB


def test_epub_chapters_become_headed_markdown_in_spine_order() -> None:
    doc = loaded("books/tales.epub", make_epub())
    assert doc.text == (
        "# The Harbour\n\nBoats came in at dawn.\n\n"
        "# Interlude\n\nThe gulls were quiet that morning.\n\n"  # its heading from the TOC
        "# The Storm\n\n## Evening\n\nWaves broke over the pier.\n\n- sails\n\n- nets"
    )
    assert (doc.title, doc.format) == ("Tales of the Coast", "markdown")
    assert doc.metadata == {
        "chapters": 3,
        "author": "A. Writer",
        "language": "en",
        "source_path": "books/tales.epub",
        "file_type": "epub",
    }


def test_epub_reading_order_is_the_spine_not_the_manifest() -> None:
    doc = loaded("tales.epub", make_epub(spine=[2, 0, 1]))
    headings = [line for line in doc.text.splitlines() if line.startswith("# ")]
    assert headings == ["# The Storm", "# The Harbour", "# Interlude"]


def test_an_epub_chapter_without_text_adds_nothing() -> None:
    chapters = (*CHAPTERS[:1], ("cover.xhtml", "Cover", '<img src="cover.png"/>'))
    doc = loaded("tales.epub", make_epub(chapters))
    assert doc.text == "# The Harbour\n\nBoats came in at dawn."
    assert doc.metadata["chapters"] == 1


def zip_bomb_epub(megabytes: int = 20) -> bytes:
    buffer = io.BytesIO(make_epub())
    with zipfile.ZipFile(buffer, "a", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("EPUB/images/zeros.bin", bytes(megabytes * 2**20))
    return buffer.getvalue()


def test_a_zip_bomb_epub_is_refused_before_it_is_unpacked() -> None:
    data = zip_bomb_epub()
    assert len(data) < 200_000
    reason = failed("bomb.epub", data)
    assert reason.startswith("refused: 'EPUB/images/zeros.bin' is compressed ")
    assert "zip bomb" in reason


def test_bytes_that_are_not_an_epub_fail_with_a_reason() -> None:
    assert failed("x.epub", b"PK not really").startswith("not a valid EPUB file: ")
    no_package = io.BytesIO()
    with zipfile.ZipFile(no_package, "w") as archive:
        archive.writestr("mimetype", "application/epub+zip")
    assert failed("y.epub", no_package.getvalue()).startswith("not a valid EPUB file: ")


def test_an_epub_over_the_character_limit_fails_early() -> None:
    expected = r"^the text is over 60 characters \(RAGSERVICE_MAX_DOCUMENT_CHARS\)$"
    with pytest.raises(ParseError, match=expected):
        parse_epub(make_epub(), DocumentLimits(max_pages=50, max_chars=60))


# --------------------------------------------------------------------------- e-mail


def test_an_email_has_its_headers_and_body_subject_and_metadata() -> None:
    """The header block comes first, so that the subject, the sender and the date are words
    of the text (searched, and read in a cited chunk); the date as written, as a mail
    program shows it (the metadata's is ISO 8601)."""
    parsed = parse_email(make_email(), LIMITS)
    assert parsed.text == (
        f"{HEADING}Subject: Quarterly figures\n\n"
        "Hello team,\n\nthe figures are attached.\n\nBest, Ann"
    )
    assert (parsed.title, parsed.format) == ("Quarterly figures", "text")
    assert parsed.metadata == {
        "from": "Ann Example <ann@example.com>",
        "to": "Bob <bob@example.com>, dave@example.com",
        "cc": "Carol <carol@example.com>",
        "subject": "Quarterly figures",
        "date": "2024-03-05T09:30:00+00:00",
        "message_id": MESSAGE_ID,
    }


def test_an_emails_attachments_are_its_children() -> None:
    children = parse_email(make_email(), LIMITS).children
    assert [(c.name, c.metadata) for c in children] == [
        ("invoice.pdf", {"attachment": "invoice.pdf", "content_type": "application/pdf"}),
        ("packing list.txt", {"attachment": "packing list.txt", "content_type": "text/plain"}),
    ]
    assert children[0].data == ATTACHED_PDF
    assert children[1].data.decode() == ATTACHED_TEXT


def test_an_image_the_html_body_shows_is_no_attachment() -> None:
    """A logo or signature image (inline, with the Content-ID the HTML refers to) is part of
    the message's layout, not a document; an image sent as an attachment still is one."""
    message = EmailMessage()
    message["Subject"] = "With a logo"
    message.set_content("Plain body.")
    message.add_alternative('<p>HTML body.</p><img src="cid:logo@example.com">', subtype="html")
    html_part = message.get_payload()[1]
    html_part.add_related(
        b"\x89PNG logo",
        "image",
        "png",
        cid="<logo@example.com>",
        filename="image001.png",
        disposition="inline",
    )
    message.add_attachment(b"\x89PNG photo", "image", "png", filename="photo.png")
    children = parse_email(message.as_bytes(), LIMITS).children
    assert [child.name for child in children] == ["photo.png"]


def test_an_html_only_email_is_rendered_as_markdown() -> None:
    doc = loaded("news.eml", make_html_email())
    assert doc.text == (
        f"{HEADING}Subject: Newsletter: spring\n\n"
        "# Spring news\n\nThe orchard is in bloom.\n\n- apples\n\n- cherries"
    )
    assert (doc.title, doc.format) == ("Newsletter: spring", "markdown")
    assert doc.metadata["file_type"] == "email"
    assert doc.metadata["from"] == "Ann Example <ann@example.com>"


def test_an_email_with_only_attachments_is_its_headers_and_their_names() -> None:
    parsed = parse_email(make_attachment_only_email(), LIMITS)
    assert parsed.text == f"{HEADING}Subject: Scan\n\nAttachments: scan.pdf"
    assert [child.name for child in parsed.children] == ["scan.pdf"]


def test_attachment_names_are_cleaned_and_parseable() -> None:
    message = EmailMessage()
    message["Subject"] = "Odd names"
    message.set_content("see attached")
    message.add_attachment(b"a", maintype="text", subtype="plain", filename="C:\\tmp\\a  b.txt")
    message.add_attachment(b"\x00\x01", maintype="application", subtype="octet-stream")
    message.add_attachment(ATTACHED_PDF, maintype="application", subtype="pdf", filename="report")
    forwarded = EmailMessage()
    forwarded["Subject"] = "Inner"
    forwarded.set_content("the forwarded text")
    message.add_attachment(forwarded)
    children = parse_email(message.as_bytes(), LIMITS).children
    assert [child.name for child in children] == [
        "a b.txt",
        "attachment-2.bin",
        "report.pdf",
        "message-4.eml",
    ]
    assert children[0].metadata == {"attachment": "a b.txt", "content_type": "text/plain"}
    assert children[1].data == b"\x00\x01"
    assert children[2].metadata["attachment"] == "report"
    inner = parse_email(children[3].data, LIMITS)
    assert (inner.title, inner.text) == ("Inner", "Subject: Inner\n\nthe forwarded text")


def test_broken_headers_are_kept_raw_or_left_out() -> None:
    data = (
        b"From: =?x-unknown?q?Ann?= <ann@example.com>\n"
        b"To: <<<not an address\n"
        b"Subject: =?utf-8?q?caf=C3=A9?= \x00news\n"
        b"Date: the day after tomorrow\n"
        b"Content-Type: text/plain; charset=x-no-such-charset\n"
        b"\n"
        b"caf\xc3\xa9 body\n"
    )
    parsed = parse_email(data, LIMITS)
    assert body(parsed.text) == "caf\u00e9 body"
    assert parsed.title == "caf\u00e9 news"
    assert "date" not in parsed.metadata
    assert "\nDate: the day after tomorrow\nSubject: caf\u00e9 news\n" in parsed.text
    assert "ann@example.com" in parsed.metadata["from"]
    assert "not an address" in parsed.metadata["to"]


def test_raw_utf8_headers_encoded_names_and_misdeclared_bodies_are_read() -> None:
    data = (
        "Subject: Gr\u00fc\u00dfe aus K\u00f6ln\n"
        "From: =?iso-8859-1?q?Ren=E9?= <rene@example.com>\n"
        "MIME-Version: 1.0\n"
        'Content-Type: multipart/mixed; boundary="b"\n'
        "\n--b\n"
        "Content-Type: text/plain; charset=us-ascii\n\n"
        "Tsch\u00fcss\n"
        "--b\n"
        'Content-Type: text/plain; name="=?utf-8?q?r=C3=A9sum=C3=A9.txt?="\n'
        "Content-Disposition: attachment\n\n"
        "cv\n"
        "--b--\n"
    ).encode()
    parsed = parse_email(data, LIMITS)
    assert parsed.title == "Gr\u00fc\u00dfe aus K\u00f6ln"
    assert parsed.metadata["from"] == "Ren\u00e9 <rene@example.com>"
    assert parsed.text == (
        "From: Ren\u00e9 <rene@example.com>\nSubject: Gr\u00fc\u00dfe aus K\u00f6ln\n\nTsch\u00fcss"
    )
    assert [child.name for child in parsed.children] == ["r\u00e9sum\u00e9.txt"]


def test_a_named_inline_text_part_is_the_body_when_there_is_no_other() -> None:
    data = (
        b"Subject: notes\n"
        b"Content-Type: text/plain; charset=utf-8\n"
        b'Content-Disposition: inline; filename="notes.txt"\n\n'
        b"the notes\n"
    )
    parsed = parse_email(data, LIMITS)
    assert (parsed.text, parsed.children) == ("Subject: notes\n\nthe notes", ())


def test_every_inline_text_part_is_body_and_of_alternatives_the_plain_one() -> None:
    """A digest's masthead and topics, a reply beside a forwarded note: every inline text
    part is read, in order; of an alternative, the part a reader is shown (the plain one)."""
    message = EmailMessage()
    message["Subject"] = "Digest"
    message.set_content("Masthead.")
    message.make_mixed()
    alternative = EmailMessage()
    alternative.set_content("Plain words.")
    alternative.add_alternative("<p>HTML words.</p>", subtype="html")
    message.attach(alternative)
    topics = EmailMessage()
    topics.set_content("Topics.")
    message.attach(topics)
    message.add_attachment(b"GIF89a", "image", "gif", filename="logo.gif")
    parsed = parse_email(message.as_bytes(), LIMITS)
    assert parsed.text == "Subject: Digest\n\nMasthead.\n\nPlain words.\n\nTopics."
    assert parsed.format == "text"
    assert [child.name for child in parsed.children] == ["logo.gif"]


def test_an_empty_plain_alternative_gives_way_to_the_html_one() -> None:
    message = EmailMessage()
    message["Subject"] = "News"
    message.set_content("\n")
    message.add_alternative("<h1>Only here</h1><p>The news.</p>", subtype="html")
    parsed = parse_email(message.as_bytes(), LIMITS)
    assert parsed.text == "Subject: News\n\n# Only here\n\nThe news."
    assert parsed.format == "markdown"


def test_a_multipart_whose_boundary_never_occurs_is_read_as_text() -> None:
    data = (
        b"Subject: Here is your dingus fish\n"
        b'Content-Type: multipart/mixed; boundary="BOUNDARY"\n\n'
        b"Hi there,\n\nThis is the dingus fish.\n"
    )
    parsed = parse_email(data, LIMITS)
    assert parsed.text == (
        "Subject: Here is your dingus fish\n\nHi there,\n\nThis is the dingus fish."
    )


def test_a_message_with_headers_and_no_body_is_found_by_its_headers() -> None:
    data = b"From: Ann <ann@example.com>\nSubject: Lunch on Friday?\n\n\n"
    doc = loaded("lunch.eml", data)
    assert doc.text == "From: Ann <ann@example.com>\nSubject: Lunch on Friday?"
    assert doc.title == "Lunch on Friday?"


def test_a_text_attachment_named_for_a_type_no_loader_reads_is_read_by_its_type() -> None:
    message = EmailMessage()
    message.set_content("see attached")
    message.add_attachment("Salutations", filename="notes.doc")  # text/plain
    message.add_attachment(b"sig", "application", "pgp-signature", filename="signature.asc")
    children = parse_email(message.as_bytes(), LIMITS).children
    assert [(c.name, c.metadata["attachment"]) for c in children] == [
        ("notes.doc.txt", "notes.doc"),
        ("signature.asc", "signature.asc"),
    ]


def test_an_attachment_no_loader_reads_is_skipped_and_named_by_its_message() -> None:
    """A GIF (no loader reads it) is no failure: the message and its other attachments load,
    the message names it (`skipped_attachments`), and it is reported as skipped."""
    message = EmailMessage()
    message["Subject"] = "Here is your dingus fish"
    message.set_content("This is the dingus fish.")
    message.add_attachment(b"GIF89a", "image", "gif", filename="dingusfish.gif")
    message.add_attachment(ATTACHED_PDF, "application", "pdf", filename="invoice.pdf")
    parent, skipped, pdf = load_bytes("inbox/fish.eml", message.as_bytes(), limits=LIMITS)
    assert isinstance(parent, LoadedDocument) and isinstance(pdf, LoadedDocument)
    assert skipped == SkippedFile("inbox/fish.eml/dingusfish.gif", "unsupported file type .gif")
    assert parent.metadata["skipped_attachments"] == ["dingusfish.gif"]
    assert parent.metadata["attachments"] == ["inbox/fish.eml/invoice.pdf"]
    assert pdf.text == "Invoice 42: three crates of apples."


def test_bytes_that_are_not_an_email_fail_with_a_reason() -> None:
    assert (
        failed("x.eml", b"just some words, no headers") == "not a valid e-mail: it has no headers"
    )


def test_an_email_with_too_many_attachments_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "MAX_CHILDREN", 2)
    message = EmailMessage()
    message.set_content("many")
    for number in range(3):
        message.add_attachment(b"x", maintype="text", subtype="plain", filename=f"{number}.txt")
    with pytest.raises(ParseError, match=r"^the file has 3 attachments; the limit is 2$"):
        parse_email(message.as_bytes(), LIMITS)


def test_attachments_over_the_byte_limit_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "MAX_CHILDREN_BYTES", 2**20)
    message = b"From ann@example.com\nSubject: big\n\n" + b"x" * 600_000 + b"\n"
    expected = r"^the file's messages come to 1.1 MiB, more than the 1 MiB allowed$"
    with pytest.raises(ParseError, match=expected):
        parse_mbox(message * 2, LIMITS)


def test_an_emails_attachments_become_documents_linked_to_it() -> None:
    results = list(load_bytes("inbox/figures.eml", make_email(), limits=LIMITS))
    assert all(isinstance(r, LoadedDocument) for r in results), results
    parent, pdf, text = results
    assert isinstance(parent, LoadedDocument)
    assert isinstance(pdf, LoadedDocument) and isinstance(text, LoadedDocument)
    assert parent.external_id == "inbox/figures.eml"
    assert parent.metadata["attachments"] == [
        "inbox/figures.eml/invoice.pdf",
        "inbox/figures.eml/packing list.txt",
    ]
    assert (pdf.external_id, pdf.title, pdf.text) == (
        "inbox/figures.eml/invoice.pdf",
        "Invoice",
        "Invoice 42: three crates of apples.",
    )
    assert pdf.metadata["parent"] == text.metadata["parent"] == "inbox/figures.eml"
    assert pdf.metadata["attachment"] == "invoice.pdf"
    assert (pdf.metadata["file_type"], text.metadata["file_type"]) == ("pdf", "text")
    assert text.text == ATTACHED_TEXT.strip()


# --------------------------------------------------------------------------- mbox


def test_an_mbox_has_no_text_and_one_child_per_message() -> None:
    parsed = parse_mbox(make_mbox(), LIMITS)
    assert (parsed.text, parsed.metadata) == ("", {"messages": 3})
    assert [(c.name, c.metadata) for c in parsed.children] == [
        ("1.eml", {"message_index": 1}),
        ("2.eml", {"message_index": 2}),
        ("3.eml", {"message_index": 3}),
    ]
    second = parse_email(parsed.children[1].data, LIMITS)
    assert second.title == "Second"
    assert body(second.text) == "Message 2 about second.\nFrom the desk of Ann."  # unescaped
    assert second.text.startswith(HEADING + "Subject: Second\n\n")


def test_an_mbox_is_bounded_in_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replies, "MAX_CHILDREN", 2)
    with pytest.raises(ParseError, match=r"^the mailbox has 3 messages; the limit is 2$"):
        parse_mbox(make_mbox(), LIMITS)


def test_an_mboxs_messages_are_documents_of_their_own() -> None:
    results = list(load_bytes("mail/archive.mbox", make_mbox(), limits=LIMITS))
    assert all(isinstance(r, LoadedDocument) for r in results), results
    documents = [r for r in results if isinstance(r, LoadedDocument)]
    assert [(d.external_id, d.title) for d in documents] == [
        ("mail/archive.mbox/1.eml", "First"),
        ("mail/archive.mbox/2.eml", "Second"),
        ("mail/archive.mbox/3.eml", "Third"),
    ]
    assert [d.metadata["message_index"] for d in documents] == [1, 2, 3]
    assert {d.metadata["parent"] for d in documents} == {"mail/archive.mbox"}
    assert documents[0].metadata["file_type"] == "email"


def test_bytes_that_are_not_an_mbox_fail_with_a_reason() -> None:
    assert (
        failed("x.mbox", make_email()) == 'not an mbox file: it does not start with a "From " line'
    )
