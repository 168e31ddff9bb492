"""A fake OpenAI-compatible inference server on a real local port, for tests.

    with FakeOpenAI() as fake:
        fake.enqueue(status(429, retry_after=1), ok("Paris is the capital [1]."))
        client = InferenceClient(fake.base_url, model="m")
        ...
        assert len(fake.requests) == 2

Each request to `POST /v1/chat/completions` takes the next scripted response from the queue
(streaming or not, as the request asks); an empty queue answers `DEFAULT_ANSWER`. Built on
`http.server` so a script can do what real servers do and ASGI frameworks hide: stall, send
SSE chunk by chunk, or drop the connection.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

DEFAULT_ANSWER = "Answer based on the sources [1]."
DEFAULT_MODEL = "fake-model"


# -- scripted responses ------------------------------------------------------------------------


@dataclass(frozen=True)
class Ok:
    text: str
    chunk_delay: float = 0.01
    model: str | None = None
    finish_reason: str = "stop"
    # A stream sends `hold_after` pieces, then waits for `hold` to be set before the rest.
    hold: threading.Event | None = None
    hold_after: int = 1
    # A stream's events as legal but less common SSE: each event's JSON over several `data:`
    # lines, with `event:`, `id:` and `retry:` fields and `:` comments, sent line by line.
    multiline: bool = False


@dataclass(frozen=True)
class Status:
    code: int
    retry_after: float | str | None = None
    body: Any = None


@dataclass(frozen=True)
class Slow:
    seconds: float
    then: Ok | Status | None = None


@dataclass(frozen=True)
class Drop:
    after_chunks: int = 0


Scripted = Ok | Status | Slow | Drop


def ok(
    text: str = DEFAULT_ANSWER,
    *,
    chunk_delay: float = 0.01,
    model: str | None = None,
    hold: threading.Event | None = None,
    hold_after: int = 1,
    multiline: bool = False,
) -> Ok:
    """Answer `text`; a stream sends it word by word, `chunk_delay` seconds apart, and with
    `hold` waits after the first `hold_after` words until the test sets it. `multiline`
    spreads each event over several `data:` lines, among comments and other fields."""
    return Ok(
        text,
        chunk_delay=chunk_delay,
        model=model,
        hold=hold,
        hold_after=hold_after,
        multiline=multiline,
    )


def status(code: int, retry_after: float | str | None = None, body: Any = None) -> Status:
    """Answer with an HTTP error; `body` (a dict is sent as JSON) defaults to an OpenAI error."""
    return Status(code, retry_after=retry_after, body=body)


def slow(seconds: float, then: Ok | Status | None = None) -> Slow:
    """Send nothing for `seconds`, then answer `then` (default: the default answer)."""
    return Slow(seconds, then)


def drop(after_chunks: int = 0) -> Drop:
    """Close the connection: at once, or (for a stream) after sending `after_chunks` chunks."""
    return Drop(after_chunks)


# -- what was received -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case
    body: Any  # the parsed JSON, or None

    @property
    def streamed(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


@dataclass
class _Shared:
    """State the handler threads share with the test, under one lock."""

    model: str
    api_key: str | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    script: deque[Scripted] = field(default_factory=deque)
    requests: list[ReceivedRequest] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)

    def record(self, request: ReceivedRequest) -> Scripted:
        with self.lock:
            self.requests.append(request)
            return self.script.popleft() if self.script else Ok(DEFAULT_ANSWER)


class FakeOpenAI:
    """The server: `start()`/`stop()` or a `with` block; `base_url` ends in `/v1`.

    With `api_key` set, requests without `Authorization: Bearer <api_key>` get a 401.
    """

    def __init__(self, *, model: str = DEFAULT_MODEL, api_key: str | None = None) -> None:
        self._shared = _Shared(model=model, api_key=api_key)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeOpenAI is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def requests(self) -> list[ReceivedRequest]:
        """The requests received so far, in order (a copy)."""
        with self._shared.lock:
            return list(self._shared.requests)

    @property
    def chat_requests(self) -> list[ReceivedRequest]:
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def enqueue(self, *responses: Scripted) -> None:
        """Script the next responses, in order, after any already queued."""
        with self._shared.lock:
            self._shared.script.extend(responses)

    def reset(self) -> None:
        with self._shared.lock:
            self._shared.script.clear()
            self._shared.requests.clear()

    def start(self) -> FakeOpenAI:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.daemon_threads = True  # a handler stalled by `slow` must not block stop()
        server.shared = self._shared  # type: ignore[attr-defined]
        self._server = server
        # A short poll interval: shutdown() waits up to one interval, once per test.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._shared.stopping.set()  # wakes handlers sleeping in `slow` or between chunks
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


# -- the wire protocol -------------------------------------------------------------------------


def split_chunks(text: str) -> list[str]:
    """Word-sized pieces (each keeps its trailing space) whose concatenation is `text`."""
    return re.findall(r"\s*\S+\s*", text) or [text]


def _completion_body(text: str, model: str, finish_reason: str) -> dict[str, Any]:
    prompt_tokens, completion_tokens = 10, len(split_chunks(text))
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _chunk(model: str, delta: dict[str, str], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def _stream_events(answer: Ok, model: str, include_usage: bool) -> Iterator[dict[str, Any]]:
    """The `chat.completion.chunk` events of a streamed answer, as OpenAI orders them."""
    yield _chunk(model, {"role": "assistant", "content": ""})
    for piece in split_chunks(answer.text):
        yield _chunk(model, {"content": piece})
    yield _chunk(model, {}, answer.finish_reason)
    if include_usage:
        body = _completion_body(answer.text, model, answer.finish_reason)
        yield {**_chunk(model, {}), "choices": [], "usage": body["usage"]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ThreadingHTTPServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    @property
    def shared(self) -> _Shared:
        return self.server.shared  # type: ignore[attr-defined,no-any-return]

    def do_GET(self) -> None:
        self._received(None)
        if self.path.rstrip("/") == "/v1/models":
            data = [{"id": self.shared.model, "object": "model", "owned_by": "fake"}]
            self._send_json(200, {"object": "list", "data": data})
        else:
            self._send_json(404, _error_body("not found", 404))

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = self._received(body)
        if self.path.rstrip("/") != "/v1/chat/completions":
            self._send_json(404, _error_body("not found", 404))
            return
        if not self._authorized(request):
            self._send_json(401, _error_body("Incorrect API key provided", 401))
            return
        try:
            self._play(self.shared.record(request), request)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (a timeout); nothing to do

    def _received(self, body: Any) -> ReceivedRequest:
        headers = {name.lower(): value for name, value in self.headers.items()}
        return ReceivedRequest(self.command, self.path, headers, body)

    def _authorized(self, request: ReceivedRequest) -> bool:
        key = self.shared.api_key
        return key is None or request.headers.get("authorization") == f"Bearer {key}"

    def _play(self, scripted: Scripted, request: ReceivedRequest) -> None:
        if isinstance(scripted, Slow):
            if self.shared.stopping.wait(scripted.seconds):
                return
            scripted = scripted.then or Ok(DEFAULT_ANSWER)
        if isinstance(scripted, Drop):
            self._drop(scripted, request)
        elif isinstance(scripted, Status):
            self._send_status(scripted)
        elif request.streamed:
            self._send_stream(scripted, request)
        else:
            model = scripted.model or self.shared.model
            self._send_json(200, _completion_body(scripted.text, model, scripted.finish_reason))

    def _drop(self, scripted: Drop, request: ReceivedRequest) -> None:
        if scripted.after_chunks and request.streamed:
            self._send_stream(Ok(DEFAULT_ANSWER), request, cut_after=scripted.after_chunks)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def _send_status(self, scripted: Status) -> None:
        body = scripted.body
        if body is None:
            body = _error_body(f"scripted error {scripted.code}", scripted.code)
        headers = {} if scripted.retry_after is None else {"Retry-After": str(scripted.retry_after)}
        if isinstance(body, str):
            self._send(scripted.code, body.encode(), "text/plain; charset=utf-8", headers)
        else:
            self._send_json(scripted.code, body, headers)

    def _send_stream(
        self, answer: Ok, request: ReceivedRequest, *, cut_after: int | None = None
    ) -> None:
        """Send SSE events with HTTP chunked encoding, each flushed on its own.

        With `cut_after`, stop after the role event and that many content events (no `[DONE]`).
        """
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        model = answer.model or self.shared.model
        options = request.body.get("stream_options") or {}
        events = list(_stream_events(answer, model, bool(options.get("include_usage"))))
        if cut_after is not None:
            events = events[: 1 + cut_after]
        for sent, event in enumerate(events, start=1):
            if answer.multiline:
                for line in _multiline_event(event, sent):
                    self._write_chunk(line.encode())
            else:
                self._write_chunk(f"data: {json.dumps(event)}\n\n".encode())
            if self.shared.stopping.wait(answer.chunk_delay):
                return
            if answer.hold is not None and sent == 1 + answer.hold_after:  # the role event first
                while not answer.hold.wait(0.05):
                    if self.shared.stopping.is_set():
                        return
        if cut_after is not None:
            return  # the caller drops the connection mid-stream
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")  # the last chunk of the chunked encoding

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _send_json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
        self._send(code, json.dumps(body).encode(), "application/json", headers or {})

    def _send(self, code: int, data: bytes, content_type: str, headers: dict[str, str]) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)
        self.close_connection = True


def _multiline_event(event: dict[str, Any], number: int) -> list[str]:
    """One event as separate lines: a comment, `event:`/`id:`/`retry:` fields, its JSON
    indented over several `data:` lines (with and without the space after the colon), and the
    blank line that ends it; then a lone `id:` event, which carries no data."""
    data = json.dumps(event, indent=1).split("\n")
    lines = [": keep-alive\n", "event: message\n", f"id: {number}\n", "retry: 3000\n"]
    lines += [f"data:{line}\n" if i % 2 else f"data: {line}\n" for i, line in enumerate(data)]
    return [*lines, "\n", f"id: {number}.5\n", "\n"]


def _error_body(message: str, code: int) -> dict[str, Any]:
    kind = (
        "rate_limit_error"
        if code == 429
        else "invalid_request_error"
        if code < 500
        else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}
