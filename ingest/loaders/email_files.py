"""E-mail (.eml): the body as the document's text, the subject as its title, the sender,
recipients, date and message id as metadata, and each attachment as a document of its own.

The text/plain body is preferred; a message with only an HTML body is rendered as the HTML
loader renders a page, but whole (no main-content selection: an e-mail has no site navigation,
and trafilatura drops short replies and signatures). Attachments (parts with a file name, or
marked as attachments, and attached messages) become `Parsed.children`, parsed by their own
suffix and linked to the message. A message with no text body but with attachments is still a
document: its text is a short summary of its headers and attachments, so it can be found and
its attachments reached.

Header values are kept as written, their encoded words decoded (not re-rendered by the
`email` package's header parsers, which drop what they cannot parse: `<<<Ann` becomes `<>`,
and parse every header several times, ten times slower on a message of many parts); a date
that does not parse is left out, the others are ISO 8601.
"""

from __future__ import annotations

import contextlib
import email
import mimetypes
import posixpath
import re
from collections.abc import Iterator
from email import policy
from email.header import decode_header, make_header
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any

from ingest.loaders import replies
from ingest.loaders.cleaning import clean_text, clean_title, collapse, decode_bytes
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
_SUMMARY = (("From", "from"), ("To", "to"), ("Cc", "cc"), ("Date", "date"), ("Subject", "subject"))


def parse_email(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid e-mail"):
        message = email.message_from_bytes(data, policy=policy.compat32)
        if not message.keys():
            raise ParseError("not a valid e-mail: it has no headers")
        metadata = _metadata(message)
        leaves = list(_leaves(message))
        plain, html = _body_part(leaves, "plain"), _body_part(leaves, "html")
        body, text_format = _body(plain, html)
        bodies = {id(part) for part in (plain, html) if part is not None}
        attachments = [part for part in leaves if id(part) not in bodies and _is_attachment(part)]
        children = bounded_children(tuple(_children(attachments)), "attachments")
    if not body and children:
        body, text_format = _summary(metadata, children), "text"
    title = clean_title(metadata.get("subject"))
    return Parsed(body, title, text_format, metadata, children=children)


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
    raw = _header(message, "Date")
    try:
        return parsedate_to_datetime(raw).isoformat() if raw else ""
    except (TypeError, ValueError, IndexError, OverflowError):
        return ""


def _leaves(message: Message) -> Iterator[Message]:
    """The parts that are not multiparts, in order (walked with a stack: mail can nest
    deeper than Python recurses); an attached message is one part, not walked into."""
    stack = [message]
    while stack:
        part = stack.pop()
        payload = part.get_payload()
        if part.is_multipart() and part.get_content_type() != "message/rfc822":
            if isinstance(payload, list):
                stack.extend(p for p in reversed(payload) if isinstance(p, Message))
        else:
            yield part


def _body_part(leaves: list[Message], subtype: str) -> Message | None:
    """The first text/<subtype> part not marked as an attachment, one without a file name
    first (an inline text part with a name is a body only when no other is)."""
    candidates = [
        part
        for part in leaves
        if part.get_content_type() == f"text/{subtype}"
        and part.get_content_disposition() != "attachment"
    ]
    unnamed = (part for part in candidates if not _filename(part))
    return next(unnamed, candidates[0] if candidates else None)


def _body(plain: Message | None, html: Message | None) -> tuple[str, TextFormat]:
    """The text/plain body, else the HTML body as Markdown, else nothing; and its format."""
    if plain is not None and (text := _part_text(plain)):
        return text, "text"
    if html is not None and (markup := _part_text(html)):
        rendered, _title = html_text(markup.encode("utf-8"), main_content=False)
        return clean_text(rendered), "markdown"
    return "", "text"


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
    a name without a suffix gets its type's usual one, a nameless part is named by its
    number."""
    if content_type == "message/rfc822":
        name = original or f"message-{number}.eml"
        return name if name.lower().endswith(".eml") else name + ".eml"
    suffix = _MIME_TYPES.guess_extension(content_type) or ""
    if original:  # `report` sent as a PDF is read as `report.pdf`
        return original if posixpath.splitext(original)[1] else original + suffix
    return f"attachment-{number}{suffix or '.bin'}"


def _summary(metadata: dict[str, Any], children: tuple[Child, ...]) -> str:
    """The text of a message with no body: its headers and the names of its attachments."""
    lines = [f"{label}: {metadata[key]}" for label, key in _SUMMARY if metadata.get(key)]
    lines.append("Attachments: " + ", ".join(child.name for child in children))
    return "\n".join(lines)
