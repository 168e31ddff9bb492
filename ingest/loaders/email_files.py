"""E-mail (.eml): the headers and body as the document's text, the subject as its title, the
sender, recipients, date and message id as metadata, and each attachment as a document of
its own.

The text starts with a header block, `From: …`, `To: …`, `Cc: …`, `Date: …`, `Subject: …` (those
the message has) and a blank line: a message whose answer is its subject or its sender is
found by it, and a chunk cited from it says who wrote it and when. The body follows: every
inline text part in order (a multipart/mixed of several parts, a digest's masthead and
topics), of a multipart/alternative only the alternative a reader is shown (`_shown`: the
plain text, else the HTML). HTML is rendered as the HTML loader renders a page, but whole (no
main-content selection: an e-mail has no site navigation, and trafilatura drops short replies
and signatures); a message of HTML alone is Markdown. A multipart whose boundary never occurs
is read as the plain text it is. Attachments (parts with a file name, or marked as
attachments, and attached messages) become `Parsed.children`, parsed by their own suffix (by
their type's, where their name's suffix is one no loader reads) and linked to the message. A
message with no text body but with attachments is still a document: its header block and the
names of its attachments, so it can be found and its attachments reached.

Header values are kept as written, their encoded words decoded (not re-rendered by the
`email` package's header parsers, which drop what they cannot parse: `<<<Ann` becomes `<>`,
and parse every header several times, ten times slower on a message of many parts). A date
is written in the header block as mail programs write it (`Tue, 06 Jun 2000 03:20:11 +0000`)
and in the metadata as ISO 8601; one that does not parse is kept as written in the block and
left out of the metadata.
"""

from __future__ import annotations

import contextlib
import email
import mimetypes
import posixpath
import re
from collections.abc import Iterator
from datetime import datetime
from email import policy
from email.header import decode_header, make_header
from email.message import Message
from email.utils import format_datetime, parsedate_to_datetime
from typing import Any

from ingest.loaders import replies
from ingest.loaders.cleaning import clean_text, clean_title, collapse, decode_bytes
from ingest.loaders.formats import file_type
from ingest.loaders.html_files import html_text
from ingest.loaders.parsing import Child, Parsed, ParseError, bad_content
from ragservice.limits.documents import DocumentLimits
from ragservice.types import TextFormat

_MAX_HEADER_CHARS = 16 * 2**10
_FOLD = re.compile(r"\r?\n(?=[ \t])")
_SURROGATE = re.compile("[\udc80-\udcff]")
# metadata key -> header
_HEADERS = {"from": "From", "to": "To", "cc": "Cc", "subject": "Subject"}
# Python's own table, not the system's (/etc/mime.types): the same names on every machine.
_MIME_TYPES = mimetypes.MimeTypes()
_HEADING = ("From", "To", "Cc", "Date", "Subject")
"""The headers of the block that starts a message's text, in a mail program's order."""


