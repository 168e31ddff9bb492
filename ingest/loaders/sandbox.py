"""Untrusted files are parsed in a child process with CPU-time, memory and wall-clock limits.

A file that makes a parser spin (a pathological PDF, a regex case) or balloon (a DOCX that
unpacks to gigabytes of XML) then becomes a per-file error ("parsing took longer than N s",
"parsing used more than N MiB") instead of holding the GIL of the server, whose ingest workers
are threads beside the request handlers, or its memory.

Each thread that parses gets its own child: a fresh interpreter (never a fork of the server
with its model and thread pools) started once and kept for the next file. The child runs with
an address-space limit (`RLIMIT_AS`) and, before each file, a CPU-time limit of the time it has
used plus the file's allowance (`RLIMIT_CPU`: the kernel stops it with SIGXCPU, whatever C code
it is in). The parent waits for the answer no longer than the wall-clock limit; a child that is
stopped, dies or runs late is replaced. Messages are length-prefixed frames: the file's bytes
one way, JSON the other (the parent never unpickles what a parser's process sends).

A file that needs OCR (a scanned PDF, an image) sends a `more` frame before each page it OCRs:
the parent then waits `ocr_page_seconds` longer, and the child's CPU limit grows as much.

A parsed document comes back as its text, title, format, metadata, its page and row maps and
the files embedded in it (`replies`: JSON, embedded files base64), all checked by the parent.

A file of many documents (Parquet) is streamed: the child answers with a frame pair (JSON and
raw bytes: vectors) per record batch, each batch under the CPU and wall-clock limits of one
file, until an `end` frame; a local file is then read by the child from its path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ingest.loaders.csv_files import parse_csv, parse_tsv
from ingest.loaders.docx_files import parse_docx
from ingest.loaders.email_files import parse_email
from ingest.loaders.epub_files import parse_epub
from ingest.loaders.formats import FORMATS
from ingest.loaders.html_files import parse_html
from ingest.loaders.image_files import parse_image
from ingest.loaders.mbox_files import parse_mbox
from ingest.loaders.ocr import set_page_hook
from ingest.loaders.odt_files import parse_odt
from ingest.loaders.parquet_files import Frame, ParquetColumns, parquet_batches
from ingest.loaders.parsing import Parsed, ParseError
from ingest.loaders.pdf import parse_pdf
from ingest.loaders.pptx_files import parse_pptx
from ingest.loaders.replies import decode_parsed, encode_parsed
from ingest.loaders.rtf_files import parse_rtf
from ingest.loaders.text_files import parse_markdown, parse_text
from ingest.loaders.xlsx_files import parse_xlsx
from ragservice.limits.documents import DocumentLimits

Parser = Callable[[bytes, DocumentLimits], Parsed]

# Each format's parser by its kind (`formats.FORMATS`); JSONL and Parquet are read apart,
# since they yield many documents.
_PARSE: dict[str, Parser] = {
    "text": parse_text,
    "markdown": parse_markdown,
    "html": parse_html,
    "pdf": parse_pdf,
    "docx": parse_docx,
    "pptx": parse_pptx,
    "xlsx": parse_xlsx,
    "csv": parse_csv,
    "tsv": parse_tsv,
    "odt": parse_odt,
    "rtf": parse_rtf,
    "epub": parse_epub,
    "email": parse_email,
    "mbox": parse_mbox,
    "image": parse_image,
}

PARSERS: dict[str, tuple[str, Parser]] = {
    suffix: (f.kind, _PARSE[f.kind]) for f in FORMATS if f.kind in _PARSE for suffix in f.suffixes
}
"""suffix -> (metadata `file_type`, parser), for the formats parsed here."""

_STARTUP_SECONDS = 60.0  # a child imports the parsers before it says it is ready
_LENGTH = struct.Struct("!Q")
_CHILD = "from ingest.loaders.sandbox import serve; serve()"


def parse_isolated(suffix: str, data: bytes, limits: DocumentLimits) -> Parsed:
    """Parse `data` by its suffix in this thread's sandbox; ParseError for bad content and for
    a parse over the limits."""
    sandbox: _Sandbox | None = getattr(_local, "sandbox", None)
    if sandbox is None:
        sandbox = _local.sandbox = _Sandbox()
    return sandbox.parse(suffix, data, limits)


def stream_isolated(
    source: bytes | Path, columns: ParquetColumns, limits: DocumentLimits
) -> Iterator[Frame]:
    """Read a Parquet file (its bytes, or its path) in this thread's sandbox, one frame per
    record batch; ParseError for bad content and for a batch over the limits."""
    sandbox: _Sandbox | None = getattr(_local, "sandbox", None)
    if sandbox is None:
        sandbox = _local.sandbox = _Sandbox()
    return sandbox.stream(source, columns, limits)


def sandbox_pid() -> int | None:
    """The process id of this thread's parser process; None before its first file."""
    sandbox: _Sandbox | None = getattr(_local, "sandbox", None)
    return sandbox.pid if sandbox is not None else None


