"""E-mail fidelity: the loader's words of each real message and mailbox against the text
Python's `email` package gives of it, and whether each file is accepted.

- The reference, per message (each message of a mailbox, each message attached to another):
  its From, To, Cc, Date and Subject as `policy.default` renders them, and the content of
  every text part (`get_content()`), HTML parts as their visible text. Of a
  multipart/alternative only the part `get_body(("plain", "html"))` picks counts: the
  alternatives are one text written twice, and a reader reads one of them.
- Ours: the words of every document the loader makes of the file (the message's own and its
  attachments', each message of a mailbox), or of the text another reader gives (`Reader`).
- Words (`words.word_score`): recall and precision against the reference, and recall of the
  headers' words alone (what a search by sender, date or subject needs).
- Accepted: the file gave no `LoadFailure` (attachments no loader reads are skipped, and
  listed, not failures).

    python -m tests.realdocs.fidelity.mail      # one JSON line per file, then the summary
"""

from __future__ import annotations

import email
import mailbox
import time
from collections.abc import Callable, Iterator
from email import policy
from email.message import EmailMessage, Message
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from tests.realdocs.fidelity import print_rows
from tests.realdocs.fidelity.words import WordScore, total, word_score, words
from tests.realdocs.sources import ROOT, sources

MAIL_FOLDER = ROOT / "mail"
HEADERS = ("From", "To", "Cc", "Date", "Subject")
"""The headers whose words the reference holds, as a reader sees them at a message's top."""

Reader = Callable[[Path], str]
"""A mail reader under test: a corpus file (a message, or a mailbox) to all of its text."""


def mail_names() -> list[str]:
    return [source.name for source in sources(("mail",))]


# -- the reference -----------------------------------------------------------------------------


def messages(path: Path) -> list[EmailMessage]:
    """The file's messages: a mailbox's, in order, or the one message of an `.eml` file."""
    if path.suffix.lower() != ".mbox":
        return [_parsed(path.read_bytes())]
    box = mailbox.mbox(path, create=False)
    try:
        return [_parsed(box.get_bytes(key)) for key in box.iterkeys()]
    finally:
        box.close()


def _parsed(data: bytes) -> EmailMessage:
    message = email.message_from_bytes(data, policy=policy.default)
    assert isinstance(message, EmailMessage)
    return message


def reference(message: Message) -> tuple[str, str]:
    """The message's header text and its whole text (headers included), attached messages
    with their own headers."""
    heads: list[str] = []
    texts: list[str] = []
    for part, is_message in _walk(message):
        if is_message:
            heads.append(header_text(part))
            texts.append(heads[-1])
        if part.get_content_maintype() == "text":
            texts.append(_part_text(part))
    return "\n".join(heads), "\n\n".join(texts)


def header_text(message: Message) -> str:
    lines = []
    for name in HEADERS:
        try:
            value = message.get(name)
        except Exception:  # a header `policy.default` cannot parse counts as absent
            value = None
        if value is not None and str(value).strip():
            lines.append(f"{name}: {value}")
    return "\n".join(lines)


def _walk(message: Message) -> Iterator[tuple[Message, bool]]:
    """(part, whether it is a message with headers of its own): the message, then its parts
    in order, an alternative's chosen part only, attached messages walked into."""
    stack: list[tuple[Message, bool]] = [(message, True)]
    while stack:
        part, is_message = stack.pop()
        yield part, is_message
        content_type = part.get_content_type()
        payload = part.get_payload()
        if content_type == "multipart/alternative" and isinstance(part, EmailMessage):
            chosen = part.get_body(preferencelist=("plain", "html"))
            stack.extend([(chosen, False)] if chosen is not None else [])
        elif part.get_content_maintype() == "message" and isinstance(payload, list):
            stack.extend((inner, True) for inner in reversed(payload) if _is_message(inner))
        elif part.is_multipart() and isinstance(payload, list):
            stack.extend((p, False) for p in reversed(payload) if isinstance(p, Message))


def _is_message(part: object) -> bool:
    return isinstance(part, Message)


