"""Mailboxes (.mbox): each message becomes a document of its own, parsed as an `.eml` file.

The mailbox itself has no text: its messages are its `Parsed.children`, named `1.eml`, `2.eml`,
… in mailbox order (metadata `message_index`). Messages are split at lines that start with
`From ` (the envelope line, dropped), as Python's `mailbox` module splits them, and the lines a
writer escaped as `>From ` (mboxo and mboxrd) lose one `>`. The number of messages and their
bytes are bounded as an e-mail's attachments are (`email_files.bounded_children`): by what
the parent accepts of a file's embedded files (`replies`), checked before they are sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from ingest.loaders import replies
from ingest.loaders.email_files import bounded_children
from ingest.loaders.parsing import Child, Parsed, ParseError
from ragservice.limits.documents import DocumentLimits

_FROM_LINE = re.compile(rb"^From ", re.M)
_ESCAPED_FROM = re.compile(rb"^>(>*From )", re.M)


def parse_mbox(data: bytes, _limits: DocumentLimits) -> Parsed:
    start = len(data) - len(data.lstrip(b"\r\n"))
    if not data.startswith(b"From ", start):
        raise ParseError('not an mbox file: it does not start with a "From " line')
    starts = [match.start() for match in _FROM_LINE.finditer(data, start)]
    if len(starts) > replies.MAX_CHILDREN:  # before any message is copied
        raise ParseError(
            f"the mailbox has {len(starts)} messages; the limit is {replies.MAX_CHILDREN}"
        )
    children = bounded_children(tuple(_messages(data, starts)), "messages")
    return Parsed("", None, "text", {"messages": len(children)}, children=children)


def _messages(data: bytes, starts: list[int]) -> Iterator[Child]:
    """The non-empty messages, numbered from 1, without their envelope lines."""
    number = 0
    for begin, end in zip(starts, [*starts[1:], len(data)], strict=True):
        newline = data.find(b"\n", begin, end)
        message = b"" if newline == -1 else data[newline + 1 : end]
        message = _ESCAPED_FROM.sub(rb"\1", message).rstrip(b"\r\n") + b"\n"
        if message.strip():
            number += 1
            yield Child(f"{number}.eml", message, {"message_index": number})