def parse_email(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid e-mail"):
        message = email.message_from_bytes(data, policy=policy.compat32)
        if not message.keys():
            raise ParseError("not a valid e-mail: it has no headers")
        metadata = _metadata(message)
        leaves = list(_leaves(message))
        bodies = _body_parts(message)
        body, text_format = _body(bodies)
        taken = {id(part) for part in bodies}
        attachments = [part for part in leaves if id(part) not in taken and _is_attachment(part)]
        children = bounded_children(tuple(_children(attachments)), "attachments")
    if not body and children:
        body, text_format = "Attachments: " + ", ".join(child.name for child in children), "text"
    text = "\n\n".join(piece for piece in (heading(message), body) if piece)
    title = clean_title(metadata.get("subject"))
    return Parsed(text, title, text_format, metadata, children=children)


def heading(message: Message) -> str:
    """The message's header block: a `Name: value` line for each of `_HEADING` it has, the
    values as written (decoded); the date as mail programs write it, `Tue, 06 Jun 2000
    03:20:11 +0000` (the metadata's is ISO 8601), or as written where it does not parse."""
    lines = []
    for name in _HEADING:
        value = _shown_date(message) if name == "Date" else _header(message, name)
        if value:
            lines.append(f"{name}: {value}")
    return "\n".join(lines)


def bounded_children(children: tuple[Child, ...], what: str) -> tuple[Child, ...]:
    """`children`, or ParseError when there are more, or more bytes, than the parent accepts
    (`replies.MAX_CHILDREN`, `replies.MAX_CHILDREN_BYTES`): refused here, before they are
    encoded and sent, with the reason a person reads."""
    if len(children) > replies.MAX_CHILDREN:
        raise ParseError(
            f"the file has {len(children)} {what}; the limit is {replies.MAX_CHILDREN}"
        )
    size = sum(len(child.data) for child in children)
    if size > replies.MAX_CHILDREN_BYTES:
        raise ParseError(
            f"the file's {what} come to {size / 2**20:.1f} MiB, more than the "
            f"{replies.MAX_CHILDREN_BYTES // 2**20} MiB allowed"
        )
    return children


def _metadata(message: Message) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, name in _HEADERS.items():
        if value := _header(message, name):
            metadata[key] = value
    if date := _date(message):
        metadata["date"] = date
    if message_id := _header(message, "Message-ID"):
        metadata["message_id"] = message_id
    return metadata


def _header(message: Message, name: str) -> str:
    """The header's first value, unfolded, decoded (`decoded_header`) and cleaned."""
    raw = next((v for k, v in message.raw_items() if k.lower() == name.lower()), "")
    return decoded_header(raw if isinstance(raw, str) else str(raw))


def decoded_header(raw: str) -> str:
    """A raw header value as text: unfolded, raw 8-bit bytes read as UTF-8 (else their guessed
    charset), RFC 2047 encoded words decoded where they can be (kept as they are where not:
    an unknown charset, a broken word), cleaned, whitespace collapsed. The first
    `_MAX_HEADER_CHARS` only: decoding is slow on long runs of broken words, and metadata
    has no use for more."""
    value = _FOLD.sub("", raw[:_MAX_HEADER_CHARS])
    if _SURROGATE.search(value):  # the parser keeps undecodable bytes as surrogate escapes
        value = decode_bytes(value.encode("ascii", "surrogateescape"))
    with contextlib.suppress(Exception):  # an unknown charset, a broken encoded word
        value = str(make_header(decode_header(value)))
    return collapse(clean_text(value))


def _date(message: Message) -> str:
    parsed = _parsed_date(message)
    return parsed.isoformat() if parsed else ""


def _shown_date(message: Message) -> str:
    parsed = _parsed_date(message)
    return format_datetime(parsed) if parsed else _header(message, "Date")


def _parsed_date(message: Message) -> datetime | None:
    raw = _header(message, "Date")
    try:
        return parsedate_to_datetime(raw) if raw else None
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _leaves(message: Message) -> Iterator[Message]:
    """The parts that are not multiparts, in order (walked with a stack: mail can nest
    deeper than Python recurses); an attached message is one part, not walked into."""
    stack = [message]
    while stack:
        part = stack.pop()
        payload = part.get_payload()
        if _is_container(part):
            if isinstance(payload, list):
                stack.extend(p for p in reversed(payload) if isinstance(p, Message))
        else:
            yield part


def _body_parts(message: Message) -> list[Message]:
    """The parts that make the body, in order: every inline text part without a file name
    (else the first named one: a message that is one named text part), of each
    multipart/alternative those of the alternative shown (`_shown`)."""
    candidates: list[Message] = []
    stack = [message]
    while stack:
        part = stack.pop()
        payload = part.get_payload()
        if part.get_content_type() == "multipart/alternative" and isinstance(payload, list):
            shown = _shown([p for p in payload if isinstance(p, Message)])
            stack.extend([shown] if shown is not None else [])
        elif _is_container(part) and isinstance(payload, list):
            stack.extend(p for p in reversed(payload) if isinstance(p, Message))
        elif _is_text(part) and part.get_content_disposition() != "attachment":
            candidates.append(part)
    unnamed = [part for part in candidates if not _filename(part)]
    return unnamed or candidates[:1]


def _shown(alternatives: list[Message]) -> Message | None:
    """The alternative a mail program shows a reader who prefers plain text: the first that
    has plain text, else the first that has HTML (an empty plain part beside the HTML one is
    common), else none."""
    for subtype in ("plain", "html"):
        for alternative in alternatives:
            if any(_has_text(leaf, subtype) for leaf in _leaves(alternative)):
                return alternative
    return None


def _has_text(part: Message, subtype: str) -> bool:
    return (
        part.get_content_type() == f"text/{subtype}"
        and part.get_content_disposition() != "attachment"
        and bool(_part_text(part).strip())
    )


def _is_container(part: Message) -> bool:
    """A multipart walked into (an attached message is one part, not walked into)."""
    return part.is_multipart() and part.get_content_type() != "message/rfc822"


def _is_text(part: Message) -> bool:
    """A text part, or a multipart whose boundary never occurs (its payload is text)."""
    maintype = part.get_content_maintype()
    return maintype == "text" or (maintype == "multipart" and not part.is_multipart())


def _body(parts: list[Message]) -> tuple[str, TextFormat]:
    """The body parts' texts, HTML as Markdown, and their format: Markdown when every part
    with text is HTML (plain text is no Markdown: a `#` starting a line is no heading)."""
    pieces: list[tuple[str, bool]] = []
    for part in parts:
        is_html = part.get_content_type() == "text/html"
        text = _part_text(part)
        if is_html and text:
            rendered, _title = html_text(text.encode("utf-8"), main_content=False)
            text = clean_text(rendered)
        if text.strip():
            pieces.append((text, is_html))
    markdown = bool(pieces) and all(is_html for _, is_html in pieces)
    return "\n\n".join(text for text, _ in pieces), "markdown" if markdown else "text"


def _part_text(part: Message) -> str:
    """A text part's content, decoded by its declared charset, else as a text file is
    (UTF-8, else a guessed charset: mail that names `us-ascii` often holds UTF-8)."""
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return ""
    charset = part.get_content_charset()
    if charset:
        try:
            return clean_text(payload.decode(charset))
        except (LookupError, UnicodeDecodeError):  # an unknown charset, or not the one named
            pass
    return decode_bytes(payload)


def _children(attachments: list[Message]) -> Iterator[Child]:
    """Each attachment as a child, numbered from 1; an attached message is one child (its
    own attachments are its children when it is parsed)."""
    for number, part in enumerate(attachments, start=1):
        if part.get_content_type() == "message/rfc822":
            yield _child(part, _attached_message(part), number)
        else:
            data = part.get_payload(decode=True)
            yield _child(part, data if isinstance(data, bytes) else b"", number)


def _is_attachment(part: Message) -> bool:
    """A part with a file name, one marked as an attachment, or an attached message; not an
    inline part without a name (the HTML alternative of a plain body, a signature's text),
    nor an image the HTML body shows (a logo: OCR would only spend seconds on it)."""
    if _shown_image(part):
        return False
    return (
        _filename(part) != ""
        or part.get_content_disposition() == "attachment"
        or part.get_content_type() == "message/rfc822"
    )


def _shown_image(part: Message) -> bool:
    """An image that is part of the message's layout: inline, with the Content-ID its HTML
    body refers to (`cid:`), as mail programs send logos and signatures."""
    return (
        part.get_content_maintype() == "image"
        and part.get("Content-ID") is not None
        and part.get_content_disposition() != "attachment"
    )


def _attached_message(part: Message) -> bytes:
    payload = part.get_payload()
    inner = payload[0] if isinstance(payload, list) and payload else None
    if not isinstance(inner, Message):
        return b""
    return inner.as_bytes(policy=policy.compat32)


def _child(part: Message, data: bytes, number: int) -> Child:
    """An attachment as a child; `loading` makes names met twice unique, and `replies`
    shortens long ones."""
    content_type = part.get_content_type()
    original = _filename(part)
    name = _child_name(original, content_type, number)
    metadata = {"attachment": original or name, "content_type": content_type}
    return Child(name, data, metadata)


def _filename(part: Message) -> str:
    """The part's file name, decoded and cleaned: its last path segment."""
    try:
        raw = part.get_filename() or ""
    except Exception:  # a broken RFC 2231 parameter
        raw = ""
    segment = decoded_header(str(raw)).replace("\\", "/").rsplit("/", 1)[-1]
    name = collapse(segment)
    return "" if name in (".", "..") else name


def _child_name(original: str, content_type: str, number: int) -> str:
    """A file name the loaders can parse by its suffix: an attached message ends in `.eml`,
    a name without a suffix gets its type's usual one, as does a name whose suffix no loader
    reads when its type's is one (`notes.doc` sent as text/plain is read as text), and a
    nameless part is named by its number."""
    if content_type == "message/rfc822":
        name = original or f"message-{number}.eml"
        return name if name.lower().endswith(".eml") else name + ".eml"
    suffix = _MIME_TYPES.guess_extension(content_type) or ""
    if not original:
        return f"attachment-{number}{suffix or '.bin'}"
    if not posixpath.splitext(original)[1]:  # `report` sent as a PDF is read as `report.pdf`
        return original + suffix
    readable = not file_type(original) and file_type(original + suffix)
    return original + suffix if readable else original
