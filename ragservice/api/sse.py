"""Server-sent events: the one loop that streams an answer, and the frames it writes.

`/v1/query` and `/v1/chat/completions` stream the same thing (an answer's pieces, then the
whole answer) in two dialects; each is a `Dialect`, and `stream_answer` runs the loop both
share: the stream is closed when the client goes, a failure after the 200 is told in the
stream, and a server that begins to stop ends it with `ServiceStopping`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing
from typing import Any, Protocol

from fastapi import Request

from ragservice.answering.answer import Answer
from ragservice.api.error_handlers import stopped_stream_error, stream_error
from ragservice.api.stopping import next_unless_stopping, stopping_of

AnswerEvents = AsyncGenerator[str | Answer, None]
"""An answer's stream: its pieces of text, then the whole `Answer`."""


def frame(data: dict[str, Any] | str, event: str | None = None) -> str:
    """One event: `data` as JSON (a string as it is, as `[DONE]`), named `event` if given."""
    body = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {body}\n\n"


class Dialect(Protocol):
    """What one endpoint writes at each step of an answer's stream."""

    def opening(self) -> Iterable[str]:
        """The frames before the first piece."""
        ...

    def piece(self, text: str) -> str:
        """The frame of one piece of the answer."""
        ...

    def failed(self, error: dict[str, str]) -> Iterable[str]:
        """The frames that end a stream failing midway (`error`: an error response's body)."""
        ...

    def stopped(self, error: dict[str, str]) -> Iterable[str]:
        """The frames that end a stream the stopping server cuts short."""
        ...

    def finished(self, answer: Answer) -> Iterable[str]:
        """The frames that end a stream with its whole answer."""
        ...


async def stream_answer(
    request: Request, first: str | Answer, events: AnswerEvents, dialect: Dialect
) -> AsyncIterator[str]:
    """The frames of `events`, whose first item (`first`) was awaited before the 200."""
    stopping = stopping_of(request)
    async with aclosing(events):  # a client gone mid-stream stops the upstream call too
        for opening in dialect.opening():
            yield opening
        item: str | Answer = first
        while not isinstance(item, Answer):
            yield dialect.piece(item)
            try:
                following = await next_unless_stopping(events, stopping)
            except Exception as exc:  # mid-stream: the status line is gone, tell it in the stream
                for ending in dialect.failed(stream_error(request, exc)):
                    yield ending
                return
            if following is None:  # the server is stopping
                for ending in dialect.stopped(stopped_stream_error(request)):
                    yield ending
                return
            item = following
        for ending in dialect.finished(item):
            yield ending