def took_too_long(limits: DocumentLimits) -> str:
    return f"parsing took longer than {limits.parse_seconds:g} s (RAGSERVICE_PARSE_TIMEOUT_SECONDS)"


def used_too_much(limits: DocumentLimits) -> str:
    return f"parsing used more than {limits.parse_memory_mib} MiB (RAGSERVICE_PARSE_MEMORY_MIB)"


_local = threading.local()


class _Late(Exception):
    """The child did not answer in time."""


class _Sandbox:
    """One child process and the pipes to it; replaced after any failure of the child."""

    def __init__(self) -> None:
        self._child: subprocess.Popen[bytes] | None = None
        self._memory_mib = 0
        # Kills the child when this sandbox is collected (its thread ended); called directly
        # to replace the child, which detaches it.
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def parse(self, suffix: str, data: bytes, limits: DocumentLimits) -> Parsed:
        child = self._start(limits.parse_memory_mib)
        request = {"suffix": suffix, "limits": dataclasses.asdict(limits)}
        with self._failures(limits):
            _send(child, json.dumps(request).encode(), data)
            reply = _answer(child, limits)
        return self._outcome(reply, limits)

    def stream(
        self, source: bytes | Path, columns: ParquetColumns, limits: DocumentLimits
    ) -> Iterator[Frame]:
        child = self._start(limits.parse_memory_mib)
        path = str(source.resolve()) if isinstance(source, Path) else None
        request = {
            "suffix": ".parquet",
            "limits": dataclasses.asdict(limits),
            "columns": columns.as_dict(),
            "path": path,
        }
        finished = False
        try:
            with self._failures(limits):
                data = source if isinstance(source, bytes) else b""
                _send(child, json.dumps(request).encode(), data)
            while True:
                with self._failures(limits):
                    reply = json.loads(_receive(child, time.monotonic() + limits.parse_seconds))
                    if reply["kind"] != "batch":
                        finished = True
                        self._outcome(reply, limits)  # raises, unless the stream ended
                        return
                    payload = _receive(child, time.monotonic() + limits.parse_seconds)
                yield reply["frame"], payload
        finally:
            if not finished:  # stopped part-way: the child is still sending
                self._stop()

    @contextlib.contextmanager
    def _failures(self, limits: DocumentLimits) -> Iterator[None]:
        """The child's death or delay as a ParseError (and the child replaced)."""
        try:
            yield
        except _Late:
            self._stop()
            raise ParseError(took_too_long(limits)) from None
        except (EOFError, OSError):
            code = self._stop()
            if code == -signal.SIGXCPU:
                raise ParseError(took_too_long(limits)) from None
            # Anything else that kills a parser (an allocation C code could not survive, an
            # abort) is a file it could not handle within its memory.
            raise ParseError(used_too_much(limits)) from None

    def _outcome(self, reply: dict[str, Any], limits: DocumentLimits) -> Parsed:
        if reply["kind"] == "ok":
            return decode_parsed(reply, limits)
        if reply["kind"] == "end":
            return Parsed("", None, "text")
        if reply["kind"] == "memory":
            self._stop()  # a MemoryError may leave the child's heap in a poor state
            raise ParseError(used_too_much(limits))
        raise ParseError(str(reply["reason"]))

    def _start(self, memory_mib: int) -> subprocess.Popen[bytes]:
        child = self._child
        if child is not None and child.poll() is None and self._memory_mib == memory_mib:
            return child
        self._stop()
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD, str(memory_mib)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=_child_environment(),
        )
        try:
            if _receive(child, time.monotonic() + _STARTUP_SECONDS) != b"ready":
                raise EOFError
        except (_Late, EOFError, OSError):
            _kill(child)
            raise ParseError("the parser process did not start") from None
        self._child, self._memory_mib = child, memory_mib
        self._finalizer = weakref.finalize(self, _kill, child)
        return child

    def _stop(self) -> int | None:
        """Kill the child, if any; its exit status."""
        finalizer, self._finalizer, self._child = self._finalizer, None, None
        return None if finalizer is None else finalizer()


def _answer(child: subprocess.Popen[bytes], limits: DocumentLimits) -> dict[str, Any]:
    """The child's answer to one file. Before it, a `more` frame per page the child OCRs
    moves the deadline by the OCR allowance: at most once per page the limits allow."""
    deadline = time.monotonic() + limits.parse_seconds
    extensions = 0
    while True:
        reply: dict[str, Any] = json.loads(_receive(child, deadline))
        if reply.get("kind") != "more":
            return reply
        if extensions < limits.max_pages:
            extensions += 1
            deadline += limits.ocr_page_seconds


