"""Real e-mail nobody here wrote (tests/realdocs/mail) read through the real loaders: every
file accepted, every message's header block in its text, the words Python's `email` package
finds in it (tests/realdocs/fidelity/mail.py), and attachments no loader reads skipped and
named by their message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ingest.loaders import load_file
from ragservice.types import LoadedDocument, LoadResult, SkippedFile
from tests.realdocs.fidelity import mail
from tests.realdocs.fidelity.words import words

MIN_RECALL = 0.95
DEEP = "embedded files nested more than"


@pytest.fixture(scope="module")
def measured() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    return mail.fidelity()


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[LoadResult]]:
    return {
        name: list(load_file(mail.MAIL_FOLDER / name, f"mail/{name}")) for name in mail.mail_names()
    }


def test_the_corpus_has_messages_of_many_kinds_and_mailboxes() -> None:
    names = mail.mail_names()
    assert len([n for n in names if n.endswith(".eml")]) >= 10
    assert len([n for n in names if n.endswith(".mbox")]) >= 2


def test_every_file_is_accepted(measured: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    rows, summary = measured
    assert [(row["file"], row["failures"]) for row in rows if not row["accepted"]] == []
    assert summary["accepted"] == summary["files"] == len(mail.mail_names())


def test_the_loaders_find_the_words_of_pythons_email_package(
    measured: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    """Recall of the library's words (headers and every text part) per file, and overall; a
    file whose attached messages nest deeper than the loaders go is short by those, which
    are named as skipped."""
    rows, summary = measured
    short = [(row["file"], row["recall"]) for row in rows if row["recall"] < MIN_RECALL]
    explained = {row["file"] for row in rows if any(DEEP in s["reason"] for s in row["skipped"])}
    assert [(name, recall) for name, recall in short if name not in explained] == []
    assert summary["recall"] >= MIN_RECALL
    assert summary["header_recall"] >= 0.9
    assert summary["precision"] >= 0.9


def test_every_message_starts_with_its_header_block(
    loaded: dict[str, list[LoadResult]],
) -> None:
    messages = [
        doc
        for results in loaded.values()
        for doc in results
        if isinstance(doc, LoadedDocument) and doc.metadata.get("file_type") == "email"
    ]
    assert len(messages) >= 30
    for doc in messages:
        block = doc.text.split("\n\n", 1)[0].splitlines()
        names = [line.split(":", 1)[0] for line in block]
        assert names and set(names) <= set(mail.HEADERS), (doc.external_id, block)
        if doc.title:
            assert f"Subject: {doc.title}" in block, doc.external_id


def test_a_message_is_found_by_its_subject_sender_and_date(
    loaded: dict[str, list[LoadResult]],
) -> None:
    by_id = {
        doc.external_id: doc
        for results in loaded.values()
        for doc in results
        if isinstance(doc, LoadedDocument)
    }
    lunch = by_id["mail/networkx-unix-email.mbox/5.eml"]
    assert lunch.text.startswith(
        "From: Ted <ted@com>\n"
        "To: Bob <bob@gov>, Carol <carol@gov>, Alice <alice@edu>\n"
        "Date: Thu, 28 Jul 2005 15:47:03 -0700\n"
        "Subject: get together for lunch to discuss Networks?\n\n"
        "Hey everyrone!"
    )
    banned = by_id["mail/cpython-msg43-banned-file-report.eml"]
    found = {"banned", "auto", "mail", "python", "bat", "mailer", "daemon", "webmaster", "2004"}
    assert found <= set(words(banned.text.split("\n\n", 1)[0]))


def test_a_gif_attachment_is_skipped_and_named_by_its_message(
    loaded: dict[str, list[LoadResult]],
) -> None:
    parent, skipped = loaded["cpython-msg07-dingus-fish.eml"]
    assert isinstance(parent, LoadedDocument)
    assert parent.metadata["skipped_attachments"] == ["dingusfish.gif"]
    assert "attachments" not in parent.metadata
    source = str(mail.MAIL_FOLDER / "cpython-msg07-dingus-fish.eml" / "dingusfish.gif")
    assert skipped == SkippedFile(source, "unsupported file type .gif")
    gifs = loaded["mimetools-multi-2gifs.eml"][0]
    assert isinstance(gifs, LoadedDocument)
    assert gifs.metadata["skipped_attachments"] == ["3d-compress.gif", "3d-eye.gif"]


def test_every_question_names_a_document_the_loaders_make(
    loaded: dict[str, list[LoadResult]],
) -> None:
    ids = {r.external_id for rs in loaded.values() for r in rs if isinstance(r, LoadedDocument)}
    lines = Path(mail.MAIL_FOLDER / "questions.jsonl").read_text(encoding="utf-8").splitlines()
    questions = [json.loads(line) for line in lines]
    assert len(questions) >= 6
    assert len({q["id"] for q in questions}) == len(questions)
    assert [q["file"] for q in questions if q["file"] not in ids] == []
    assert all(q["question"].strip() and q["id"].startswith("mail-") for q in questions)