def _part_text(part: Message) -> str:
    try:
        assert isinstance(part, EmailMessage)
        content = part.get_content()
        text = content if isinstance(content, str) else ""
    except (LookupError, KeyError, AssertionError):  # an unknown charset
        raw = part.get_payload(decode=True)
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else ""
    return visible_text(text) if part.get_content_subtype() == "html" else text


class _Visible(HTMLParser):
    _HIDDEN = frozenset({"head", "script", "style", "title"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.pieces: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._HIDDEN:
            self._hidden += 1
        self.pieces.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._HIDDEN and self._hidden:
            self._hidden -= 1
        self.pieces.append(" ")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.pieces.append(data)


def visible_text(markup: str) -> str:
    """What a browser shows of an HTML part: its text, head, scripts and styles left out."""
    parser = _Visible()
    parser.feed(markup)
    parser.close()
    return "".join(parser.pieces)


# -- ours --------------------------------------------------------------------------------------


def loader_text(path: Path) -> tuple[str, list[dict[str, str]], list[dict[str, str]]]:
    """This project's loaders (`ingest.loaders.load_file`) on one corpus file: the text of
    every document it makes, its failures and what it skipped."""
    from ingest.loaders import load_file
    from ragservice.types import LoadedDocument, LoadFailure

    texts: list[str] = []
    failures: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    for result in load_file(path, path.name):
        if isinstance(result, LoadedDocument):
            texts.append(result.text)
        elif isinstance(result, LoadFailure):
            failures.append({"source": _relative(result.source), "reason": result.reason})
        else:
            skipped.append({"source": _relative(result.source), "reason": result.reason})
    return "\n\n".join(texts), failures, skipped


def _relative(source: str) -> str:
    return source.removeprefix(str(MAIL_FOLDER) + "/")


# -- the measure -------------------------------------------------------------------------------


def measure(name: str, read: Reader | None = None) -> dict[str, Any]:
    """Every measure of one corpus file, read by the loaders or by `read`."""
    path = MAIL_FOLDER / name
    heads, texts = zip(*(reference(m) for m in messages(path)), strict=True)
    started = time.perf_counter()
    failures: list[dict[str, str]] = []
    skipped: list[dict[str, str]] = []
    if read is None:
        ours, failures, skipped = loader_text(path)
    else:
        try:
            ours = read(path)
        except Exception as exc:  # another reader's refusal is this file's failure
            ours, failures = "", [{"source": name, "reason": f"{type(exc).__name__}: {exc}"}]
    seconds = time.perf_counter() - started
    mine = words(ours)
    score = word_score(mine, words("\n\n".join(texts)))
    heading = word_score(mine, words("\n".join(heads)))
    return {
        "file": name,
        "messages": len(texts),
        "accepted": not failures,
        "failures": failures,
        "skipped": skipped,
        "reference_words": score.reference,
        "our_words": score.ours,
        "recall": round(score.recall, 4),
        "precision": round(score.precision, 4),
        "header_words": heading.reference,
        "header_recall": round(heading.recall, 4),
        "seconds": round(seconds, 4),
        "_scores": (score, heading),
    }


def fidelity(
    read: Reader | None = None, names: list[str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One JSON-ready dict per corpus file (`measure`) and the summary over all of them,
    read by this project's loaders, or by `read` (another library, for a benchmark)."""
    measured = [measure(name, read) for name in (names or mail_names())]
    scores: list[WordScore] = []
    heads: list[WordScore] = []
    for row in measured:
        score, heading = row.pop("_scores")
        scores.append(score)
        heads.append(heading)
    overall, heading = total(scores), total(heads)
    summary = {
        "files": len(measured),
        "accepted": sum(1 for row in measured if row["accepted"]),
        "messages": sum(row["messages"] for row in measured),
        "failures": sum(len(row["failures"]) for row in measured),
        "skipped": sum(len(row["skipped"]) for row in measured),
        "recall": round(overall.recall, 4),
        "precision": round(overall.precision, 4),
        "header_recall": round(heading.recall, 4),
        "lowest_recall": min((row["recall"] for row in measured), default=1.0),
        "seconds": round(sum(row["seconds"] for row in measured), 3),
    }
    return measured, summary


def main() -> None:
    print_rows(*fidelity())


if __name__ == "__main__":
    main()