def _child_environment() -> dict[str, str]:
    """The parent's environment, with the folder that holds `ingest` first on the path."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else os.pathsep.join([root, path])}


def _kill(child: subprocess.Popen[bytes]) -> int | None:
    if child.poll() is None:
        child.kill()
    for pipe in (child.stdin, child.stdout):
        if pipe is not None:
            pipe.close()
    return child.wait(5)


def _send(child: subprocess.Popen[bytes], *frames: bytes) -> None:
    assert child.stdin is not None
    for frame in frames:
        child.stdin.write(_LENGTH.pack(len(frame)))
        child.stdin.write(frame)
    child.stdin.flush()


def _receive(child: subprocess.Popen[bytes], deadline: float) -> bytes:
    assert child.stdout is not None
    fd = child.stdout.fileno()
    size = _LENGTH.unpack(_read(fd, _LENGTH.size, deadline))[0]
    return _read(fd, size, deadline)


def _read(fd: int, size: int, deadline: float) -> bytes:
    """Exactly `size` bytes from `fd`; _Late past the deadline, EOFError if the child died."""
    chunks: list[bytes] = []
    while size:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise _Late
        chunk = os.read(fd, min(size, 2**20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


# -- in the child ----------------------------------------------------------------------------


def serve() -> None:
    """The child's loop: parse what arrives until the parent closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent to handle
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _within(int(sys.argv[1]) * 2**20, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    source, sink = sys.stdin.buffer, _private_stdout()
    _write(sink, b"ready")
    while header := _read_frame(source):
        request = json.loads(header)
        data = _read_frame(source)
        limits = DocumentLimits(**request["limits"])
        _limit_cpu(limits.parse_seconds)
        set_page_hook(_more_time(sink, limits))
        if "columns" in request:
            _stream(sink, request, data, limits)
        else:
            _write(sink, json.dumps(_parse(request["suffix"], data, limits)).encode())


def _private_stdout() -> BinaryIO:
    """The pipe to the parent, on a descriptor of its own; stdout (descriptor 1 and
    `sys.stdout`) then goes to /dev/null. A library that prints (odfpy prints the whole XML of
    a document it fails to parse) would otherwise write into the frames."""
    sink = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the child's whole life
    return sink


def _stream(sink: BinaryIO, request: dict[str, Any], data: bytes, limits: DocumentLimits) -> None:
    """Frame pairs, one per record batch, then an `end` (or `error`, `memory`) frame."""
    columns = ParquetColumns(**request["columns"])
    source = request["path"] or io.BytesIO(data)
    try:
        for header, payload in parquet_batches(source, columns, limits):
            _write(sink, json.dumps({"kind": "batch", "frame": header}).encode())
            _write(sink, payload)
            _limit_cpu(limits.parse_seconds)
    except ParseError as exc:
        _write(sink, json.dumps({"kind": "error", "reason": str(exc)}).encode())
        return
    except MemoryError:
        _write(sink, json.dumps({"kind": "memory"}).encode())
        return
    _write(sink, json.dumps({"kind": "end"}).encode())


def _read_frame(source: BinaryIO) -> bytes:
    head = source.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return b""
    return source.read(_LENGTH.unpack(head)[0])


def _write(sink: BinaryIO, frame: bytes) -> None:
    sink.write(_LENGTH.pack(len(frame)))
    sink.write(frame)
    sink.flush()


def _parse(suffix: str, data: bytes, limits: DocumentLimits) -> dict[str, Any]:
    try:
        parsed = PARSERS[suffix][1](data, limits)
    except ParseError as exc:
        return {"kind": "error", "reason": str(exc)}
    except MemoryError:
        return {"kind": "memory"}
    return {"kind": "ok", **encode_parsed(parsed)}


def _limit_cpu(seconds: float) -> None:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = usage.ru_utime + usage.ru_stime
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (_within(math.ceil(used + seconds), hard), hard))


def _more_time(sink: BinaryIO, limits: DocumentLimits) -> Callable[[], None]:
    """Before a page is OCR'd: the parent's deadline and this process's CPU limit grow by the
    page's allowance (tesseract's own CPU is its subprocess's, bounded by the deadline)."""

    def more() -> None:
        _write(sink, json.dumps({"kind": "more"}).encode())
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        if soft != resource.RLIM_INFINITY:
            extended = _within(soft + math.ceil(limits.ocr_page_seconds), hard)
            resource.setrlimit(resource.RLIMIT_CPU, (extended, hard))

    return more


def _within(value: int, hard: int) -> int:
    return value if hard == resource.RLIM_INFINITY else min(value, hard)
