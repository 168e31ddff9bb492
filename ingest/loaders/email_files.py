"""E-mail (.eml): the body as the document's text, the subject as its title, the sender,
recipients, date and message id as metadata, and each attachment as a document of its own.

The text/plain body is preferred; a message with only an HTML body is rendered as the HTML
loader renders a page, but whole (no main-content selection: an e-mail has no site navigation,
and trafilatura drops short replies and signatures). Attachments (parts with a file name, or
marked as attachments, and attached messages) become `Parsed.children`, parsed by their own
suffix and linked to the message. A message with no text body but with attachments is still a
document: its text is a short summary of its headers and attachments, so it can be found and
its attachments reached.

Header values that do not parse (a broken address list, an unknown encoded-word charset) are
kept as their raw text; a date that does not parse is left out.
"""

from __future__ import annotations

import email
import mimetypes
from collections.abc import Iterator
from email import policy
from email.errors import InvalidHeaderDefect
from email.header import decode_header, make_header
from email.message import EmailMessage, Message
from email.utils import parsedate_to_datetime
from typing import Any

from ingest.loaders import replies
from ingest.loaders.cleaning import clean_text, clean_title, collapse, decode_bytes
from ingest.loaders.html_files import html_text
from ingest.loaders.parsing import Child, Parsed, ParseError, bad_content
from ragservice.limits.documents import DocumentLimits
from ragservice.types import TextFormat

# metadata key -> header
_HEADERS = {"from": "From", "to": "To", "cc": "Cc", "subject": "Subject"}
_SUMMARY = (("From", "from"), ("To", "to"), ("Cc", "cc"), ("Date", "date"), ("Subject", "subject"))


def parse_email(data: bytes, _limits: DocumentLimits) -> Parsed:
    with bad_content("not a valid e-mail"):
        message = email.message_from_bytes(data, policy=policy.default)
        if not isinstance(message, EmailMessage) or not message.keys():
            raise ParseError("not a valid e-mail: it has no headers")
        metadata = _metadata(message)
        body, text_format = _body(message)
        children = bounded_children(tuple(_attachments(message)), "attachments")
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


def _metadata(message: EmailMessage) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, name in _HEADERS.items():
        if value := _header(message, name):
            metadata[key] = value
    if date := _date(message):
        metadata["date"] = date
    if message_id := _header(message, "Message-ID"):
        metadata["message_id"] = message_id
    return metadata


def _header(message: EmailMessage, name: str) -> str:
    """The header's decoded value, cleaned and unfolded; its raw text (encoded words decoded
    where they can be) when it does not parse, since the parsed value of a broken address
    list keeps only what parsed (`<<<Ann` becomes `<>`)."""
    try:
        header = message.get(name)
        value = str(header or "")
        invalid = any(isinstance(d, InvalidHeaderDefect) for d in getattr(header, "defects", ()))
    except Exception:  # the parsers of address lists and encoded words raise many kinds
        value, invalid = "", True
    if invalid:
        value = _raw_header(message, name)
    return collapse(clean_text(value))


def _raw_header(message: EmailMessage, name: str) -> str:
    raw = next((str(v) for k, v in message.raw_items() if k.lower() == name.lower()), "")
    try:
        return str(make_header(decode_header(raw)))
    except Exception:  # an unknown charset, a broken encoded word
        return raw


def _date(message: EmailMessage) -> str:
    raw = _header(message, "Date")
    try:
        return parsedate_to_datetime(raw).isoformat() if raw else ""
    except (TypeError, ValueError, IndexError, OverflowError):
        return ""


def _body(message: EmailMessage) -> tuple[str, TextFormat]:
    """The text/plain body, else the HTML body as Markdown, else nothing; and its format."""
    plain = message.get_body(preferencelist=("plain",))
    if plain is not None and (text := _part_text(plain)):
        return text, "text"
    html = message.get_body(preferencelist=("html",))
    if html is not None and (markup := _part_text(html)):
        rendered, _title = html_text(markup.encode("utf-8"), main_content=False)
        return clean_text(rendered), "markdown"
    return "", "text"


def _part_text(part: Message) -> str:
    """A text part's content, decoded by its declared charset, else as a text file is."""
    try:
        content = part.get_content() if isinstance(part, EmailMessage) else None
    except (LookupError, ValueError, AttributeError):  # an unknown or broken charset
        content = None
    if isinstance(content, str):
        return clean_text(content)
    payload = part.get_payload(decode=True)
    return decode_bytes(payload) if isinstance(payload, bytes) else ""


def _attachments(message: EmailMessage) -> Iterator[Child]:
    """Every attachment, depth first; an attached message is one child (its own attachments
    are its children when it is parsed)."""
    body_parts = {id(part) for part in _body_parts(message)}
    stack: list[Message] = [message]
    number = 0
    while stack:
        part = stack.pop()
        if id(part) in body_parts:
            continue
        if part.get_content_type() == "message/rfc822" and part is not message:
            number += 1
            yield _child(part, _attached_message(part), number)
        elif part.is_multipart():
            payload = part.get_payload()
            if isinstance(payload, list):
                stack.extend(p for p in reversed(payload) if isinstance(p, Message))
        elif part is not message and _is_attachment(part):
            number += 1
            data = part.get_payload(decode=True)
            yield _child(part, data if isinstance(data, bytes) else b"", number)


def _body_parts(message: EmailMessage) -> Iterator[Message]:
    for preference in ("plain", "html"):
        part = message.get_body(preferencelist=(preference,))
        if part is not None and part is not message:
            yield part


def _is_attachment(part: Message) -> bool:
    """A part with a file name, or one marked as an attachment; not an inline text body
    (the HTML alternative of a plain body, a signature's text)."""
    return _filename(part) != "" or part.get_content_disposition() == "attachment"


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
    """The part's file name, cleaned: its last path segment, whitespace collapsed."""
    try:
        raw = part.get_filename() or ""
    except Exception:  # a broken RFC 2231 parameter
        raw = ""
    segment = clean_text(str(raw)).replace("\\", "/").rsplit("/", 1)[-1]
    name = collapse(segment)
    return "" if name in (".", "..") else name


def _child_name(original: str, content_type: str, number: int) -> str:
    """A file name the loaders can parse by its suffix: an attached message ends in `.eml`,
    a nameless part is named by its number and its type's usual suffix."""
    if content_type == "message/rfc822":
        name = original or f"message-{number}.eml"
        return name if name.lower().endswith(".eml") else name + ".eml"
    if original:
        return original
    suffix = mimetypes.guess_extension(content_type) or ".bin"
    return f"attachment-{number}{suffix}"


def _summary(metadata: dict[str, Any], children: tuple[Child, ...]) -> str:
    """The text of a message with no body: its headers and the names of its attachments."""
    lines = [f"{label}: {metadata[key]}" for label, key in _SUMMARY if metadata.get(key)]
    lines.append("Attachments: " + ", ".join(child.name for child in children))
    return "\n".join(lines)
